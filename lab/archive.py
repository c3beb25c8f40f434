"""Runs travel: one file holds a run's rows, and optionally its stages' checkpoints, to load into another lab.

The file is a zip (docs/archive.md): `manifest.json` (format name, version, what the file holds),
`tables/<table>.jsonl` (one JSON object per row, every column by name, the ids of the database it came from)
and `checkpoints/<stored path>/...` (a stage's checkpoint folder, at the path its stage row stores).

Which tables travel, and how their ids are rewritten, is read from the SQLModel metadata: `runs`, then every
table with a foreign key into a table that travels (stages, jobs, episodes, ... on runs; decisions on
proposals). A column added later travels with no change here. The one exception is ids the lab keeps inside
JSON, listed in `JSON_IDS`: a job's payload names its run, so a resumed job must find the new id there.

An import is one transaction: every row or none. Checkpoints are unpacked into a scratch folder under the
runs root first, moved into place just before the commit, and removed again if anything fails.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from itertools import islice
from pathlib import Path, PurePosixPath
from typing import Any

from sqlalchemy import Column, ColumnElement, Connection, DateTime, Engine, Table, TypeDecorator, or_, select
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.sql.ddl import sort_tables
from sqlmodel import SQLModel
from tqdm import tqdm

from storage.db import checkpoint_of, current_revision, runs_root
from storage.models import ACTIVE_JOB, Job, Run, Stage, utcnow

FORMAT = "envlab-run"
VERSION = 1  # raise it when a file of this version would be read wrongly by the code that reads it now
MANIFEST = "manifest.json"
ROOT = Run.__tablename__
BATCH_ROWS = 500

# Ids the lab keeps inside JSON columns: (table, column) -> {key: the table the id is of}. They are rewritten
# like foreign keys, or a job requeued after the import would work on whichever run has the old id.
JSON_IDS: dict[tuple[str, str], dict[str, str]] = {
    ("jobs", "payload"): {"run_id": "runs", "replaces": "proposals"},
    ("jobs", "result"): {"run_id": "runs", "proposal_id": "proposals"},
}
# Foreign keys out of a run's world: the file keeps them, an import leaves them NULL. A run travels alone, not
# with the experiment it was one of (its `arm` and settings still say which arm it was).
DETACHED = {("runs", "experiment_id")}


def _links(table: Table) -> list:
    """The table's foreign keys that travel with a run (all but the `DETACHED` ones)."""
    return [fk for fk in table.foreign_keys if (table.name, fk.parent.name) not in DETACHED]


class ArchiveError(ValueError):
    """A run cannot be exported or imported as asked; the message says what is wrong. Nothing was changed."""


def run_tables() -> list[Table]:
    """The tables that travel with a run, each after the tables its ids name: `runs`, then every table with a
    foreign key into one that travels."""
    tables: list[Table] = []
    for table in SQLModel.metadata.sorted_tables:  # parents before children
        parents = {fk.column.table.name for fk in _links(table)}
        if table.name == ROOT or parents & {t.name for t in tables}:
            tables.append(table)
    names = {t.name for t in tables}
    for table in tables:
        if outside := {fk.column.table.name for fk in _links(table)} - names:
            raise ArchiveError(f"table {table.name} refers to {', '.join(sorted(outside))}, which does not travel "
                               "with a run: lab/archive.py cannot remap those ids")
        if len(table.primary_key.columns) != 1:
            raise ArchiveError(f"table {table.name} has no single-column primary key to remap")
    metadata = SQLModel.metadata.tables
    json_parents = [(metadata[parent], metadata[name]) for (name, _), keys in JSON_IDS.items()
                    for parent in keys.values()]
    return sort_tables(tables, extra_dependencies=json_parents)


def _pk(table: Table) -> Column:
    return next(iter(table.primary_key.columns))


def _is_datetime(column: Column) -> bool:
    kind = column.type.impl_instance if isinstance(column.type, TypeDecorator) else column.type
    return isinstance(kind, DateTime)


def _rows_of_run(table: Table, run_id: int) -> ColumnElement[bool]:
    """The rows of `table` that belong to run `run_id`: directly, or through a parent row that does."""
    if table.name == ROOT:
        return _pk(table) == run_id
    return or_(*(fk.parent.in_(select(fk.column).where(_rows_of_run(fk.column.table, run_id)))
                 for fk in _links(table)))


# --- export --------------------------------------------------------------------------------------------------


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


def _stored_path(value: str, what: str) -> PurePosixPath:
    """A checkpoint path relative to the runs root, refused when it could point anywhere else."""
    path = PurePosixPath(value)
    if value != str(path) or path.is_absolute() or ".." in path.parts or not path.parts or "\\" in value:
        raise ArchiveError(f"{what} {value!r} is not a plain relative path under the runs root")
    return path


def _checkpoint_folders(engine: Engine, connection: Connection, run_id: int) -> list[tuple[int, str, Path]]:
    """(stage index, stored path, folder) of every trained stage of the run that has a checkpoint."""
    stages = connection.execute(select(Stage.index, Stage.checkpoint).where(
        Stage.run_id == run_id, Stage.index > 0, Stage.checkpoint.is_not(None)).order_by(Stage.index)).all()
    out = []
    for stage in stages:
        stored = str(_stored_path(stage.checkpoint, f"stage {stage.index}'s checkpoint"))
        folder = Path(checkpoint_of(engine, Stage(index=stage.index, checkpoint=stage.checkpoint)))
        if not folder.is_dir():
            if (connection.execute(select(Run.settings).where(Run.id == run_id)).scalar_one() or {}).get("example"):
                raise ArchiveError(f"run {run_id} is the shipped example, whose checkpoints are not shipped "
                                   "(docs/example.md): export it without checkpoints")
            raise ArchiveError(f"stage {stage.index}'s checkpoint folder {folder} is missing (runs root "
                               f"{runs_root(engine)}): set ENVLAB_RUNS, or export without checkpoints")
        out.append((stage.index, stored, folder))
    return out


def _encode(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def _write_table(zf: zipfile.ZipFile, connection: Connection, table: Table, run_id: int) -> int:
    rows = connection.execute(select(table).where(_rows_of_run(table, run_id)).order_by(_pk(table))
                              .execution_options(yield_per=BATCH_ROWS))
    n = 0
    with zf.open(f"tables/{table.name}.jsonl", "w", force_zip64=True) as out:
        for row in rows.mappings():
            line = json.dumps({name: _encode(value) for name, value in row.items()})
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
                "tables": {t.name: {"rows": counts[t.name], "columns": [c.name for c in t.columns]} for t in tables},
                "checkpoints": _write_checkpoints(zf, folders),
            }
            zf.writestr(MANIFEST, json.dumps(manifest, indent=2, ensure_ascii=False))
        os.replace(part, path)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return path


# --- reading a file ------------------------------------------------------------------------------------------


@contextmanager
def _open(path: Path) -> Iterator[zipfile.ZipFile]:
    try:
        zf = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise ArchiveError(f"{path}: no such file") from None
    except (zipfile.BadZipFile, OSError) as err:
        raise ArchiveError(f"{path}: not a run archive: it is not a zip file, or it is truncated ({err})") from None
    with zf:
        try:
            yield zf
        except (zipfile.BadZipFile, EOFError, zipfile.LargeZipFile) as err:
            raise ArchiveError(f"{path}: the file is damaged ({err})") from None


def _check_table(table: Table, entry: Any, names: set[str], where: str) -> None:
    if not (isinstance(entry, dict) and isinstance(entry.get("rows"), int) and isinstance(entry.get("columns"), list)):
        raise ArchiveError(f"{where}: tables.{table.name} needs a row count and a column list")
    columns = {c.name: c for c in table.columns}
    if unknown := [c for c in entry["columns"] if c not in columns]:
        raise ArchiveError(f"{where}: table {table.name} has columns this envlab does not know "
                           f"({', '.join(map(str, unknown))}): import it with a newer envlab")
    needed = [c.name for c in table.columns if c.name not in entry["columns"] and not c.nullable
              and c.default is None and c.server_default is None]
    if needed:
        raise ArchiveError(f"{where}: table {table.name} lacks columns this database needs ({', '.join(needed)})")
    if f"tables/{table.name}.jsonl" not in names:
        raise ArchiveError(f"{where}: tables/{table.name}.jsonl is missing")


def _check_manifest(zf: zipfile.ZipFile, path: Path) -> dict[str, Any]:
    if MANIFEST not in zf.namelist():
        raise ArchiveError(f"{path}: no {MANIFEST}: not an envlab run archive")
    try:
        manifest = json.loads(zf.read(MANIFEST))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ArchiveError(f"{path}: {MANIFEST} is not JSON ({err})") from None
    where = f"{path}: {MANIFEST}"
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise ArchiveError(f"{where} names format {found!r}, not {FORMAT!r}: not an envlab run archive")
    version = manifest.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ArchiveError(f"{where}: version {version!r} is not a format version (1, 2, ...)")
    if version > VERSION:
        raise ArchiveError(f"{path} was written by a newer envlab (format version {version}; this one reads "
                           f"versions 1 to {VERSION}): upgrade envlab to import it")
    run, tables = manifest.get("run"), manifest.get("tables")
    if not (isinstance(run, dict) and isinstance(run.get("id"), int) and isinstance(run.get("uuid"), str)
            and isinstance(run.get("name"), str)):
        raise ArchiveError(f"{where}: 'run' needs the run's id, uuid and name")
    if not isinstance(tables, dict) or ROOT not in tables:
        raise ArchiveError(f"{where}: 'tables' must list the {ROOT} table")
    known = {t.name: t for t in run_tables()}
    if unknown := sorted(set(tables) - set(known)):
        raise ArchiveError(f"{where}: tables this envlab does not know ({', '.join(unknown)}): "
                           "import it with a newer envlab")
    names = set(zf.namelist())
    for name, entry in tables.items():
        _check_table(known[name], entry, names, where)
    checkpoints = manifest.get("checkpoints")
    if not isinstance(checkpoints, list) or not all(
            isinstance(c, dict) and isinstance(c.get("path"), str) and isinstance(c.get("files"), int)
            for c in checkpoints):
        raise ArchiveError(f"{where}: 'checkpoints' must be a list of {{stage_index, path, files, bytes}}")
    for c in checkpoints:
        _stored_path(c["path"], f"{where}: checkpoint")
        found = len(_members(zf, c["path"]))
        if found != c["files"]:
            raise ArchiveError(f"{where}: checkpoint {c['path']} should hold {c['files']} files, the file has {found}")
    return manifest


def read_manifest(path: str | Path) -> dict[str, Any]:
    """What a run archive holds (its checked manifest: the run, row counts per table, checkpoints), to show
    before importing it. Raises `ArchiveError` for a file that is not one this envlab can import."""
    with _open(Path(path)) as zf:
        return _check_manifest(zf, Path(path))


def _members(zf: zipfile.ZipFile, stored: str) -> list[tuple[zipfile.ZipInfo, PurePosixPath]]:
    """The files of one checkpoint folder in the archive, each with its path inside that folder."""
    prefix = f"checkpoints/{stored}/"
    return [(info, _stored_path(info.filename[len(prefix):], "archive member"))
            for info in zf.infolist() if info.filename.startswith(prefix) and not info.is_dir()]


def _rows(zf: zipfile.ZipFile, table: Table, entry: dict[str, Any], where: str) -> Iterator[dict[str, Any]]:
    columns = set(entry["columns"])
    with zf.open(f"tables/{table.name}.jsonl") as lines:
        for n, line in enumerate(lines, 1):
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                raise ArchiveError(f"{where} row {n} is not JSON ({err})") from None
            if not isinstance(row, dict) or set(row) != columns:
                raise ArchiveError(f"{where} row {n} does not hold the columns the manifest lists")
            yield row


# --- import --------------------------------------------------------------------------------------------------


def _refuse_duplicate(engine: Engine, run: dict[str, Any]) -> None:
    with engine.connect() as connection:
        found = connection.execute(select(Run.id).where(Run.uuid == run["uuid"])).scalar()
    if found is not None:
        raise ArchiveError(f"run {run['uuid']} ({run['name']}) is already in this database as run #{found}")


class _Rows:
    """Turns a table's archived rows into rows of this database: datetimes parsed, ids mapped."""

    def __init__(self, table: Table, ids: dict[str, dict[int, int]], where: str):
        self.table, self.ids, self.where = table, ids, where
        self.pk = _pk(table).name
        self.fks = {fk.parent.name: fk.column.table.name for fk in _links(table)}
        self.detached = {column for name, column in DETACHED if name == table.name}
        self.datetimes = {c.name for c in table.columns if _is_datetime(c)}
        self.json_ids = {column: keys for (name, column), keys in JSON_IDS.items() if name == table.name}

    def _id(self, parent: str, old: Any, n: int, column: str) -> int:
        new = self.ids[parent].get(old) if isinstance(old, int) else None
        if new is None:
            raise ArchiveError(f"{self.where} row {n}: {column} = {old!r} names no {parent} row of this archive")
        return new

    def convert(self, row: dict[str, Any], n: int) -> dict[str, Any]:
        out = {}
        for name, value in row.items():
            if name == self.pk:
                continue
            if name in self.detached:
                value = None
            elif value is not None and name in self.fks:
                value = self._id(self.fks[name], value, n, name)
            elif value is not None and name in self.datetimes:
                try:
                    value = datetime.fromisoformat(value)
                except (TypeError, ValueError):
                    raise ArchiveError(f"{self.where} row {n}: {name} = {value!r} is not a datetime") from None
            elif isinstance(value, dict) and name in self.json_ids:
                value = {k: self._id(self.json_ids[name][k], v, n, f"{name}.{k}")
                         if k in self.json_ids[name] and v is not None else v for k, v in value.items()}
            out[name] = value
        return out


def _insert_rows(connection: Connection, zf: zipfile.ZipFile, manifest: dict[str, Any], path: Path) -> int:
    """Insert every row of the archive (one transaction, the caller's) and return the new run id."""
    ids: dict[str, dict[int, int]] = {}
    total = sum(entry["rows"] for entry in manifest["tables"].values())
    with tqdm(total=total, desc="rows", unit="row", disable=None) as bar:
        for table in run_tables():
            mapping = ids[table.name] = {}
            entry = manifest["tables"].get(table.name)
            if entry is None:  # a table this file's envlab did not have: it had no rows of it
                continue
            where = f"{path}: tables/{table.name}.jsonl"
            rows = _Rows(table, ids, where)
            pk = _pk(table)
            insert = table.insert().returning(pk, sort_by_parameter_order=True)
            for batch in _batches(enumerate(_rows(zf, table, entry, where), 1), BATCH_ROWS):
                values = [rows.convert(row, n) for n, row in batch]
                try:
                    new = connection.execute(insert, values).scalars().all()
                except SQLAlchemyError as err:
                    if isinstance(err, IntegrityError) and table.name == ROOT:
                        raise  # the run's uuid taken meanwhile, most likely: import_run says by whom
                    raise ArchiveError(f"{where}: rows {batch[0][0]}..{batch[-1][0]} do not fit this database "
                                       f"({str(getattr(err, 'orig', err)).splitlines()[0]})") from None
                mapping.update(zip((row[pk.name] for _, row in batch), new, strict=True))
                bar.update(len(batch))
            if len(mapping) != entry["rows"]:
                raise ArchiveError(f"{where} holds {len(mapping)} rows, the manifest says {entry['rows']}")
    run = manifest["run"]
    if list(ids[ROOT]) != [run["id"]]:
        raise ArchiveError(f"{path}: tables/{ROOT}.jsonl should hold exactly run {run['id']}")
    uuid = connection.execute(select(Run.uuid).where(Run.id == ids[ROOT][run["id"]])).scalar_one()
    if uuid != run["uuid"]:
        raise ArchiveError(f"{path}: the run row's uuid {uuid} is not the manifest's {run['uuid']}")
    return ids[ROOT][run["id"]]


def _makedirs(path: Path, created: list[Path]) -> None:
    """`mkdir -p`, noting each folder it made, so a failed import can remove exactly those."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for p in reversed(missing):
        p.mkdir()
        created.append(p)


def _same_files(zf: zipfile.ZipFile, stored: str, folder: Path) -> bool:
    """Whether `folder` holds exactly the checkpoint's files (same names, sizes and CRC-32)."""
    members = {rel.as_posix(): info for info, rel in _members(zf, stored)}
    on_disk = {p.relative_to(folder).as_posix(): p for p in folder.rglob("*") if p.is_file()}
    if set(members) != set(on_disk):
        return False
    for name, info in members.items():
        p = on_disk[name]
        if p.stat().st_size != info.file_size or _crc32(p) != info.CRC:
            return False
    return True


def _crc32(path: Path) -> int:
    crc = 0
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return crc


def _batches(rows: Iterator[Any], n: int) -> Iterator[list[Any]]:
    while batch := list(islice(rows, n)):
        yield batch


def _unpack(zf: zipfile.ZipFile, manifest: dict[str, Any], root: Path, created: list[Path]) -> tuple[Path, list[str]]:
    """Unpack the checkpoints this database lacks into a scratch folder under `root`; returns it and their paths.

    A folder already in place with the very same files (a runs root the two labs share) is kept as it is;
    one with other files is refused before anything is written.
    """
    todo = []
    for c in manifest["checkpoints"]:
        dest = root / c["path"]
        if dest.exists():
            if not _same_files(zf, c["path"], dest):
                raise ArchiveError(f"{dest} exists already with other files: move it away, or import into a "
                                   "database with another runs root (ENVLAB_RUNS)")
            continue
        todo.append(c["path"])
    _makedirs(root, created)
    scratch = Path(tempfile.mkdtemp(prefix=".import-", dir=root))
    members = {stored: _members(zf, stored) for stored in todo}
    total = sum(info.file_size for m in members.values() for info, _ in m)
    with tqdm(total=total, desc="checkpoints", unit="B", unit_scale=True, disable=None) as bar:
        for i, stored in enumerate(todo):
            for info, rel in members[stored]:
                target = scratch / str(i) / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, target.open("wb") as dst:  # zipfile checks the CRC-32 at the end
                    shutil.copyfileobj(src, dst, 1 << 20)
                bar.update(info.file_size)
    return scratch, todo


def _undo(placed: list[Path], scratch: Path | None, created: list[Path]) -> None:
    """Remove what a failed import put on disk: the folders it moved into place, its scratch folder, and the
    folders it made for them (those only if empty: someone else may have put something there meanwhile)."""
    for p in placed:
        shutil.rmtree(p, ignore_errors=True)
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)
    for d in reversed(created):
        if d.exists() and not any(d.iterdir()):
            d.rmdir()


def import_run(engine: Engine, path: str | Path) -> int:
    """Load a run archive into this database with new ids, and its checkpoints under this database's runs root;
    return the new run id.

    Raises `ArchiveError` (and changes nothing: no row, no folder) for a file that is truncated, damaged or
    not a run archive, one written by a newer envlab, or a run this database holds already (same uuid).
    """
    path = Path(path)
    with _open(path) as zf:
        manifest = _check_manifest(zf, path)
        _refuse_duplicate(engine, manifest["run"])
        root = runs_root(engine)
        created: list[Path] = []
        placed: list[Path] = []
        scratch, todo = None, []
        try:
            if manifest["checkpoints"]:
                scratch, todo = _unpack(zf, manifest, root, created)
            with engine.begin() as connection:
                run_id = _insert_rows(connection, zf, manifest, path)
                for i, stored in enumerate(todo):  # into place just before the commit; removed if it fails
                    _makedirs((root / stored).parent, created)
                    (scratch / str(i)).rename(root / stored)
                    placed.append(root / stored)
        except BaseException as err:
            _undo(placed, scratch, created)
            if isinstance(err, IntegrityError):
                _refuse_duplicate(engine, manifest["run"])  # someone imported it meanwhile
                raise ArchiveError(f"{path}: the rows do not fit this database ({err.orig})") from None
            raise
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return run_id

