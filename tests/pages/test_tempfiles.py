"""Uploads, exports and replays do not pile up on the server (lab/pages/tempfiles.py, lab/pages/runs.py,
lab/pages/episode.py)."""

from __future__ import annotations

import json
import os
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from envsim.scoring import score_answer
from envsim.solver import label
from lab.pages import episode, runs
from lab.pages.tempfiles import EXPORTS, FILES_AGE_S, REPLAYS, SWEEP_S, UploadQuota, private_temp, sweep
from storage.db import make_engine, upgrade
from tests.boards import CROSSING
from tests.recorded import build_run
from tests.servers import free_port


def test_an_upload_is_deleted_once_read_and_its_message_names_no_server_folder(tmp_path):
    engine = make_engine(str(tmp_path / "envlab.db"))
    upgrade(engine)
    hidden = tmp_path / "gradio" / "3f1c9a0b7e" / "run.zip"  # where the server keeps an upload
    hidden.parent.mkdir(parents=True)
    hidden.write_bytes(b"this is not a zip")
    message, run_id = runs.import_file(engine, str(hidden), uploaded=True)
    assert run_id is None and message == ("✗ Not imported: run.zip: not a run archive: it is not a zip file, or "
                                          "it is truncated (File is not a zip file)"), message
    assert str(tmp_path) not in message and not hidden.exists()
    good = tmp_path / "good.zip"
    runs.export_run(engine, build_run(engine), good)
    kept = tmp_path / "kept.zip"
    kept.write_bytes(good.read_bytes())
    message, run_id = runs.import_file(engine, str(kept))  # a file that is not an upload stays
    assert run_id is None and "is already in this database" in message and kept.exists()
    message, run_id = runs.import_file(engine, str(good), uploaded=True)
    assert not good.exists()
    engine.dispose()


def test_old_exports_are_swept_and_the_page_deletes_its_file_cache(tmp_path, monkeypatch):
    from lab.pages import web as app

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    engine = make_engine(str(tmp_path / "envlab.db"))
    upgrade(engine)
    run_id = build_run(engine)
    old, _ = runs.export_file(engine, run_id, False)
    hour_ago = time.time() - FILES_AGE_S - 60
    os.utime(Path(old).parent, (hour_ago, hour_ago))
    new, message = runs.export_file(engine, run_id, False)
    assert message.startswith("✓") and Path(new).exists() and not Path(old).exists()
    assert Path(new).parent.name.startswith(EXPORTS)
    assert sweep(EXPORTS, FILES_AGE_S) == [] and Path(new).exists()  # a fresh export stays for its download
    assert app.build_demo(engine).delete_cache == (SWEEP_S, FILES_AGE_S)  # uploads and the downloads' copies
    engine.dispose()


def test_an_opened_episode_s_replays_are_swept_once_past_their_download(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    board = label(CROSSING)
    view = {"instance": board.model_dump(mode="json"),
            "outcome": score_answer(board, "Agent 0: DOWN DOWN\nAgent 1: RIGHT RIGHT").to_dict()}
    html, gif = Path(episode.replay_file(view)), Path(episode.gif_file(view))
    assert (html.name, gif.name) == (f"replay-{board.id}.html", f"replay-{board.id}.gif")
    assert html.parent.parent == gif.parent.parent == tmp_path and html.parent.name.startswith(REPLAYS)
    hour_ago = time.time() - FILES_AGE_S - 60
    os.utime(html.parent, (hour_ago, hour_ago))
    again = Path(episode.replay_file(view))  # the next episode opened sweeps the one past its download
    assert not html.parent.exists() and gif.exists() and again.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([gif.parent.name, again.parent.name])


def test_gradio_keeps_uploads_in_a_private_folder_under_the_runs_root(tmp_path):
    root = tmp_path / "runs"
    (root / ".gradio").mkdir(parents=True, mode=0o755)
    (root / ".gradio").chmod(0o755)  # an older start's, open to all: made private again
    folder = private_temp(root)
    assert folder == root / ".gradio" and (folder.stat().st_mode & 0o777) == 0o700
    assert os.environ["GRADIO_TEMP_DIR"] == str(folder)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "linked" / ".gradio").parent.mkdir()
    (tmp_path / "linked" / ".gradio").symlink_to(elsewhere)
    with pytest.raises(OSError, match="is not a folder of this user's"):
        private_temp(tmp_path / "linked")


def _uploader(base: str):
    """POST a file of `size` bytes to the page's upload route as the page does; (HTTP status, body, request size).
    Each file's bytes differ from the last one's (Gradio keeps two equal uploads as one file)."""
    sent = []

    def upload(size: int) -> tuple[int, str, int]:
        sent.append(size)
        boundary = "envlabboundary"
        head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"run.zip\"\r\n"
                f"Content-Type: application/zip\r\n\r\n").encode()
        body = head + bytes([96 + len(sent)]) * size + f"\r\n--{boundary}--\r\n".encode()
        request = urllib.request.Request(f"{base}/gradio_api/upload", data=body, headers={
            "Content-Type": f"multipart/form-data; boundary={boundary}", "Origin": base})
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, answer.read().decode(), len(body)
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode(), len(body)
    return upload


def test_uploads_past_the_quota_are_refused_naming_the_bound_and_an_imported_one_frees_its_place(tmp_path,
                                                                                                 monkeypatch):
    """A real page on a free port: uploads land in its private folder; a third kept upload, one past the total of
    kept bytes and one past the per-file bound are refused with HTTP 413 and one line naming the bound (the page
    shows "HTTP 413: <line>"); an upload imported is deleted and its place is free again."""
    from lab.pages import web as app

    monkeypatch.setenv("ENVLAB_UPLOADS_KEPT", "2")
    monkeypatch.setenv("ENVLAB_UPLOADS_TOTAL", "8k")
    monkeypatch.setenv("ENVLAB_ARCHIVE_UPLOAD", "8k")
    engine = make_engine(str(tmp_path / "envlab.db"))
    upgrade(engine)
    folder = private_temp(tmp_path)
    demo = app.build_demo(engine)
    port = free_port()
    app.launch(demo, "127.0.0.1", port, block=False)
    upload = _uploader(f"http://127.0.0.1:{port}")
    try:
        status, body, _ = upload(1000)
        assert status == 200
        first = Path(json.loads(body)[0])
        assert first.is_relative_to(folder) and first.stat().st_size == 1000
        assert upload(1000)[0] == 200
        assert upload(1000)[:2] == (413, "the lab keeps at most 2 uploads at once (ENVLAB_UPLOADS_KEPT) and holds 2: "
                                         "import them, or wait until they are deleted (60 min after upload)")
        message, run_id = runs.import_file(engine, str(first), uploaded=True)  # not a run file: refused, deleted
        assert run_id is None and not first.exists()
        status, body, size = upload(7500)
        assert status == 413 and body == ("the lab keeps at most 8192 bytes of uploads at once "
                                          f"(ENVLAB_UPLOADS_TOTAL) and holds 1000 bytes: this upload of {size} bytes "
                                          "would pass it")
        status, body, size = upload(100_000)
        assert (status, body) == (413, f"an upload is at most 8192 bytes (ENVLAB_ARCHIVE_UPLOAD); this one is {size} "
                                       "bytes")
        assert upload(5000)[0] == 200
        assert sorted(p.stat().st_size for p in folder.rglob("run.zip")) == [1000, 5000]
    finally:
        demo.close()
        engine.dispose()


def test_an_upload_under_way_and_the_disk_s_free_space_count_against_the_quota():
    quota = UploadQuota(file=1000, count=3, total=2500)
    assert quota.refusal([800], 900, coming=0, free=10_000) is None
    assert quota.refusal([800], 900, coming=900, free=10_000) == (
        "the lab keeps at most 2500 bytes of uploads at once (ENVLAB_UPLOADS_TOTAL) and holds 1700 bytes: this "
        "upload of 900 bytes would pass it")
    assert quota.refusal([], None, coming=1600, free=10_000) == (  # no length declared: the per-file bound counts
        "the lab keeps at most 2500 bytes of uploads at once (ENVLAB_UPLOADS_TOTAL) and holds 1600 bytes: this "
        "upload of 1000 bytes would pass it")
    assert quota.refusal([], 900, coming=0, free=500) == (
        "the disk that keeps uploads has 500 bytes free: this upload of 900 bytes would fill it")


def test_serve_points_gradio_at_the_private_folder_before_the_page_is_built(tmp_path, monkeypatch):
    from lab.pages import web as app

    seen = {}
    monkeypatch.setattr(app, "build_demo", lambda engine, **kw: seen.setdefault("temp", os.environ["GRADIO_TEMP_DIR"]))
    monkeypatch.setattr(app, "launch", lambda *args, **kwargs: None)
    assert app.main(["--db", str(tmp_path / "envlab.db"), "--port", str(free_port()), "--no-worker",
                     "--no-example"]) == 0
    assert seen == {"temp": str(tmp_path / ".gradio")}
    assert ((tmp_path / ".gradio").stat().st_mode & 0o777) == 0o700
