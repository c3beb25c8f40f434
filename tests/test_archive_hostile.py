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

import pytest
from sqlalchemy import text

from lab.archive import ArchiveError, Limits, export_run, import_run, parse_size, read_manifest
from lab.cli import main
from lab.pages import runs as runs_page
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
        run_id = create_run(s, name="old", config=CONFIG, stages=1, engineer="fixed").id
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


def bomb(good: Path, dst: Path, member: str, size: int, head: bytes = b"", tail: bytes = b"") -> Path:
    """`good` with `member` replaced by `head`, `size` bytes of "a", `tail`: deflated, about size / 1000 on disk."""
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
        for info in zin.infolist():
            if info.filename == member:
                continue
            zout.writestr(info.filename, zin.read(info))
        with zout.open(member, "w", force_zip64=True) as f:
            f.write(head)
            chunk = b"a" * MIB
            for _ in range(size // MIB):
                f.write(chunk)
            f.write(tail)
    assert dst.stat().st_size < size / 100
    return dst


def a_long_row(good: Path) -> tuple[bytes, bytes]:
    """The first episode row cut open at its completion: (what comes before the text, what comes after)."""
    with zipfile.ZipFile(good) as zf:
        row = json.loads(zf.read("tables/episodes.jsonl").splitlines()[0])
    row["completion"] = "@@"
    head, tail = json.dumps(row).split("@@")
    return head.encode(), (tail + "\n").encode()


BOMB = 256 * MIB


def peak_import_kib(file: Path, db: Path, env: dict[str, str]) -> tuple[int, int, str]:
    """(exit status, peak resident memory in KiB, stderr) of `envlab import` in a child process."""
    code = ("import resource, sys\nfrom lab.cli import main\nrc = main(sys.argv[1:])\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, rc)")
    done = subprocess.run([sys.executable, "-c", code, "import", str(file), "--db", str(db)], cwd=REPO,
                          capture_output=True, text=True, env={**os.environ, **env}, timeout=300)
    peak, rc = done.stdout.split()[-2:]
    return int(rc), int(peak), done.stderr


@pytest.mark.parametrize("member, env, message", [
    # the default limits: a member that inflates 1,000 times its stored size is refused by the ratio limit
    ("tables/episodes.jsonl", {}, r"tables/episodes.jsonl inflates to more than 200 times its stored size"),
    # the ratio lifted: the line limit (16 MiB by default)
    ("tables/episodes.jsonl", {"ENVLAB_ARCHIVE_RATIO": "100000"}, r"tables/episodes.jsonl row 1 is longer than "
                                                                  r"16.0 MiB"),
    ("manifest.json", {"ENVLAB_ARCHIVE_RATIO": "100000"}, r"manifest.json inflates to more than 4.0 MiB"),
    (None, {"ENVLAB_ARCHIVE_RATIO": "100000", "ENVLAB_ARCHIVE_FILE": "64m"},
     r"checkpoints/.*/stage-1/model.safetensors inflates to more than 64.0 MiB"),
    (None, {}, r"checkpoints/.*/stage-1/model.safetensors inflates to more than 200 times"),
])
def test_an_inflating_member_is_refused_within_a_memory_bound(good, lab, tmp_path, capsys, monkeypatch, member,
                                                              env, message):
    """A member of 256 MiB inflated (a few hundred KiB on disk) is refused while it is read: the import's peak
    memory stays within 64 MiB of an import of the good file, and nothing is stored or written."""
    engine, folder = lab
    if member == "tables/episodes.jsonl":
        head, tail = a_long_row(good)
        file = bomb(good, tmp_path / "bomb.zip", member, BOMB, head, tail)
    elif member == "manifest.json":
        file = bomb(good, tmp_path / "bomb.zip", member, BOMB, b'{"format": "envlab-run", "pad": "', b'"}')
    else:
        member = f"checkpoints/{uuid_of(good)}/stage-1/model.safetensors"
        file = bomb(good, tmp_path / "bomb.zip", member, BOMB)
    before = everything(tmp_path)
    rc, peak, err = peak_import_kib(file, folder / "envlab.db", env)
    assert rc == 2 and err.count("\n") == 1 and re.search(message, err), err
    assert everything(tmp_path) == before and set(counts(engine).values()) == {0}
    rc, baseline, err = peak_import_kib(good, tmp_path / "baseline" / "envlab.db", {})
    assert rc == 0, err
    assert peak - baseline < 64 * 1024, (peak, baseline)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    text_, run_id = runs_page.import_file(engine, str(file))  # the page's upload: the same refusal
    assert run_id is None and re.search(message, text_) and "\n" not in text_, text_
    assert everything(tmp_path) == before and set(counts(engine).values()) == {0}


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
    from lab.pages import proposal, review, train
    from tests.test_pages import seed_lab

    engine = make_engine(str(tmp_path / "lab.db"))
    ids = seed_lab(engine)
    with engine.begin() as c:
        c.execute(text("UPDATE runs SET settings = '[1, 2]' WHERE id = :i"), {"i": ids["waiting"]})
        c.execute(text("UPDATE stage_metrics SET valid = 'lots' WHERE run_id = :i"), {"i": ids["history"]})
    rows = runs_page.runs_table(engine)["data"]
    assert {r[0]: r[5] for r in rows} == {ids["waiting"]: "? (its settings are unreadable)",
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
    engine.dispose()
