"""Runs travel: export a run to one file and import it into another database, on SQLite and PostgreSQL.

The run is made by the real loop (tests/recorded.py's recorded stages): three stages, an edit with a note,
a reject, an accept, their jobs and evaluations, plus training logs and benchmark episodes written by hand.
"""

import itertools
import json
import os
import random
import zipfile
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlmodel import SQLModel, select

from lab.archive import ArchiveError, export_run, import_run, read_manifest, run_tables
from lab.cli import main
from lab.jobs.worker import WorkerOptions, run_worker
from lab.loop import advance, create_run, drive, resume, stages_of
from lab.proposals import current_proposal, decide
from storage.db import checkpoint_of, make_engine, upgrade
from storage.db import session as open_session
from storage.models import Episode, Priority, Run, Stage
from storage.settings import RunSettings
from tests.recorded import BOARDS, CONFIG, build_run, counts, fake_checkpoints, work
from tests.seeded import copy_database

TRAVELLING = ["runs", "stages", "proposals", "decisions", "jobs", "episodes", "stage_metrics", "training_logs"]
# Ids inside JSON that must follow their rows: (table, column) -> {key: table}.
JSON_IDS = {("jobs", "payload"): {"run_id": "runs", "replaces": "proposals"},
            ("jobs", "result"): {"run_id": "runs", "proposal_id": "proposals"}}
_numbers = itertools.count()


@pytest.fixture
def new_database(request, tmp_path):
    """`make(kind)`: a fresh migrated database, "sqlite" (a file in a folder of its own) or "postgres"."""
    engines, dropped = [], []

    def make(kind: str):  # a copy of the test process's migrated database (tests/conftest.py)
        if kind == "sqlite":
            folder = tmp_path / f"target-{next(_numbers)}"
            folder.mkdir()
            copy_database(request.getfixturevalue("migrated_template"), folder / "envlab.db")
            url = f"sqlite:///{folder / 'envlab.db'}"
        else:
            server = request.getfixturevalue("postgres_server")
            template = request.getfixturevalue("postgres_template")
            name = f"envlab_archive_{os.getpid()}_{next(_numbers)}"
            admin = create_engine(f"{server}/postgres", isolation_level="AUTOCOMMIT")
            with admin.connect() as c:
                c.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
            dropped.append((admin, name))
            url = f"{server}/{name}"
        engine = make_engine(url)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.dispose()
    for admin, name in dropped:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def kind_of(engine) -> str:
    return "sqlite" if engine.dialect.name == "sqlite" else "postgres"


def dump(engine, run_id: int) -> dict[str, list[dict]]:
    """Every row of a run, table by table in id order, read through the tables' own column types."""
    tables = SQLModel.metadata.tables
    proposals = select(tables["proposals"].c.id).where(tables["proposals"].c.run_id == run_id)
    out = {}
    with engine.connect() as c:
        for name in TRAVELLING:
            t = tables[name]
            where = (t.c.id == run_id if name == "runs" else
                     t.c.proposal_id.in_(proposals) if name == "decisions" else t.c.run_id == run_id)
            out[name] = [dict(row) for row in c.execute(select(t).where(where).order_by(t.c.id)).mappings()]
    return out


def assert_same_run(before: dict[str, list[dict]], after: dict[str, list[dict]]) -> dict[str, dict[int, int]]:
    """Every column of every row equal, ids compared through the mapping the rows' order gives; returns it."""
    assert {name: len(rows) for name, rows in after.items()} == {name: len(rows) for name, rows in before.items()}
    ids = {name: {old["id"]: new["id"] for old, new in zip(before[name], after[name], strict=True)} for name in before}
    for name in TRAVELLING:
        for old, new in zip(before[name], after[name], strict=True):
            assert set(new) == set(old)
            for column, value in old.items():
                expected = value
                if column == "run_id":
                    expected = ids["runs"][value]
                elif column == "proposal_id":
                    expected = ids["proposals"][value]
                elif (name, column) == ("jobs", "priority"):
                    expected = int(Priority.BACKGROUND)  # an imported job is nobody's interactive request here
                elif (name, column) == ("stages", "checkpoint") and old["index"] == 0 and value is not None:
                    expected = before["runs"][0]["policy"]  # not the folder the exporting machine loaded it from
                elif (name, column) in JSON_IDS and value is not None:
                    keys = JSON_IDS[name, column]
                    expected = {k: ids[keys[k]][v] if k in keys and v is not None else v for k, v in value.items()}
                got = new[column]
                if column == "id":
                    continue
                assert type(got) is type(expected) and got == expected, (name, old["id"], column, got, expected)
                if isinstance(got, datetime):
                    assert got.isoformat() == expected.isoformat() and got.tzinfo == UTC
    return ids


def crowd(engine) -> None:
    """Other runs first, so that every id of an imported run collides with one in use."""
    for name in ("first", "second"):
        with open_session(engine) as s:
            run_id = create_run(s, name=name, config=CONFIG, settings=RunSettings(stages=1), engineer="fixed").id
        work(engine)
        work(engine)
        with open_session(engine) as s:
            decide(s, current_proposal(s, run_id).id, "accept", "dora")


def test_the_tables_that_travel_are_read_from_the_metadata():
    assert sorted(t.name for t in run_tables()) == sorted(TRAVELLING)
    assert [t.name for t in run_tables()][0] == "runs"


@pytest.mark.parametrize("target", ["sqlite", "postgres"])
def test_export_then_import_gives_back_the_run_exactly(engine, new_database, tmp_path, target):
    run_id = build_run(engine)
    before = dump(engine, run_id)
    assert any(job["payload"].get("replaces") for job in before["jobs"])  # the ask after the reject
    assert {d["action"] for d in before["decisions"]} == {"edit", "reject", "accept"}
    file = export_run(engine, run_id, tmp_path / "run.zip")
    manifest = read_manifest(file)
    assert (manifest["format"], manifest["version"], manifest["run"]["id"]) == ("envlab-run", 3, run_id)
    assert {name: t["rows"] for name, t in manifest["tables"].items()} == {n: len(r) for n, r in before.items()}

    fresh = new_database(target)
    ids = assert_same_run(before, dump(fresh, new_id := import_run(fresh, file)))
    assert ids["runs"] == {run_id: new_id}

    crowded = new_database(target)
    crowd(crowded)
    new_id = import_run(crowded, file)
    ids = assert_same_run(before, dump(crowded, new_id))
    for name in ("runs", "stages", "proposals", "decisions", "jobs", "episodes", "stage_metrics"):
        assert all(new != old for old, new in ids[name].items()), name  # every id moved, and was followed
    with open_session(crowded) as s:
        assert s.get(Run, new_id).uuid == before["runs"][0]["uuid"]


def test_an_imported_run_carries_on_in_its_new_lab(engine, new_database, tmp_path):
    """A run whose stage failed is exported, imported among other runs and resumed there: the requeued job is
    the imported one, so its payload must name the run's new id (recorded_stage reads it from there)."""
    def broken_stage(engine, job, progress):
        raise RuntimeError("out of memory")

    with open_session(engine) as s:
        run_id = create_run(s, name="broken", config=CONFIG, settings=RunSettings(stages=1, auto_apply=True),
                            engineer="fixed").id
    run_worker(engine, {"stage": broken_stage}, WorkerOptions(once=True, poll_s=0.01))
    assert advance(engine, run_id).text.startswith("failed: stage 0 failed: RuntimeError: out of memory")
    file = export_run(engine, run_id, tmp_path / "broken.zip")

    target = new_database(kind_of(engine))
    crowd(target)
    new_id = import_run(target, file)
    assert new_id != run_id
    assert len(resume(target, new_id)) == 1
    assert drive(target, new_id, lambda: work(target), poll_s=0.01).text == "done"
    with open_session(target) as s:
        assert [st.status for st in stages_of(s, new_id)] == ["done", "done"]
        assert len(s.exec(select(Episode).where(Episode.run_id == new_id)).all()) == 2 * 2 * len(BOARDS)  # val, dev


def test_importing_the_same_run_twice_is_refused(engine, new_database, tmp_path):
    run_id = build_run(engine)
    uuid = dump(engine, run_id)["runs"][0]["uuid"]
    file = export_run(engine, run_id, tmp_path / "run.zip")
    with pytest.raises(ArchiveError, match=f"run {uuid} \\(travel\\) is already in this database as run #{run_id}$"):
        import_run(engine, file)
    target = new_database(kind_of(engine))
    crowd(target)
    new_id = import_run(target, file)
    before = counts(target)
    with pytest.raises(ArchiveError, match=f"run {uuid} \\(travel\\) is already in this database as run #{new_id}$"):
        import_run(target, file)
    assert counts(target) == before


def rewrite(src: Path, dst: Path, change) -> Path:
    """Copy a zip, passing each member through `change(name, data)` (None drops the member)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            data = change(info.filename, zin.read(info))
            if data is not None:
                zout.writestr(info.filename, data)
    return dst


def with_manifest(**changes):
    def change(name, data):
        return json.dumps({**json.loads(data), **changes}).encode() if name == "manifest.json" else data
    return change


def test_truncated_corrupt_and_foreign_files_are_refused_and_change_nothing(engine, new_database, tmp_path):
    file = export_run(engine, build_run(engine), tmp_path / "run.zip")
    data = file.read_bytes()
    episodes = read_manifest(file)["tables"]["episodes"]["rows"]
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "truncated.zip").write_bytes(data[: len(data) // 2])
    (bad / "corrupt.zip").write_bytes(random.Random(0).randbytes(len(data)))
    rewrite(file, bad / "no-manifest.zip", lambda name, d: None if name == "manifest.json" else d)
    rewrite(file, bad / "other-format.zip", with_manifest(format="someone-elses-run"))
    rewrite(file, bad / "newer.zip", with_manifest(version=4))
    rewrite(file, bad / "not-a-version.zip", with_manifest(version="1"))
    # failures found half way through the rows, after some tables were inserted: the transaction undoes them
    rewrite(file, bad / "short.zip", lambda name, d: b"".join(d.splitlines(keepends=True)[1:])
            if name == "tables/episodes.jsonl" else d)
    rewrite(file, bad / "orphan.zip", lambda name, d: d.replace(b'"proposal_id": ', b'"proposal_id": 9999', 1)
            if name == "tables/decisions.jsonl" else d)
    rewrite(file, bad / "new-column.zip", lambda name, d: d.replace(b'"valid"', b'"verified"', 1)
            if name == "manifest.json" else d)
    expected = {
        "truncated.zip": "not a run archive: it is not a zip file, or it is truncated",
        "corrupt.zip": "not a run archive: it is not a zip file, or it is truncated",
        "no-manifest.zip": "no manifest.json: not an envlab run archive",
        "other-format.zip": "names format 'someone-elses-run', not 'envlab-run': not an envlab run archive",
        "newer.zip": r"written by a newer envlab \(format version 4; this one reads versions 1 to 3\)",
        "not-a-version.zip": "version '1' is not a format version",
        "short.zip": f"tables/episodes.jsonl holds {episodes - 1} rows, the manifest says {episodes}",
        "orphan.zip": "tables/decisions.jsonl row 1: proposal_id = 9999.* names no proposals row of this archive",
        "new-column.zip": r"table episodes has columns this envlab does not know \(verified\)",
    }
    target = new_database(kind_of(engine))
    crowd(target)
    before = counts(target)
    folder = sorted(os.listdir(Path(target.url.database).parent)) if kind_of(engine) == "sqlite" else None
    for name, message in expected.items():
        with pytest.raises(ArchiveError, match=message):
            import_run(target, bad / name)
        assert counts(target) == before, name
    if folder is not None:
        assert sorted(os.listdir(Path(target.url.database).parent)) == folder
    import_run(target, file)  # the good file still goes in after all that


def files_under(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_checkpoints_come_back_byte_for_byte(engine, new_database, tmp_path, monkeypatch):
    monkeypatch.setenv("ENVLAB_RUNS", str(tmp_path / "source-runs"))
    run_id = build_run(engine)
    files = fake_checkpoints(tmp_path / "source-runs", engine, run_id)
    assert len(files) == 4
    file = export_run(engine, run_id, tmp_path / "run.zip", checkpoints=True)
    uuid = read_manifest(file)["run"]["uuid"]
    assert [(c["stage_index"], c["path"], c["files"]) for c in read_manifest(file)["checkpoints"]] == [
        (1, f"{uuid}/stage-1", 2), (2, f"{uuid}/stage-2", 2)]

    target_root = tmp_path / "target-runs"
    monkeypatch.setenv("ENVLAB_RUNS", str(target_root))
    target = new_database(kind_of(engine))
    new_id = import_run(target, file)
    assert files_under(target_root) == files and os.listdir(target_root) == [uuid]  # no scratch left
    with open_session(target) as s:
        stage = s.exec(select(Stage).where(Stage.run_id == new_id, Stage.index == 2)).one()
        assert checkpoint_of(target, stage) == str(target_root / uuid / "stage-2")

    # The same files already in place (a runs root two labs share) are kept; other files there are refused.
    other = new_database(kind_of(engine))
    assert import_run(other, file) == 1 and files_under(target_root) == files
    (target_root / uuid / "stage-1/model.safetensors").write_bytes(b"someone else's")
    another = new_database(kind_of(engine))
    with pytest.raises(ArchiveError, match=f"{uuid}/stage-1 exists already with other files"):
        import_run(another, file)
    assert counts(another)["runs"] == 0


def test_a_failed_import_leaves_no_folder_and_no_row(engine, new_database, tmp_path, monkeypatch):
    monkeypatch.setenv("ENVLAB_RUNS", str(tmp_path / "source-runs"))
    run_id = build_run(engine)
    fake_checkpoints(tmp_path / "source-runs", engine, run_id)
    file = export_run(engine, run_id, tmp_path / "run.zip", checkpoints=True)
    target_root = tmp_path / "target-runs" / "deeper"
    monkeypatch.setenv("ENVLAB_RUNS", str(target_root))
    target = new_database(kind_of(engine))

    short = rewrite(file, tmp_path / "short.zip", lambda name, d: b"".join(d.splitlines(keepends=True)[1:])
                    if name == "tables/training_logs.jsonl" else d)
    with pytest.raises(ArchiveError, match="training_logs.jsonl holds 2 rows, the manifest says 3"):
        import_run(target, short)
    assert not (tmp_path / "target-runs").exists() and counts(target)["runs"] == 0

    # the second checkpoint fails to move into place: the first, moved already, goes again with the rows
    renames = []
    real_rename = Path.rename

    def rename(self, target_path):
        renames.append(target_path)
        if len(renames) == 2:
            raise OSError("No space left on device")
        return real_rename(self, target_path)

    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(OSError, match="No space left"):
        import_run(target, file)
    assert len(renames) == 2 and not (tmp_path / "target-runs").exists()
    assert counts(target)["runs"] == 0


def test_export_refuses_a_run_that_is_still_working_or_missing_its_checkpoints(engine, tmp_path, monkeypatch):
    with open_session(engine) as s:
        busy = create_run(s, name="busy", config=CONFIG, settings=RunSettings(stages=1), engineer="fixed").id
    with pytest.raises(ArchiveError, match=f"run {busy} has a queued stage job \\(job 1, stage 0\\)"):
        export_run(engine, busy, tmp_path / "busy.zip")
    assert list(tmp_path.glob("busy.zip*")) == []
    with pytest.raises(ArchiveError, match="no run 99 in this database"):
        export_run(engine, 99, tmp_path / "none.zip")
    monkeypatch.setenv("ENVLAB_RUNS", str(tmp_path / "runs"))
    run_id = build_run(engine, "done")
    with pytest.raises(ArchiveError, match="stage 1's checkpoint folder .*/stage-1 is missing"):
        export_run(engine, run_id, tmp_path / "done.zip", checkpoints=True)
    assert list(tmp_path.glob("done.zip*")) == []


def test_the_cli_exports_and_imports(tmp_path, capsys):
    source, target = tmp_path / "a" / "envlab.db", tmp_path / "b" / "envlab.db"
    engine = make_engine(str(source))
    upgrade(engine)
    run_id = build_run(engine)
    files = fake_checkpoints(source.parent, engine, run_id)
    engine.dispose()
    out = tmp_path / "run.zip"
    assert main(["export", str(run_id), "--out", str(out), "--checkpoints", "--db", str(source)]) == 0
    assert f"run {run_id} -> {out}" in capsys.readouterr().out
    assert main(["import", str(out), "--db", str(target)]) == 0
    assert capsys.readouterr().out.endswith("(travel) -> run 1\n")
    uuid = read_manifest(out)["run"]["uuid"]
    assert {k: v for k, v in files_under(target.parent).items() if k.startswith(f"{uuid}/")} == files
    assert not list(target.parent.glob(".import-*"))
    assert main(["import", str(out), "--db", str(target)]) == 2
    assert "(travel) is already in this database as run #1" in capsys.readouterr().err
    assert main(["export", "42", "--out", str(tmp_path / "x.zip"), "--db", str(source)]) == 2
    assert "envlab export: no run 42 in this database" in capsys.readouterr().err


def test_a_random_share_travels_and_an_out_of_range_one_is_refused(engine, new_database, tmp_path):
    from envsim.config import EnvConfig

    broad = EnvConfig(**{**CONFIG.model_dump(), "random_share": 0.5})
    with open_session(engine) as s:
        run_id = create_run(s, name="broad", config=broad, settings=RunSettings(stages=1), engineer="fixed").id
    work(engine)  # stage 0
    file = export_run(engine, run_id, tmp_path / "run.zip")
    target = new_database(kind_of(engine))
    with open_session(target) as s:
        stage = s.exec(select(Stage).where(Stage.run_id == import_run(target, file))).first()
        assert stage.config == broad and stage.config.random_share == 0.5
    bad = rewrite(file, tmp_path / "too-broad.zip", lambda name, d: d.replace(b'"random_share": 0.5',
                                                                             b'"random_share": 1.5')
                  if name == "tables/stages.jsonl" else d)
    other = new_database(kind_of(engine))
    with pytest.raises(ArchiveError, match="random_share = 1.5 is outside 0..1"):
        import_run(other, bad)


def test_an_archive_whose_configs_name_num_agents_imports_them_as_agent_ratio(engine, new_database, tmp_path):
    """An archive written before `agent_ratio` says `num_agents`: it imports, and is stored as the lab writes now."""
    with open_session(engine) as s:
        run_id = create_run(s, name="old", config=CONFIG, settings=RunSettings(stages=1), engineer="fixed").id
    work(engine)  # stage 0
    work(engine)  # the proposal
    file = export_run(engine, run_id, tmp_path / "run.zip")
    assert b'"agent_ratio": {"2": 1.0}' in zipfile.ZipFile(file).read("tables/stages.jsonl")
    old = rewrite(file, tmp_path / "old.zip", lambda name, d: d.replace(b'"agent_ratio": {"2": 1.0}',
                                                                      b'"num_agents": 2')
                  if name.startswith("tables/") else d)
    assert b"agent_ratio" not in zipfile.ZipFile(old).read("tables/stages.jsonl")
    target = new_database(kind_of(engine))
    new_id = import_run(target, old)
    with open_session(target) as s:
        stage = s.exec(select(Stage).where(Stage.run_id == new_id)).one()
        assert stage.config == CONFIG and stage.config.agent_ratio == {2: 1.0}
    with target.connect() as c:
        stored = c.execute(text("SELECT config FROM stages WHERE run_id = :r"), {"r": new_id}).scalar_one()
    assert "agent_ratio" in str(stored) and "num_agents" not in str(stored)
