"""Run archives from someone else, tried as a hostile user would (docs/archive.md, "What import trusts").

Every case goes through both doors: the command line (`envlab import`) and the function the page's upload
calls (`lab.pages.runs.import_file`). Each is refused in one line that names what is wrong, stores no row and
writes nothing, inside the lab or outside it. The inflating cases are built here with a small size on disk and
run in a child process whose peak memory (ru_maxrss) is compared with an import of a good file.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import gradio as gr
import pytest
from sqlalchemy import text

from lab.archive import ArchiveError, Limits, export_run, import_run, parse_size, read_manifest
from lab.cli import main
from lab.pages import runs as runs_page
from lab.settings import RunSettings
from storage.db import make_engine, upgrade
from storage.db import session as open_session
from tests.test_archive import build_run, counts, fake_checkpoints

MIB = 1 << 20
REPO = Path(__file__).resolve().parent.parent
OTHER_UUID = "0123456789abcdef0123456789abcdef"


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    """A real run (tests/test_loop.py's recorded stages) exported with two checkpoints."""
    folder = tmp_path_factory.mktemp("source")
    old = os.environ.pop("ENVLAB_RUNS", None)
    try:
        engine = make_engine(str(folder / "envlab.db"))
        upgrade(engine)
        run_id = build_run(engine)
        fake_checkpoints(folder, engine, run_id)
        path = export_run(engine, run_id, folder / "run.zip", checkpoints=True)
        engine.dispose()
    finally:
        if old is not None:
            os.environ["ENVLAB_RUNS"] = old
    return path


@pytest.fixture
def lab(tmp_path, monkeypatch):
    """An empty lab whose runs root is its database's folder, three levels inside tmp_path."""
    monkeypatch.delenv("ENVLAB_RUNS", raising=False)
    for name in [f.name for f in Limits.__dataclass_fields__.values()]:
        monkeypatch.delenv(f"ENVLAB_ARCHIVE_{name.upper()}", raising=False)
    folder = tmp_path / "a" / "b" / "lab"
    folder.mkdir(parents=True)
    engine = make_engine(str(folder / "envlab.db"))
    upgrade(engine)
    yield engine, folder
    engine.dispose()


def uuid_of(file: Path) -> str:
    return read_manifest(file)["run"]["uuid"]


def everything(root: Path) -> set[str]:
    """Every path under `root`, but SQLite's own side files (they come and go with connections)."""
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if not p.name.endswith(("-wal", "-shm"))}


def refused(lab, tmp_path: Path, file: Path, message: str, capsys) -> None:
    """`file` is refused by `envlab import` and by the page's upload, in one line matching `message`; no row is
    stored and nothing appears anywhere under tmp_path (the lab's runs root included)."""
    engine, folder = lab
    before = everything(tmp_path)
    assert main(["import", str(file), "--db", str(folder / "envlab.db")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("envlab import: "), err
    assert re.search(message, err), err
    text_, run_id = runs_page.import_file(engine, str(file))
    assert run_id is None and text_.startswith("✗ Not imported: ") and "\n" not in text_, text_
    assert re.search(message, text_), text_
    assert set(counts(engine).values()) == {0}
    assert everything(tmp_path) == before


def rebuild(src: Path, dst: Path, change) -> Path:
    """Copy a zip, passing each member through `change(name, data) -> (name, data)` (None drops it)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            out = change(info.filename, zin.read(info))
            if out is not None:
                zout.writestr(out[0], out[1])
    return dst


def rows_changed(table: str, row: int, **values):
    """A `rebuild` change that sets columns of one row (1-based) of one table file."""
    def change(name, data):
        if name != f"tables/{table}.jsonl":
            return name, data
        lines = data.decode().splitlines()
        lines[row - 1] = json.dumps({**json.loads(lines[row - 1]), **values})
        return name, ("\n".join(lines) + "\n").encode()
    return change


def manifest_changed(edit):
    def change(name, data):
        if name != "manifest.json":
            return name, data
        manifest = json.loads(data)
        edit(manifest)
        return name, json.dumps(manifest).encode()
    return change


def replaced(old: str, new: str):
    """Every occurrence of `old` (a uuid) in member names and contents becomes `new`: a consistent file."""
    def change(name, data):
        return name.replace(old, new), data.replace(old.encode(), json.dumps(new)[1:-1].encode())
    return change


# ---------------------------------------------------------------- where files go


@pytest.mark.parametrize("uuid", ["../../../../elsewhere/escape", "/srv/elsewhere", "../" + "0" * 29,
                                  "ABCDEF0123456789ABCDEF0123456789"])
def test_a_run_uuid_that_is_not_32_hex_digits_is_refused(good, lab, tmp_path, capsys, uuid):
    file = rebuild(good, tmp_path / "uuid.zip", replaced(uuid_of(good), uuid))
    refused(lab, tmp_path, file, r"run uuid .* is not 32 hex digits", capsys)
    assert not (lab[1] / uuid).resolve().exists() and not Path("/srv/elsewhere").exists()


def test_checkpoints_under_another_runs_folder_are_refused(good, lab, tmp_path, capsys):
    uuid = uuid_of(good)

    def elsewhere(name, data):  # the checkpoints (members, manifest, stage rows) moved to another run's folder
        if name == "tables/runs.jsonl":
            return name, data
        return name.replace(f"{uuid}/stage", f"{OTHER_UUID}/stage"), data.replace(
            f"{uuid}/stage".encode(), f"{OTHER_UUID}/stage".encode())
    file = rebuild(good, tmp_path / "other.zip", elsewhere)
    refused(lab, tmp_path, file, rf"manifest.json: checkpoint '{OTHER_UUID}/stage-1' is not inside the run's own "
                                 rf"folder \({uuid}/...\)", capsys)


def test_a_stage_row_whose_checkpoint_leaves_the_run_folder_is_refused(good, lab, tmp_path, capsys):
    plain = rebuild(good, tmp_path / "plain.zip", lambda n, d: None if n.startswith("checkpoints/") else (n, d))
    plain = rebuild(plain, tmp_path / "plain2.zip", manifest_changed(lambda m: m.update(checkpoints=[])))
    for i, value in enumerate(["../../elsewhere", f"{OTHER_UUID}/stage-1/policy", "/srv/x", uuid_of(good)]):
        file = rebuild(plain, tmp_path / f"stage-{i}.zip", rows_changed("stages", 2, checkpoint=value))
        refused(lab, tmp_path, file, r"tables/stages.jsonl row 2, column checkpoint", capsys)


def test_a_resume_of_a_run_stored_with_a_bad_uuid_writes_nothing(lab, tmp_path, capsys):
    """A run imported by an older version: `envlab run --resume` refuses it instead of training into
    `<that path>/stage-1`."""
    engine, folder = lab
    from lab.loop import create_run
    from tests.test_loop import CONFIG
    with open_session(engine) as s:
        run_id = create_run(s, name="old", config=CONFIG, settings=RunSettings(stages=1), engineer="fixed").id
    with engine.begin() as c:
        c.execute(text("UPDATE runs SET uuid = '../../../elsewhere/escape', status = 'failed' WHERE id = :i"),
                  {"i": run_id})
    before = everything(tmp_path)
    assert main(["run", "--resume", str(run_id), "--db", str(folder / "envlab.db")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"run {run_id} cannot be resumed: run uuid '../../../elsewhere/escape' is " \
                                     "not 32 hex digits" in err, err
    assert everything(tmp_path) == before and not (folder / "../../../elsewhere").resolve().exists()


# ---------------------------------------------------------------- types


@pytest.mark.parametrize("table, row, values, message", [
    ("stages", 1, {"config": "not a config"}, r"tables/stages.jsonl row 1, column config: Input should be an "
                                              r"object \(got \"not a config\"\)"),
    ("stages", 2, {"config": {"data_ratio": {"3": 2.0}}}, r"tables/stages.jsonl row 2, column config: not a "
                                                           r"valid EnvConfig"),
    ("runs", 1, {"settings": [1, 2]}, r"tables/runs.jsonl row 1, column settings: Input should be an object"),
    ("runs", 1, {"settings": {"stages": "two"}}, r"column settings: not a valid RunSettings: stages"),
    ("runs", 1, {"settings": {"stages": 2, "grpo": {"output_dir": "/srv"}}}, r"column settings: .*output_dir"),
    ("runs", 1, {"seed": "zero"}, r"tables/runs.jsonl row 1, column seed: Input should be a valid integer"),
    ("runs", 1, {"status": "hacked"}, r"tables/runs.jsonl row 1, column status: Input should be 'active'"),
    ("runs", 1, {"created_at": "2026-01-01T00:00:00"}, r"column created_at: Input should have timezone info"),
    ("stage_metrics", 1, {"valid": "lots"}, r"tables/stage_metrics.jsonl row 1, column valid: Input should be a "
                                            r"valid integer"),
    ("episodes", 1, {"valid": 1}, r"tables/episodes.jsonl row 1, column valid: Input should be a valid boolean"),
    ("episodes", 1, {"instance": {"size": 99}}, r"tables/episodes.jsonl row 1, column instance: not a valid "
                                                r"Instance"),
    ("decisions", 1, {"action": "shrug"}, r"tables/decisions.jsonl row 1, column action"),
    ("jobs", 1, {"kind": "shell"}, r"tables/jobs.jsonl row 1, column kind"),
])
def test_a_row_of_the_wrong_type_is_refused_naming_its_table_row_and_column(good, lab, tmp_path, capsys, table, row,
                                                                            values, message):
    file = rebuild(good, tmp_path / "typed.zip", rows_changed(table, row, **values))
    refused(lab, tmp_path, file, message, capsys)


def test_a_row_with_a_column_more_or_less_is_refused(good, lab, tmp_path, capsys):
    def extra(name, data):
        if name != "tables/runs.jsonl":
            return name, data
        return name, (json.dumps({**json.loads(data), "admin": True}) + "\n").encode()
    refused(lab, tmp_path, rebuild(good, tmp_path / "extra.zip", extra),
            r"tables/runs.jsonl row 1, column admin: Extra inputs are not permitted", capsys)


# ---------------------------------------------------------------- damaged and inconsistent files


def test_a_damaged_member_is_one_line(good, lab, tmp_path, capsys):
    data = bytearray(good.read_bytes())
    with zipfile.ZipFile(good) as zf:
        info = zf.getinfo("tables/episodes.jsonl")
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    for i in range(start + 40, start + 200):
        data[i] ^= 0x5A
    file = tmp_path / "damaged.zip"
    file.write_bytes(bytes(data))
    refused(lab, tmp_path, file, r"tables/episodes.jsonl is damaged( at row \d+)? \((error|BadZipFile)", capsys)


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.update(checkpoints=[{"stage_index": 1, "path": "x/y", "files": 0}]),
     r"checkpoint 'x/y' is not inside the run's own folder"),
    (lambda m: m["checkpoints"][0].update(files=0), r"checkpoint .*/stage-1 lists 0 files"),
    (lambda m: m["checkpoints"][0].update(stage_index=2), r"checkpoint .*/stage-1 is not the checkpoint of stage 2"),
    (lambda m: m["tables"]["runs"].update(columns=[[1]]), r"tables.runs.columns must be a list of column names"),
    (lambda m: m["tables"]["runs"].update(rows="1"), r"tables.runs needs a row count"),
    (lambda m: m["run"].update(id=True), r"'run' needs the run's id, uuid and name"),
    (lambda m: m.update(checkpoints=m["checkpoints"] * 2), r"a checkpoint path is listed twice"),
])
def test_a_manifest_of_the_wrong_shape_is_one_line(good, lab, tmp_path, capsys, edit, message):
    refused(lab, tmp_path, rebuild(good, tmp_path / "manifest.zip", manifest_changed(edit)), message, capsys)


def test_a_repeated_row_id_is_refused(good, lab, tmp_path, capsys):
    def twice(name, data):
        if name != "tables/stages.jsonl":
            return name, data
        first = data.splitlines(keepends=True)[0]
        return name, first + data
    file = rebuild(good, tmp_path / "twice.zip", twice)
    refused(lab, tmp_path, file, r"tables/stages.jsonl row 2, column id: 1 is the id of an earlier row", capsys)


# ---------------------------------------------------------------- sizes


def bomb(good: Path, dst: Path, member: str, size: int, head: bytes = b"", tail: bytes = b"", fill: bytes = b"a"
         ) -> Path:
    """`good` with `member` replaced by `head`, `size` bytes of `fill`, `tail`: deflated, about size / 1000 on
    disk."""
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
        for info in zin.infolist():
            if info.filename == member:
                continue
            zout.writestr(info.filename, zin.read(info))
        with zout.open(member, "w", force_zip64=True) as f:
            f.write(head)
            chunk = fill * MIB
            for _ in range(size // MIB):
                f.write(chunk)
            f.write(tail)
    assert dst.stat().st_size < size / 100
    return dst


def long_rows(good: Path, dst: Path, n: int, size: int) -> Path:
    """`good` with `n` episode rows whose completions are `size` bytes of "a", each row valid, and a manifest that
    announces a million of them."""
    with zipfile.ZipFile(good) as zin:
        row = json.loads(zin.read("tables/episodes.jsonl").splitlines()[0])
        manifest = json.loads(zin.read("manifest.json"))
    manifest["tables"]["episodes"]["rows"] = 10**6
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
        for info in zin.infolist():
            if info.filename not in ("tables/episodes.jsonl", "manifest.json"):
                zout.writestr(info.filename, zin.read(info))
        zout.writestr("manifest.json", json.dumps(manifest))
        with zout.open("tables/episodes.jsonl", "w", force_zip64=True) as f:
            for i in range(n):
                head, tail = json.dumps({**row, "id": 10**6 + i, "completion": "@@"}).split("@@")
                f.write(head.encode())
                for _ in range(size // MIB):
                    f.write(b"a" * MIB)
                f.write((tail + "\n").encode())
    assert dst.stat().st_size < n * size / 100
    return dst


def a_long_row(good: Path) -> tuple[bytes, bytes]:
    """The first episode row cut open at its completion: (what comes before the text, what comes after)."""
    with zipfile.ZipFile(good) as zf:
        row = json.loads(zf.read("tables/episodes.jsonl").splitlines()[0])
    row["completion"] = "@@"
    head, tail = json.dumps(row).split("@@")
    return head.encode(), (tail + "\n").encode()


BOMB = 256 * MIB
# An import holds a few copies of one row at most (the line read, its text, its values): the bound is 8 rows of
# the line limit (16 MiB), whatever the archive inflates to (docs/archive.md).
BOUND_KIB = 8 * Limits().line // 1024


def peak_import_kib(file: Path, db: Path, env: dict[str, str]) -> tuple[int, str]:
    """(peak resident memory in KiB, the refusal or "imported") of `import_run` in a process of its own.

    Linux keeps a process's ru_maxrss across exec, so a child of this (large) test process starts at this
    process's size: the child forks again, from its own small self, and the grandchild imports and measures."""
    code = ("import os, resource, sys\nfrom lab.archive import ArchiveError, import_run\n"
            "from storage.db import open_database\nif os.fork():\n    sys.exit(os.wait()[1])\n"
            "engine = open_database(sys.argv[2])\n"
            "try:\n    import_run(engine, sys.argv[1])\n    said = 'imported'\n"
            "except ArchiveError as err:\n    said = str(err)\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\nprint(said, flush=True)\nos._exit(0)")
    done = subprocess.run([sys.executable, "-c", code, str(file), str(db)], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)
    assert done.returncode == 0, done.stderr
    peak, said = done.stdout.split("\n", 1)
    return int(peak), said.strip()


@pytest.fixture(scope="module")
def baseline_kib(good, tmp_path_factory) -> int:
    """The peak memory of importing the good file, in a child process like the bombs."""
    peak, said = peak_import_kib(good, tmp_path_factory.mktemp("baseline") / "envlab.db", {})
    assert said == "imported"
    return peak


@pytest.mark.parametrize("member, env, message", [
    # the default limits: a row is at most 16 MiB
    ("tables/episodes.jsonl", {}, r"tables/episodes.jsonl row 1 is longer than 16.0 MiB"),
    # rows of 15 MiB each, every one a good row: the table inflating 1,000 times its stored size is refused
    ("long rows", {}, r"tables/episodes.jsonl inflates to more than 200 times its stored size"),
    ("manifest.json", {"ENVLAB_ARCHIVE_RATIO": "100000"}, r"manifest.json inflates to more than 4.0 MiB"),
    (None, {"ENVLAB_ARCHIVE_RATIO": "100000", "ENVLAB_ARCHIVE_FILE": "64m"},
     r"checkpoints/.*/stage-1/model.safetensors inflates to more than 64.0 MiB"),
    (None, {}, r"checkpoints/.*/stage-1/model.safetensors inflates to more than 200 times"),
])
def test_an_inflating_member_is_refused_within_a_memory_bound(good, baseline_kib, lab, tmp_path, monkeypatch, capsys,
                                                              member, env, message):
    """A member of 256 MiB inflated (a few hundred KiB on disk) is refused while it is read: the import's peak
    memory stays within `BOUND_KIB` of an import of the good file, and nothing is stored or written."""
    engine, folder = lab
    if member == "tables/episodes.jsonl":
        head, tail = a_long_row(good)
        file = bomb(good, tmp_path / "bomb.zip", member, BOMB, head, tail)
    elif member == "long rows":
        file = long_rows(good, tmp_path / "bomb.zip", BOMB // (15 * MIB) + 1, 15 * MIB)
    elif member == "manifest.json":
        file = bomb(good, tmp_path / "bomb.zip", member, BOMB, b'{"format": "envlab-run", "pad": "', b'"}')
    else:
        member = f"checkpoints/{uuid_of(good)}/stage-1/model.safetensors"
        file = bomb(good, tmp_path / "bomb.zip", member, BOMB)
    before = everything(tmp_path)
    peak, said = peak_import_kib(file, folder / "envlab.db", env)
    assert re.search(message, said) and "\n" not in said, said
    with capsys.disabled():  # the figures docs/archive.md quotes (pytest -s)
        print(f"\npeak {peak} KiB, good file {baseline_kib} KiB: {said[-90:]}")
    assert peak - baseline_kib < BOUND_KIB, (peak, baseline_kib)
    assert everything(tmp_path) == before and set(counts(engine).values()) == {0}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    refused(lab, tmp_path, file, message, capsys)  # the command line and the page's upload: the same refusal


def test_a_table_longer_than_its_limit_is_refused_while_it_is_read(good, lab, tmp_path):
    engine, folder = lab
    with pytest.raises(ArchiveError, match=r"tables/episodes.jsonl inflates to more than 16384 bytes"):
        import_run(engine, good, Limits(table=16 * 1024))  # the file's episodes: 23 KiB
    with pytest.raises(ArchiveError, match=r"the archive inflates to more than 102400 bytes \(at checkpoints/"):
        import_run(engine, good, Limits(total=100 * 1024))  # rows 36 KiB, checkpoints 140 KiB
    assert set(counts(engine).values()) == {0} and everything(folder) == {"envlab.db"}
    assert import_run(engine, good) == 1  # the good file, with the real limits


def test_limits_are_read_from_the_environment(monkeypatch):
    assert parse_size("64m", "x") == 64 * MIB and parse_size("2GiB", "x") == 2 << 30 and parse_size("512", "x") == 512
    monkeypatch.setenv("ENVLAB_ARCHIVE_LINE", "1m")
    monkeypatch.setenv("ENVLAB_ARCHIVE_UPLOAD", "10k")
    assert Limits.from_env() == Limits(line=MIB, upload=10 * 1024)
    with pytest.raises(ArchiveError, match="ENVLAB_ARCHIVE_X='lots' is not a size"):
        parse_size("lots", "ENVLAB_ARCHIVE_X")


# ---------------------------------------------------------------- the page


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_page_caps_uploads_and_shows_no_api_schema_under_auth(tmp_path, monkeypatch):
    import app

    monkeypatch.setenv("ENVLAB_ARCHIVE_UPLOAD", "4k")
    engine = make_engine(str(tmp_path / "envlab.db"))
    upgrade(engine)
    demo = app.build_demo(engine)
    port = free_port()
    app.launch(demo, "127.0.0.1", port, auth=[("alice", "secret")], block=False)
    base = f"http://127.0.0.1:{port}"
    try:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{base}/openapi.json", timeout=10)
        assert err.value.code == 404
        page = urllib.request.urlopen(f"{base}/", timeout=10).read().decode()
        assert "named_endpoints" in page and '"/imported"' not in page and "import_file" not in page
        info = json.loads(re.search(r'"named_endpoints":\s*(\{.*?\})', page).group(1) or "{}")
        assert info == {}
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
        opener.open(urllib.request.Request(f"{base}/login", data=b"username=alice&password=secret"), timeout=10)

        def upload(size: int) -> int:
            boundary = "envlabboundary"
            head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"run.zip\"\r\n"
                    f"Content-Type: application/zip\r\n\r\n").encode()
            body = head + b"x" * size + f"\r\n--{boundary}--\r\n".encode()
            request = urllib.request.Request(f"{base}/gradio_api/upload", data=body,
                                             headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
            try:
                return opener.open(request, timeout=10).status
            except urllib.error.HTTPError as e:
                return e.code
        assert upload(1000) == 200
        assert upload(8 * 1024) == 413
    finally:
        demo.close()
        engine.dispose()


def test_a_bad_row_in_the_database_leaves_the_other_runs_and_views_drawn(tmp_path):
    """Rows an older version imported unchecked: one run's settings a list, another's metric a word."""
    from lab.pages import common, proposal, review, train
    from tests.test_pages import seed_lab

    engine = make_engine(str(tmp_path / "lab.db"))
    ids = seed_lab(engine)
    with engine.begin() as c:
        c.execute(text("UPDATE runs SET settings = '[1, 2]' WHERE id = :i"), {"i": ids["waiting"]})
        c.execute(text("UPDATE stage_metrics SET valid = 'lots' WHERE run_id = :i"), {"i": ids["history"]})
    rows = runs_page.runs_table(engine)["data"]
    assert {r[0]: r[6] for r in rows} == {ids["waiting"]: "? (its settings are unreadable)",
                                          ids["history"]: "1/2 trained"}
    broken = review.review(engine, ids["history"], None)["note"]
    assert broken.startswith(f"✗ The stage review of run #{ids['history']} cannot be drawn: ") and "\n" not in broken
    assert train.train_view(engine, ids["history"])["status"].startswith(
        f"✗ The Train tab of run #{ids['history']} cannot be drawn")
    assert train.train_view(engine, ids["waiting"])["status"].startswith(
        f"✗ The Train tab of run #{ids['waiting']} cannot be drawn")
    assert proposal.proposal_view(engine, ids["pending"])["status"].startswith(
        f"✗ Proposal {ids['pending']} cannot be drawn")
    # what those rows do not touch still draws
    assert review.review(engine, ids["waiting"], None)["note"].startswith("Stage 0: valid")
    assert proposal.proposal_view(engine, ids["second"])["status"] and not proposal.proposal_view(
        engine, ids["second"])["status"].startswith("✗")
    assert review.gallery(engine, ids["history"], 1)[0]
    with gr.Blocks():  # the Proposal tab as the page builds it: its dropdown, and the poll that follows it
        tab = proposal.build(common.Page(engine, gr.Dropdown(), gr.Tabs(), gr.HTML()))
    for shown in (tab.show_all(ids["waiting"]), tab.follow(ids["waiting"], None)):
        assert shown[tab.pick]["choices"] == [] and shown[tab.status].startswith(
            f"✗ The Proposal tab of run #{ids['waiting']} cannot be drawn")
    assert proposal.proposal_preview(engine, ids["pending"])[1].startswith(f"✗ Proposal {ids['pending']} cannot")
    assert tab.show_all(ids["history"])[tab.pick]["choices"]  # the other run's proposals still list
    engine.dispose()
