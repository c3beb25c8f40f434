"""Writing a run archive: a run's rows, and optionally its stages' checkpoints, in one file (docs/archive.md)."""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import ColumnElement, Connection, Engine, Table, or_, select
from tqdm import tqdm

from lab.archive.tables import (
    BATCH_ROWS,
    FORMAT,
    MANIFEST,
    ROOT,
    VERSION,
    ArchiveError,
    links,
    primary_key,
    run_tables,
    stored_path,
)
from storage.db import checkpoint_of, current_revision, runs_root
from storage.models import ACTIVE_JOB, Job, Run, Stage, Typed, utcnow


def _rows_of_run(table: Table, run_id: int) -> ColumnElement[bool]:
    """The rows of `table` that belong to run `run_id`: directly, or through a parent row that does."""
    if table.name == ROOT:
        return primary_key(table) == run_id
    return or_(*(fk.parent.in_(select(fk.column).where(_rows_of_run(fk.column.table, run_id)))
                 for fk in links(table)))


@contextmanager
def _snapshot(engine: Engine) -> Iterator[Connection]:
    """A read-only connection that sees one moment of the database, so the tables agree with each other."""
    with engine.connect() as connection:
        if connection.dialect.name == "sqlite":
            connection.exec_driver_sql("BEGIN")  # a read transaction: WAL keeps its snapshot until the end
        else:
            connection = connection.execution_options(isolation_level="REPEATABLE READ")
        try:
            yield connection
        finally:
            connection.rollback()


def _refuse_active(connection: Connection, run_id: int) -> None:
    # A queued or running job belongs to this lab's workers: in another lab it would be claimed again, and
    # the rows it is writing would be cut off midway.
    job = connection.execute(select(Job.id, Job.kind, Job.target, Job.status)
                             .where(Job.run_id == run_id, Job.status.in_(ACTIVE_JOB)).order_by(Job.id)).first()
    if job is not None:
        raise ArchiveError(f"run {run_id} has a {job.status} {job.kind} job (job {job.id}, stage {job.target}): "
                           "export it once its jobs have ended, or cancel the run first")

def _checkpoint_folders(engine: Engine, connection: Connection, run_id: int) -> list[tuple[int, str, Path]]:
    """(stage index, stored path, folder) of every trained stage of the run that has a checkpoint."""
    stages = connection.execute(select(Stage.index, Stage.checkpoint).where(
        Stage.run_id == run_id, Stage.index > 0, Stage.checkpoint.is_not(None)).order_by(Stage.index)).all()
    out = []
    for stage in stages:
        stored = str(stored_path(stage.checkpoint, f"stage {stage.index}'s checkpoint"))
        folder = Path(checkpoint_of(engine, Stage(index=stage.index, checkpoint=stage.checkpoint)))
        if not folder.is_dir():
            if connection.execute(select(Run.settings).where(Run.id == run_id)).scalar_one().example:
                raise ArchiveError(f"run {run_id} is the shipped example, whose checkpoints are not shipped "
                                   "(docs/example.md): export it without checkpoints")
            raise ArchiveError(f"stage {stage.index}'s checkpoint folder {folder} is missing (runs root "
                               f"{runs_root(engine)}): set ENVLAB_RUNS, or export without checkpoints")
        out.append((stage.index, stored, folder))
    return out


def _encode(value: Any, column_type: Any) -> Any:
    """A column's value as JSON: a typed record as its column stores it (`storage.models.Typed`)."""
    if isinstance(column_type, Typed) and value is not None:
        return column_type.dump(value)
    return value.isoformat() if isinstance(value, datetime) else value


def _write_table(zf: zipfile.ZipFile, connection: Connection, table: Table, run_id: int) -> int:
    rows = connection.execute(select(table).where(_rows_of_run(table, run_id)).order_by(primary_key(table))
                              .execution_options(yield_per=BATCH_ROWS))
    n = 0
    with zf.open(f"tables/{table.name}.jsonl", "w", force_zip64=True) as out:
        for row in rows.mappings():
            line = json.dumps({name: _encode(value, table.c[name].type) for name, value in row.items()})
            out.write(line.encode() + b"\n")
            n += 1
    return n


def _write_checkpoints(zf: zipfile.ZipFile, folders: list[tuple[int, str, Path]]) -> list[dict[str, Any]]:
    files = {stored: sorted(p for p in folder.rglob("*") if p.is_file()) for _, stored, folder in folders}
    sizes = {p: p.stat().st_size for paths in files.values() for p in paths}
    entries = []
    with tqdm(total=sum(sizes.values()), desc="checkpoints", unit="B", unit_scale=True, disable=None) as bar:
        for index, stored, folder in folders:
            for p in files[stored]:
                # Stored, not deflated: model weights barely compress, and deflating them takes minutes.
                zf.write(p, f"checkpoints/{stored}/{p.relative_to(folder).as_posix()}", zipfile.ZIP_STORED)
                bar.update(sizes[p])
            entries.append({"stage_index": index, "path": stored, "files": len(files[stored]),
                            "bytes": sum(sizes[p] for p in files[stored])})
    return entries


def export_run(engine: Engine, run_id: int, path: str | Path, checkpoints: bool = False) -> Path:
    """Write run `run_id` to one file at `path` (docs/archive.md) and return the path.

    With `checkpoints`, the checkpoint folders of its trained stages go in too. The file appears whole or
    not at all (it is written beside `path` and renamed). A run with a queued or running job is refused.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    tables = run_tables()
    try:
        with _snapshot(engine) as connection, zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as zf:
            run = connection.execute(select(Run.id, Run.uuid, Run.name).where(Run.id == run_id)).first()
            if run is None:
                raise ArchiveError(f"no run {run_id} in this database")
            _refuse_active(connection, run_id)
            folders = _checkpoint_folders(engine, connection, run_id) if checkpoints else []
            counts = {t.name: _write_table(zf, connection, t, run_id) for t in tables}
            manifest = {
                "format": FORMAT, "version": VERSION, "exported_at": utcnow().isoformat(),
                "schema_revision": current_revision(engine),
                "run": {"id": run.id, "uuid": run.uuid, "name": run.name},
                "tables": {t.name: {"rows": counts[t.name], "columns": [column.name for column in t.columns]}
                           for t in tables},
                "checkpoints": _write_checkpoints(zf, folders),
            }
            zf.writestr(MANIFEST, json.dumps(manifest, indent=2, ensure_ascii=False))
        os.replace(part, path)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return path
