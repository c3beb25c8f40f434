"""Uploads, exports and replays do not pile up on the server (lab/pages/tempfiles.py, lab/pages/runs.py,
lab/pages/episode.py)."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from envsim.scoring import score_answer
from envsim.solver import label
from lab.pages import episode, runs
from lab.pages.tempfiles import EXPORTS, FILES_AGE_S, REPLAYS, SWEEP_S, sweep
from storage.db import make_engine, upgrade
from tests.boards import CROSSING
from tests.recorded import build_run


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
