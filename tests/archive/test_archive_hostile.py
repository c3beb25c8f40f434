"""Run archives from someone else, tried as a hostile user would (docs/archive.md, "What import trusts").

Every case goes through both doors: the command line (`envlab import`) and the function the page's upload
calls (`lab.pages.runs.import_file`). Each is refused in one line that names what is wrong, stores no row and
writes nothing, inside the lab or outside it. The inflating cases are built here with a small size on disk and
run in a child process whose peak memory (ru_maxrss) is compared with an import of a good file.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import warnings
import zipfile
import zlib
from pathlib import Path

import gradio as gr
import pytest
from sqlalchemy import text
from sqlmodel import select

from lab.archive import ArchiveError, Limits, export_run, import_run, parse_size, read_manifest
from lab.cli import main
from lab.pages import runs as runs_page
from storage import queue
from storage.db import checkpoint_of, make_engine, upgrade
from storage.db import session as open_session
from storage.models import Job, Priority, Proposal, Run, Stage
from storage.settings import RunSettings
from tests.recorded import build_run, counts, fake_checkpoints
from tests.seeded import copy_database
from tests.servers import free_port

MIB = 1 << 20
REPO = Path(__file__).resolve().parents[2]
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
def lab(tmp_path, monkeypatch, migrated_template):
    """An empty lab whose runs root is its database's folder, three levels inside tmp_path."""
    monkeypatch.delenv("ENVLAB_RUNS", raising=False)
    for name in [f.name for f in Limits.__dataclass_fields__.values()]:
        monkeypatch.delenv(f"ENVLAB_ARCHIVE_{name.upper()}", raising=False)
    folder = tmp_path / "a" / "b" / "lab"
    folder.mkdir(parents=True)
    copy_database(migrated_template, folder / "envlab.db")
    engine = make_engine(str(folder / "envlab.db"))
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


# ---------------------------------------------------------------- the policy's name across versions


@pytest.mark.parametrize(("version", "policy", "imported"), [(1, "tiny", "tiny-2agent"), (2, "tiny", "tiny"),
                                                             (2, "tiny-2agent", "tiny-2agent"), (3, "tiny", "tiny")])
def test_a_version_1_files_tiny_is_the_2_agent_policy_and_a_later_files_is_todays(good, lab, tmp_path, version,
                                                                                  policy, imported):
    """`tiny` played 2 agents when version-1 files were written: such a run arrives as `tiny-2agent`, its stage 0
    (the policy it started from) too; a later file's names are this envlab's."""
    engine, _ = lab
    assert read_manifest(good)["version"] == 3
    file = rebuild(good, tmp_path / "run.zip", manifest_changed(lambda m: m.update(version=version)))
    file = rebuild(file, tmp_path / "named.zip", rows_changed("runs", 1, policy=policy))
    run_id = import_run(engine, file)
    with open_session(engine) as s:
        assert s.get(Run, run_id).policy == imported
        assert s.exec(select(Stage).where(Stage.run_id == run_id, Stage.index == 0)).one().checkpoint == imported


@pytest.mark.parametrize(("version", "counts"), [(1, (2,)), (2, (2,)), (3, (3, 4, 5))])
def test_settings_that_name_no_validation_agents_read_as_the_files_version_read_them(good, lab, tmp_path, version,
                                                                                     counts):
    """Before version 3 a run whose settings named no validation agent counts was scored on 2-agent boards: such a
    file's run arrives saying 2; a version-3 file's run without them takes today's default, 3, 4 and 5. Counts the
    file names are kept whatever its version."""
    engine, _ = lab
    settings = json.loads(zipfile.ZipFile(good).read("tables/runs.jsonl").decode().splitlines()[0])["settings"]
    unnamed = {k: v for k, v in settings.items() if k != "validation_agents"}
    file = rebuild(good, tmp_path / "run.zip", manifest_changed(lambda m: m.update(version=version)))
    plain = import_run(engine, rebuild(file, tmp_path / "plain.zip", rows_changed("runs", 1, settings=unnamed)))
    other = rebuild(file, tmp_path / "other.zip", replaced(uuid_of(good), "f" * 32))  # a second run: another uuid
    named = import_run(engine, rebuild(other, tmp_path / "named.zip", rows_changed(
        "runs", 1, settings={**unnamed, "validation_agents": [4, 5]})))
    with open_session(engine) as s:
        assert s.get(Run, plain).settings.validation_agents == counts
        assert s.get(Run, named).settings.validation_agents == (4, 5)


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
    from tests.recorded import CONFIG
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
    ("runs", 1, {"settings": {"stages": 10**15}}, r"column settings: not a valid RunSettings: stages: "
                                                  r"1,000,000,000,000,000 is more than 1,000: each stage trains"),
    ("runs", 1, {"settings": {"stages": 2, "validation_boards": 10**15}},
     r"column settings: not a valid RunSettings: validation_boards: 1,000,000,000,000,000 is more than 100,000"),
    ("runs", 1, {"settings": {"stages": 2, "dev_per_size": 3 * 10**9}},
     r"column settings: not a valid RunSettings: dev_per_size: 3,000,000,000 is more than 10,000"),
    ("runs", 1, {"settings": {"stages": 2, "lora": 10**9}},
     r"column settings: not a valid RunSettings: lora: 1,000,000,000 is more than 4,096: a LoRA rank above"),
    ("runs", 1, {"settings": {"stages": 2, "completion_length": 10**6}},
     r"column settings: not a valid RunSettings: completion_length: 1,000,000 is more than 32,768"),
    ("runs", 1, {"settings": {"stages": 2, "held_configs": {"kind": "schedule", "source": "s.json", "configs": [
        {"data_ratio": {"3": 1}, "hole_ratio": {"3": 0.1}, "wait_ratio": {"3": 0.2}},
        {"data_ratio": {"3": 1}, "hole_ratio": {"3": 0.9}, "wait_ratio": {"3": 0.2}}]}}},
     r"column settings: not a valid RunSettings: held_configs.configs: item 2: hole_ratio\[3\] = 0.9 is outside "
     r"0..0.5 \(got "),
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


def test_grpo_fields_a_run_may_not_set_are_dropped_on_import_and_said(good, lab, tmp_path, capsys):
    """A run from another lab that would push with this machine's Hub token, log to someone's Trackio Space, ask a
    vLLM server elsewhere or load foreign code arrives without those fields, in one line naming each; its learning
    knobs and its tracker (kept on this machine) stay."""
    engine, folder = lab
    with zipfile.ZipFile(good) as zf:
        settings = json.loads(zf.read("tables/runs.jsonl").splitlines()[0])["settings"]
    grpo = {"max_steps": 2, "learning_rate": 1e-5, "report_to": "trackio", "trackio_space_id": "attacker-org/leak",
            "push_to_hub": True, "vllm_server_base_url": "http://attacker.example:8000", "trust_remote_code": True,
            "model_init_kwargs": {"trust_remote_code": True}}
    file = rebuild(good, tmp_path / "grpo.zip", rows_changed("runs", 1, settings={**settings, "grpo": grpo}))
    assert main(["import", str(file), "--db", str(folder / "envlab.db")]) == 0
    out = capsys.readouterr().out
    assert out.endswith("-> run 1; dropped: the run's GRPO fields model_init_kwargs, push_to_hub, trackio_space_id, "
                        "trust_remote_code, vllm_server_base_url (a run from another lab sets only how its policy "
                        "learns and samples)\n"), out
    with open_session(engine) as s:
        assert s.get(Run, 1).settings.grpo == {"max_steps": 2, "learning_rate": 1e-5, "report_to": "trackio"}


@pytest.mark.parametrize("table, values, message", [
    ("runs", {"name": "n" * 201}, "name is 201 characters long; at most 200 are stored"),
    ("runs", {"description": "d" * 10_001}, "description is 10,001 characters long; at most 10,000 are stored"),
    ("decisions", {"note": "x" * 10_001}, "note is 10,001 characters long; at most 10,000 are stored"),
    ("decisions", {"user": "u" * 201}, "user is 201 characters long; at most 200 are stored"),
])
def test_a_name_or_note_longer_than_the_lab_takes_is_refused(good, lab, tmp_path, capsys, table, values, message):
    """The bounds of `lab.text`, which the page and the command line keep too: an 8 MB name would stream on every
    page load."""
    column = next(iter(values))
    file = rebuild(good, tmp_path / "long.zip", rows_changed(table, 1, **values))
    refused(lab, tmp_path, file, re.escape(f"tables/{table}.jsonl row 1, column {column}: {message}"), capsys)


def test_an_engineers_long_text_arrives_cut_as_the_lab_keeps_its_own(good, lab, tmp_path, capsys):
    """A proposal's prompt, answer and rationale are not a person's text to refuse: they are kept as the lab keeps
    an engineer's (`lab.text.clipped`), so the Proposal tab never sends megabytes."""
    engine, folder = lab
    rng = random.Random(0)  # text that does not compress like a zip bomb
    raw, prompt, said = ("".join(rng.choices("abcdefghij ", k=n)) for n in (1_000_000, 70_000, 65_536))
    file = rebuild(good, tmp_path / "answer.zip", rows_changed("proposals", 1, raw_answer=raw, prompt=prompt,
                                                               rationale=said))
    assert main(["import", str(file), "--db", str(folder / "envlab.db")]) == 0
    with open_session(engine) as s:
        row = s.exec(select(Proposal).order_by(Proposal.id)).first()
    assert row.raw_answer == raw[:65_536] + "\n[... 934,464 more characters cut: the lab keeps the first 65,536]"
    assert row.prompt == prompt[:65_536] + "\n[... 4,464 more characters cut: the lab keeps the first 65,536]"
    assert row.rationale == said


def test_a_server_url_with_a_password_is_dropped_and_said_without_it(good, lab, tmp_path, capsys):
    engine, folder = lab
    with zipfile.ZipFile(good) as zf:
        settings = json.loads(zf.read("tables/runs.jsonl").splitlines()[0])["settings"]
    file = rebuild(good, tmp_path / "url.zip", rows_changed("runs", 1, settings={
        **settings, "base_url": "http://bob:hunter2@10.0.0.5:8000/v1"}))
    assert main(["import", str(file), "--db", str(folder / "envlab.db")]) == 0
    out = capsys.readouterr().out
    assert "dropped: the run's server URL 'http://10.0.0.5:8000/v1' (an archive names no server: this lab uses its " \
           "own)" in out and "hunter2" not in out
    with open_session(engine) as s:
        assert s.get(Run, 1).settings.base_url is None


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
    with pytest.raises(ArchiveError,
                       match=r"the archive inflates to more than 102400 bytes \(\d+ bytes with its checkpoints\)"):
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


def test_the_page_caps_uploads_and_shows_no_api_schema_under_auth(tmp_path, monkeypatch):
    from lab.pages import web as app

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
        opener.open(urllib.request.Request(f"{base}/login", data=b"username=alice&password=secret",
                                           headers={"Origin": base}), timeout=10)

        def upload(size: int) -> int:
            boundary = "envlabboundary"
            head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"run.zip\"\r\n"
                    f"Content-Type: application/zip\r\n\r\n").encode()
            body = head + b"x" * size + f"\r\n--{boundary}--\r\n".encode()
            request = urllib.request.Request(f"{base}/gradio_api/upload", data=body,
                                             headers={"Content-Type": f"multipart/form-data; boundary={boundary}",
                                                      "Origin": base})
            try:
                return opener.open(request, timeout=10).status
            except urllib.error.HTTPError as e:
                return e.code
        assert upload(1000) == 200
        assert upload(8 * 1024) == 413
    finally:
        demo.close()
        engine.dispose()


def test_a_bad_row_in_the_database_leaves_the_other_runs_and_views_drawn(tmp_path, seeded_template):
    """Rows an older version imported unchecked: one run's settings a list, another's metric a word."""
    from lab.pages import common, proposal, review, train
    from tests.seeded import seeded_copy

    engine, ids = seeded_copy(seeded_template, tmp_path / "lab.db")
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
    assert proposal.proposal_view(engine, ids["pending"]).status.startswith(
        f"✗ Proposal {ids['pending']} cannot be drawn")
    # what those rows do not touch still draws
    assert review.review(engine, ids["waiting"], None)["note"].startswith("Stage 0: valid")
    assert proposal.proposal_view(engine, ids["second"]).status and not proposal.proposal_view(
        engine, ids["second"]).status.startswith("✗")
    assert review.gallery(engine, ids["history"], 1)[0]
    with gr.Blocks():  # the Proposal tab as the page builds it: its dropdown, and the poll that follows it
        tab = proposal.build(common.Page(engine, gr.Dropdown(), gr.Tabs(), gr.HTML(), gr.HTML()))
    for shown in (tab.show_all(ids["waiting"]), tab.follow(ids["waiting"], None)):
        assert shown[tab.pick]["choices"] == [] and shown[tab.status].startswith(
            f"✗ The Proposal tab of run #{ids['waiting']} cannot be drawn")
    assert proposal.proposal_preview(engine, ids["pending"])[1].startswith(f"✗ Proposal {ids['pending']} cannot")
    assert tab.show_all(ids["history"])[tab.pick]["choices"]  # the other run's proposals still list
    engine.dispose()


# ---------------------------------------------------------------- members that share bytes, names, the disk


def _deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    return packer.compress(data) + packer.flush()


class ZipBytes:
    """A zip written by hand, member by member, so that members can share bytes as no zip writer would let them
    (the "overlapping files" zip bomb, after David Fifield's "A better zip bomb", 2019)."""

    def __init__(self):
        self.out = bytearray()
        self.directory: list[tuple[bytes, int, int, int, int]] = []  # name, crc, stored, inflated, offset

    def header(self, name: bytes, crc: int, stored: int, inflated: int) -> bytes:
        return struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 8, 0, 0, crc, stored, inflated, len(name), 0) + name

    def add(self, name: str, data: bytes) -> None:
        packed = _deflate(data)
        self.directory.append((name.encode(), zlib.crc32(data), len(packed), len(data), len(self.out)))
        self.out += self.header(name.encode(), zlib.crc32(data), len(packed), len(data)) + packed

    def add_overlapping(self, names: list[str], kernel: bytes) -> int:
        """Members whose data all end in one shared deflate stream of `kernel`: member i's data quotes member
        i+1's local header in a stored block and runs on into member i+1's data. Returns what they inflate to."""
        packed_kernel = _deflate(kernel)
        headers: list[bytes] = [b""] * len(names)
        sizes = [0] * len(names)
        crcs = [0] * len(names)
        stored = [0] * len(names)
        tail_out, tail_crc, tail_stored = len(kernel), zlib.crc32(kernel), len(packed_kernel)
        for i in reversed(range(len(names))):  # from the last: each header quotes the next one
            name = names[i].encode()
            sizes[i], crcs[i], stored[i] = tail_out, tail_crc, tail_stored
            headers[i] = self.header(name, crcs[i], stored[i], sizes[i])
            quote = struct.pack("<BHH", 0, len(headers[i]), len(headers[i]) ^ 0xFFFF)  # a stored, non-final block
            tail_out += len(headers[i])
            tail_crc = zlib.crc32(kernel, zlib.crc32(b"".join(headers[i:])))
            tail_stored += len(quote) + len(headers[i])
        for i, name in enumerate(names):
            offset = len(self.out)
            self.directory.append((name.encode(), crcs[i], stored[i], sizes[i], offset))
            self.out += headers[i]
            if i + 1 < len(names):
                self.out += struct.pack("<BHH", 0, len(headers[i + 1]), len(headers[i + 1]) ^ 0xFFFF)
        self.out += packed_kernel
        return sum(sizes)

    def write(self, path: Path) -> Path:
        start = len(self.out)
        for name, crc, stored, inflated, offset in self.directory:
            self.out += struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, 8, 0, 0, crc, stored, inflated,
                                    len(name), 0, 0, 0, 0, 0, offset) + name
        n = len(self.directory)
        self.out += struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, n, n, len(self.out) - start, start, 0)
        path.write_bytes(bytes(self.out))
        return path


def overlapping_bomb(good: Path, path: Path, members: int = 40, kernel_mib: int = 1) -> tuple[Path, int]:
    """The good file with stage 1's checkpoint replaced by `members` files over one shared deflate stream:
    each inflates 120 to 197 times its stored size (under the ratio limit), the checksums are right, the
    manifest and stage rows agree. Returns the file and what its checkpoint inflates to."""
    uuid = uuid_of(good)
    folder = f"checkpoints/{uuid}/stage-1/"
    rng = random.Random(0)
    kernel = bytearray()
    while len(kernel) < kernel_mib * MIB:  # zeros with a random byte now and then: 197:1 once deflated
        kernel += rng.randbytes(1) + bytes(rng.randrange(700, 1000))
    z = ZipBytes()
    with zipfile.ZipFile(good) as zf:
        for info in zf.infolist():
            data = zf.read(info)
            if info.filename.startswith(folder):
                continue
            if info.filename == "manifest.json":
                manifest = json.loads(data)
                for c in manifest["checkpoints"]:
                    if c["stage_index"] == 1:
                        c["files"] = members
                data = json.dumps(manifest).encode()
            z.add(info.filename, data)
    inflated = z.add_overlapping([f"{folder}part-{i:03d}.bin" for i in range(members)], bytes(kernel))
    return z.write(path), inflated


def test_the_overlapping_files_zip_bomb_is_refused_at_once_with_nothing_written(good, lab, tmp_path, capsys):
    """40 members over one shared deflate stream: a file of 0.09 MiB whose members are each under the ratio
    limit and whose checksums are right, that would write 40 MiB (1,000 members, 1 GiB). Refused from the zip's
    directory and local headers alone, before a member is inflated, in less time than the good file's import."""
    file, inflated = overlapping_bomb(good, tmp_path / "bomb.zip")
    with zipfile.ZipFile(file) as zf:  # a well-formed zip by every member's own checks
        infos = [i for i in zf.infolist() if i.filename.endswith(".bin")]
        assert len(infos) == 40 and all(100 < i.file_size / i.compress_size < 200 for i in infos)
        assert zf.read(infos[-1]) and zf.testzip() is None
    assert inflated > 100 * file.stat().st_size
    engine, folder = lab
    started = time.perf_counter()
    with pytest.raises(ArchiveError, match=r"bomb.zip: member 'checkpoints/.*/stage-1/part-000.bin' overlaps member "
                                           r"'checkpoints/.*/stage-1/part-001.bin' \(bytes \d+..\d+\): refused"):
        import_run(engine, file)
    refusal = time.perf_counter() - started
    refused(lab, tmp_path, file, r"overlaps member .*: refused \(members that share bytes are a zip bomb\)", capsys)
    started = time.perf_counter()
    import_run(engine, good)
    baseline = time.perf_counter() - started
    with capsys.disabled():
        print(f"\noverlapping-files bomb ({file.stat().st_size / MIB:.2f} MiB, {inflated / MIB:.0f} MiB inflated): "
              f"refused in {refusal * 1000:.1f} ms; the good file imports in {baseline * 1000:.0f} ms")
    assert refusal < baseline


@pytest.mark.parametrize("member", ["manifest.json", "tables/runs.jsonl", "model.safetensors"])
def test_a_member_name_twice_is_refused(good, lab, tmp_path, capsys, member):
    with zipfile.ZipFile(good) as zf:
        name = next(n for n in zf.namelist() if n.endswith(member))
        copy = zf.read(name)
    file = rebuild(good, tmp_path / "twice.zip", lambda n, d: (n, d))
    with zipfile.ZipFile(file, "a") as zf, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate name, and writes it
        zf.writestr(name, copy.replace(b"travel", b"travol"))
    refused(lab, tmp_path, file, rf"the member '{re.escape(name)}' appears twice: refused", capsys)


def test_many_small_members_are_capped_by_the_size_of_the_whole_archive(good, lab, tmp_path, capsys):
    """Members each within the ratio limit (a tiny member may inflate to 200 x 4 KiB) are refused together when
    they inflate to more than `ratio` times the archive, before anything is written."""
    uuid = uuid_of(good)
    members = 60

    def many(name, data):
        if name == "manifest.json":
            manifest = json.loads(data)
            manifest["checkpoints"][0]["files"] = members
            return name, json.dumps(manifest).encode()
        return name, data

    file = rebuild(good, tmp_path / "many.zip", many)
    with zipfile.ZipFile(file) as zf:
        names = [n for n in zf.namelist() if n.startswith(f"checkpoints/{uuid}/stage-1/")]
    file = rebuild(good, tmp_path / "many.zip", lambda n, d: None if n in names else many(n, d))
    with zipfile.ZipFile(file, "a", zipfile.ZIP_DEFLATED) as zf:
        for i in range(members):
            zf.writestr(f"checkpoints/{uuid}/stage-1/part-{i}.bin", bytes(700_000))
    refused(lab, tmp_path, file, r"the checkpoints inflate to 40.1 MiB from \d+ bytes on disk, more than 200 times "
                                 r"the archive \(a zip bomb\?\): refused", capsys)


@pytest.fixture
def small_disk(tmp_path):
    """A real file system of 1 MiB (tmpfs; mounting needs root): the runs root of a lab whose disk is full."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_checkpoints_larger_than_the_free_disk_are_refused_before_they_are_written(good, lab, tmp_path, capsys,
                                                                                   monkeypatch, small_disk):
    (small_disk / "filler").write_bytes(bytes(1024 * 1024 - 100 * 1024))  # 100 KiB left; the checkpoints: 140
    monkeypatch.setenv("ENVLAB_RUNS", str(small_disk))
    refused(lab, tmp_path, good,
            r"the checkpoints need 140016 bytes and the disk of .*small-disk has 102400 bytes free", capsys)
    assert sorted(os.listdir(small_disk)) == ["filler"]


def test_a_disk_that_fills_during_the_import_is_one_line_and_leaves_nothing(good, lab, tmp_path, capsys, monkeypatch,
                                                                            small_disk):
    """The free space is measured, then another writer fills the disk: the write that meets the full disk
    (a real ENOSPC from the file system) ends the import in one line, exit 2, with nothing left behind."""
    (small_disk / "filler").write_bytes(bytes(1024 * 1024 - 200 * 1024))  # 200 KiB free when measured
    real = shutil.disk_usage

    def measured_then_filled(path):
        usage = real(path)
        if Path(path) == small_disk and not (small_disk / "late").exists():
            (small_disk / "late").write_bytes(bytes(150 * 1024))  # someone else writes meanwhile
        return usage

    monkeypatch.setattr(shutil, "disk_usage", measured_then_filled)
    monkeypatch.setenv("ENVLAB_RUNS", str(small_disk))
    engine, folder = lab
    assert main(["import", str(good), "--db", str(folder / "envlab.db")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(r"^envlab import: .*run.zip: the disk of .*small-disk filled up while "
                                              r"the checkpoints were written \(No space left on device\): nothing "
                                              r"was imported", err), err
    assert sorted(os.listdir(small_disk)) == ["filler", "late"] and set(counts(engine).values()) == {0}


# ---------------------------------------------------------------- no server and no model from an archive


class Listener:
    """A real TCP server on 127.0.0.1 that records every connection made to it (and answers none)."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.connections: list[bytes] = []
        self.running = True
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"

    def _serve(self) -> None:
        while self.running:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(1)
                try:
                    self.connections.append(conn.recv(1 << 16))
                except OSError:
                    self.connections.append(b"")

    def close(self) -> None:
        self.running = False
        self.thread.join()
        self.sock.close()


@pytest.fixture
def listener():
    server = Listener()
    yield server
    server.close()


@pytest.fixture
def waiting(tmp_path_factory) -> Path:
    """A run that waits on its proposal after stage 1, exported without checkpoints."""
    folder = tmp_path_factory.mktemp("waiting")
    engine = make_engine(str(folder / "envlab.db"))
    upgrade(engine)
    path = export_run(engine, build_run(engine, finish=False), folder / "run.zip")
    engine.dispose()
    return path


def hostile(waiting: Path, path: Path, url: str, backend: str = "openai:m") -> Path:
    """The run as someone else's lab would send it: the llm engineer on `backend`, its server `url`, and its last
    propose job failed, so that a resume asks the engineer again."""
    with zipfile.ZipFile(waiting) as zf:
        jobs = [json.loads(line) for line in zf.read("tables/jobs.jsonl").splitlines()]
    last = max((j for j in jobs if j["kind"] == "propose"), key=lambda j: j["id"])

    def change(name, data):
        if name == "tables/runs.jsonl":
            row = json.loads(data)
            row.update(engineer="llm", engineer_backend=backend, settings={**row["settings"], "base_url": url})
            return name, (json.dumps(row) + "\n").encode()
        if name == "tables/jobs.jsonl":
            rows = [json.loads(line) for line in data.splitlines()]
            for row in rows:
                if row["id"] == last["id"]:
                    row.update(status="failed", error="the server was down")
            return name, "".join(json.dumps(row) + "\n" for row in rows).encode()
        return name, data

    return rebuild(waiting, path, change)


def test_an_imported_run_sends_nothing_to_the_server_its_archive_names(waiting, tmp_path, monkeypatch, capsys,
                                                                         listener):
    """The run's server URL is dropped on import, and said; resumed with the lab's API key set, the llm engineer
    asks no server (this machine names none), and the listener at the archive's URL receives nothing."""
    from lab.jobs.worker import WorkerOptions, handlers, run_worker
    from lab.loop import resume
    from storage.models import Proposal, Run

    for name in ("ENVLAB_ALLOWED_SERVERS", "ENVLAB_OPENAI_BASE_URL", "ENVLAB_RUNS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ENVLAB_OPENAI_API_KEY", "sk-the-labs-own-key")
    file = hostile(waiting, tmp_path / "hostile.zip", listener.url)
    db = tmp_path / "lab" / "envlab.db"
    assert main(["import", str(file), "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert out.endswith(f"-> run 1; dropped: the run's server URL '{listener.url}' (an archive names no server: "
                        "this lab uses its own)\n"), out
    engine = make_engine(str(db))
    with open_session(engine) as s:
        assert s.get(Run, 1).settings.base_url is None
    assert resume(engine, 1) != []  # the Resume button's and `envlab run --resume`'s first step
    assert run_worker(engine, handlers(), WorkerOptions(once=True)) == 1  # the engineer is asked again, by a worker
    with open_session(engine) as s:
        newest = s.exec(select(Proposal).order_by(Proposal.id.desc())).first()
    engine.dispose()
    assert newest.engineer == "llm (openai:m)" and "openai:m needs a base URL" in newest.error, newest.error
    assert listener.connections == []


def test_a_server_this_machine_does_not_allow_gets_no_request(listener, monkeypatch):
    """Where the request is made: a URL a run holds from before (a database an older version imported into)
    is refused before a byte is sent, even with another server configured."""
    from lab.llm import LLMError, complete

    monkeypatch.setenv("ENVLAB_OPENAI_API_KEY", "sk-the-labs-own-key")
    monkeypatch.setenv("ENVLAB_OPENAI_BASE_URL", "http://127.0.0.1:1/v1")
    monkeypatch.setenv("ENVLAB_ALLOWED_SERVERS", "http://models.internal:8000, https://api.example.com/v1")
    with pytest.raises(LLMError, match=rf"server URL '{listener.url}' is not one this machine allows, so the lab's "
                                       "API key and data are not sent there: list it in \\$ENVLAB_ALLOWED_SERVERS"):
        complete("openai:m", [{"role": "user", "content": "hi"}], max_tokens=4, temperature=0, seed=0,
                 base_url=listener.url)
    assert listener.connections == []


def test_the_allow_list_names_servers_and_the_paths_under_them(monkeypatch):
    from lab.llm import LLMError, allow_server, check_server

    monkeypatch.setenv("ENVLAB_ALLOWED_SERVERS", "http://models.internal:8000, https://API.example.com/v1/")
    monkeypatch.setenv("ENVLAB_OPENAI_BASE_URL", "http://127.0.0.1:8001/v1")
    for url in ["http://models.internal:8000/v1", "http://MODELS.internal:8000", "https://api.example.com/v1",
                "https://api.example.com:443/v1/", "http://127.0.0.1:8001/v1"]:
        check_server(url)
    for url in ["http://models.internal:8001/v1", "https://models.internal:8000/v1", "https://api.example.com/v2",
                "https://api.example.com/v10", "http://models.internal.evil:8000", "http://127.0.0.1:8001/",
                "http://[::1", "not a url"]:
        with pytest.raises(LLMError, match="is not one this machine allows"):
            check_server(url)
    with pytest.raises(LLMError, match="^server URL 'http://evil.com/v1' carries a user name or password"):
        check_server("http://models.internal:8000@evil.com/v1")  # evil.com, with a user name that looks allowed
    allow_server("http://10.0.0.5:9000/v1")  # a --base-url given on this machine's command line
    check_server("http://10.0.0.5:9000/v1")
    assert os.environ["ENVLAB_ALLOWED_SERVERS"].endswith(",http://10.0.0.5:9000/v1")


def test_a_run_created_on_the_page_with_a_server_this_machine_does_not_allow_is_refused(lab, listener,
                                                                                       monkeypatch):
    from envsim.config import EnvConfig
    from lab.pages.common import config_rows

    engine, _ = lab
    monkeypatch.delenv("ENVLAB_ALLOWED_SERVERS", raising=False)
    monkeypatch.delenv("ENVLAB_OPENAI_BASE_URL", raising=False)
    config = EnvConfig.default()
    message, run_id = runs_page.create_run_from_form(
        engine, "r", "", "tiny", "llm", "openai:m", listener.url, 1, config.num_instances, "2=1", 0,
        False, config_rows(config))
    assert run_id is None and message.startswith(f"✗ Not created: server URL '{listener.url}' is not one this "
                                                 "machine allows"), message
    assert set(counts(engine).values()) == {0} and listener.connections == []


@pytest.mark.parametrize("backend", ["hf:/srv/models/theirs", "hf:some-org/some-model", "hf:../x"])
def test_an_archive_naming_a_model_to_load_is_refused(waiting, lab, tmp_path, capsys, backend):
    file = hostile(waiting, tmp_path / "model.zip", None, backend=backend)
    refused(lab, tmp_path, file, rf"tables/runs.jsonl row 1, column engineer_backend: '{re.escape(backend)}' names "
                                 r"a model this lab does not take from an archive \(only hf:policy, hf:gemma3-270m, "
                                 r"openai:<model>\): refused", capsys)


@pytest.mark.parametrize("status, error, note", [
    ("queued", None, "was queued in the archive: imported as cancelled"),
    ("running", "CUDA out of memory", "CUDA out of memory\nwas running in the archive: imported as cancelled"),
])
def test_a_job_the_archive_calls_queued_or_running_arrives_cancelled_and_no_worker_claims_it(good, lab, tmp_path,
                                                                                           status, error, note):
    """A job at the top of every queue (priority 10^9) in a file is ended by the import, at the lowest priority,
    and so are all the run's jobs: none is claimed here, and none jumps this lab's queue if requeued."""
    engine, _ = lab
    file = rebuild(good, tmp_path / "queued.zip", rows_changed("jobs", 1, status=status, error=error,
                                                               priority=10**9, worker="their-gpu:1"))
    run_id = import_run(engine, file)
    with open_session(engine) as s:
        jobs = s.exec(select(Job).where(Job.run_id == run_id).order_by(Job.id)).all()
        assert (jobs[0].status, jobs[0].error, jobs[0].priority) == ("cancelled", note, Priority.BACKGROUND)
        assert {j.priority for j in jobs} == {Priority.BACKGROUND} and "queued" not in {j.status for j in jobs}
        assert queue.claim(s, "any-worker") is None


def refused_policy(value: str) -> str:
    """The refusal of a run whose policy is `value`."""
    return re.escape(f"tables/runs.jsonl row 1, column policy: {value!r} is not a policy this lab takes from an "
                     "archive (tiny, tiny-2agent, gemma3-270m, a model name such as Qwen/Qwen3-4B, or a folder inside "
                     "this lab's runs root): refused")


@pytest.mark.parametrize("value", ["/etc", "{outside}", "{root}/../outside", "{root}", "~/models/mine",
                                   "../models/mine", "runs/theirs/stage-1/policy", "./Qwen3-4B", "Qwen/../etc"])
def test_an_archive_whose_run_loads_a_folder_outside_the_runs_root_is_refused(good, lab, tmp_path, capsys, value):
    """A run's policy is what its stages load: a folder anywhere on this machine (one that exists, too) is refused
    in one line naming the column and the value, and nothing is stored."""
    engine, root = lab
    outside = tmp_path / "somefolder-that-exists"
    outside.mkdir()
    (outside / "config.json").write_text("{}")
    value = value.format(outside=outside, root=root)
    (tmp_path / "sent").mkdir()  # the page names the file without its folder, so not where the paths are
    file = rebuild(good, tmp_path / "sent" / "policy.zip", rows_changed("runs", 1, policy=value))
    refused(lab, tmp_path, file, refused_policy(value), capsys)


def test_a_run_policy_that_names_a_folder_here_is_no_model_name(good, lab, tmp_path, capsys, monkeypatch):
    """`Qwen/Qwen3-4B` is a model name, unless a folder of that name is in the working folder: load_policy would
    load that folder instead."""
    engine, root = lab
    (tmp_path / "Qwen" / "Qwen3-4B").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    file = rebuild(good, tmp_path / "policy.zip", rows_changed("runs", 1, policy="Qwen/Qwen3-4B"))
    refused(lab, tmp_path, file, refused_policy("Qwen/Qwen3-4B"), capsys)


@pytest.mark.parametrize("policy", ["tiny", "gemma3-270m", "Qwen/Qwen3-4B", "{root}/models/mine"])
def test_stage_0s_checkpoint_arrives_as_the_runs_policy_whatever_folder_the_file_names(good, lab, tmp_path, policy):
    """Stage 0's checkpoint is the folder the source machine loaded the run's policy from; a file can make it
    /etc. The import stores the run's own (checked) policy there, which stage 1 and a benchmark of stage 0 load."""
    engine, root = lab
    policy = policy.format(root=root)
    file = rebuild(good, tmp_path / "stage0.zip", rows_changed("runs", 1, policy=policy))
    file = rebuild(file, tmp_path / "stage0-etc.zip", rows_changed("stages", 1, checkpoint="/etc"))
    run_id = import_run(engine, file)
    with open_session(engine) as s:
        stage0 = s.exec(select(Stage).where(Stage.run_id == run_id, Stage.index == 0)).one()
        assert (s.get(Run, run_id).policy, stage0.checkpoint, checkpoint_of(engine, stage0)) == (policy,) * 3


def test_a_checkpoint_that_meets_a_full_disk_leaves_no_half_folder(small_disk):
    """A stage saves its policy on a disk too small for it (a real ENOSPC from a 1 MiB tmpfs): the error says
    so, and neither the checkpoint folder nor a part of it is left to be loaded later."""
    from training.policy import MARKER, build_tiny

    policy = build_tiny()
    target = small_disk / "run" / "stage-1" / "policy"
    with pytest.raises(Exception, match="No space left on device"):  # safetensors' error names the OS's
        policy.save(target)
    assert not target.exists() and [p.name for p in small_disk.rglob("*")] == ["run", "stage-1"]
    assert not any(small_disk.rglob(MARKER))


def test_generate_onto_a_full_disk_is_one_line_and_leaves_no_file(small_disk, capsys):
    (small_disk / "filler").write_bytes(bytes(1024 * 1024 - 8 * 1024))  # 8 KiB left
    out = small_disk / "boards.jsonl"
    assert main(["generate", "--n", "200", "--out", str(out)]) == 2
    err = capsys.readouterr().err.split("\r")[-1]  # after the progress bar's last redraw
    assert err.count("\n") == 2 and err.splitlines()[-1].startswith("envlab generate: the disk is full"), err
    assert "No space left on device): nothing was left half-written" in err, err
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]


def test_envlab_import_loads_no_training_stack():
    """`envlab import` reads and stores rows: torch and transformers (300 MB resident before any row) stay out
    of its process, so its peak memory is the archive reader's (docs/archive.md, "How big")."""
    code = ("import resource, sys\nimport lab.archive, lab.cli\nfrom lab.cli import arguments\narguments()\n"
            "print(sorted(m for m in ('torch', 'transformers', 'trl') if m in sys.modules), "
            "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("[] "), done.stdout
