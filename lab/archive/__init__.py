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

import errno
import itertools
import json
import os
import re
import shutil
import struct
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from datetime import datetime
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    TypeAdapter,
    ValidationError,
)
from sqlalchemy import Column, ColumnElement, Connection, DateTime, Engine, Table, TypeDecorator, or_, select
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.sql.ddl import sort_tables
from sqlmodel import SQLModel
from tqdm import tqdm
from typing_extensions import TypedDict

from storage.db import RUN_UUID, UnsafePath, checkpoint_of, current_revision, inside, run_folder, runs_root
from storage.models import ACTIVE_JOB, Job, JobStatus, Priority, Run, Stage, utcnow
from training.resolve import GEMMA

FORMAT = "envlab-run"
VERSION = 1  # raise it when a file of this version would be read wrongly by the code that reads it now
MANIFEST = "manifest.json"
ROOT = Run.__tablename__
BATCH_ROWS = 500
BATCH_BYTES = 32 << 20  # and at most about this much JSON per insert batch

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
#
# An archive comes from someone else: nothing in it is trusted until it is checked, and everything is checked
# before anything is stored (docs/archive.md, "What import trusts"). Members are read as streams and their
# bytes counted as they inflate (the sizes a zip's directory declares can lie); tables are read line by line.

MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class Limits:
    """How much one archive may inflate to; each can be set in the environment (`ENVLAB_ARCHIVE_<NAME>`, in bytes,
    or with a k, m or g suffix: powers of 1024). `upload` is the page's upload limit (Gradio's `max_file_size`)."""

    line: int = 16 * MIB  # one row of a table
    table: int = 4 * GIB  # one table file
    file: int = 16 * GIB  # one checkpoint file
    total: int = 64 * GIB  # everything in the archive
    ratio: int = 200  # inflated bytes per stored byte, per member (deflate cannot pass about 1,030)
    manifest: int = 4 * MIB
    upload: int = GIB

    @classmethod
    def from_env(cls) -> Limits:
        """The defaults, with any `ENVLAB_ARCHIVE_LINE`, `..._TABLE`, `..._FILE`, `..._TOTAL`, `..._RATIO`,
        `..._MANIFEST` or `..._UPLOAD` set in the environment."""
        values = {}
        for f in fields(cls):
            raw = os.environ.get(f"ENVLAB_ARCHIVE_{f.name.upper()}")
            if raw:
                values[f.name] = parse_size(raw, f"ENVLAB_ARCHIVE_{f.name.upper()}")
        return cls(**values)


def parse_size(text: str, what: str) -> int:
    """`1048576`, `64k`, `16m`, `2g` (powers of 1024) as a positive number of bytes."""
    raw = text.strip().lower().removesuffix("ib").removesuffix("b")
    scale = {"k": 1 << 10, "m": MIB, "g": GIB}.get(raw[-1:], 1)
    number = raw[:-1] if raw[-1:] in "kmg" else raw
    try:
        value = int(float(number) * scale)
    except ValueError:
        raise ArchiveError(f"{what}={text!r} is not a size (bytes, or 64k, 16m, 2g)") from None
    if value < 1:
        raise ArchiveError(f"{what}={text!r}: a limit is at least 1 byte")
    return value


def _mib(n: int) -> str:
    return f"{n / MIB:.1f} MiB" if n >= MIB else f"{n} bytes"


_DAMAGE = (zipfile.BadZipFile, EOFError, zlib.error, zipfile.LargeZipFile, NotImplementedError, RuntimeError,
           OSError, ValueError)


class _Reader:
    """The archive's members, read with every byte counted against `Limits`, and every read error one line."""

    def __init__(self, zf: zipfile.ZipFile, path: Path, limits: Limits):
        self.zf, self.path, self.limits = zf, path, limits
        self.size = path.stat().st_size
        self.total = 0

    def _ceiling(self, info: zipfile.ZipInfo, limit: int) -> int:
        stored = min(max(info.compress_size, 0), self.size)
        return min(limit, self.limits.ratio * max(stored, 4096))

    def _tally(self, name: str, read: int, ceiling: int, limit: int, n: int) -> None:
        self.total += n
        if read > ceiling:
            why = (f"more than {_mib(limit)}" if ceiling == limit else
                   f"more than {self.limits.ratio} times its stored size (a zip bomb?)")
            raise ArchiveError(f"{self.path}: {name} inflates to {why}: refused")
        if self.total > self.limits.total:
            raise ArchiveError(f"{self.path}: the archive inflates to more than {_mib(self.limits.total)} "
                               f"(at {name}): refused")

    def room(self, infos: list[zipfile.ZipInfo], root: Path) -> int:
        """The bytes these members will write under `root`, refused before anything is written when one member
        or all of them together would inflate beyond the limits (by the sizes the directory declares, which
        bound what zipfile inflates), beyond `limits.ratio` times the whole archive, or beyond the free disk."""
        total = 0
        for info in infos:
            ceiling = self._ceiling(info, self.limits.file)
            self._tally(info.filename, info.file_size, ceiling, self.limits.file, 0)
            total += info.file_size
        if self.total + total > self.limits.total:
            raise ArchiveError(f"{self.path}: the archive inflates to more than {_mib(self.limits.total)} "
                               f"({_mib(self.total + total)} with its checkpoints): refused")
        if total > self.limits.ratio * max(self.size, 4096):
            raise ArchiveError(f"{self.path}: the checkpoints inflate to {_mib(total)} from {_mib(self.size)} on "
                               f"disk, more than {self.limits.ratio} times the archive (a zip bomb?): refused")
        free = shutil.disk_usage(_existing(root)).free
        if total > free:
            raise ArchiveError(f"{self.path}: the checkpoints need {_mib(total)} and the disk of {root} has "
                               f"{_mib(free)} free: free some space, or import into a lab with room (ENVLAB_RUNS)")
        return total

    def _damaged(self, label: str, err: BaseException, at: str = "") -> ArchiveError:
        text = str(err).splitlines()[0] if str(err) else "unreadable"
        return ArchiveError(f"{self.path}: {label} is damaged{at} ({type(err).__name__}: {text})")

    def member(self, info: zipfile.ZipInfo) -> Any:
        """The member opened for reading (a stream); reading it may still raise, see `_DAMAGE`."""
        try:
            return self.zf.open(info)
        except _DAMAGE as err:
            raise self._damaged(info.filename, err) from None

    def read(self, name: str, limit: int) -> bytes:
        """A whole small member (the manifest)."""
        info = self.zf.getinfo(name)
        ceiling = self._ceiling(info, limit)
        with self.member(info) as f:
            try:
                data = f.read(ceiling + 1)
            except _DAMAGE as err:
                raise self._damaged(name, err) from None
        self._tally(name, len(data), ceiling, limit, len(data))
        return data

    def lines(self, name: str) -> Iterator[tuple[int, bytes]]:
        """(row number, line) of a table file, one line in memory at a time, none longer than `limits.line`."""
        info = self.zf.getinfo(name)
        ceiling = self._ceiling(info, self.limits.table)
        read = 0
        with self.member(info) as f:
            for n in itertools.count(1):
                try:
                    line = f.readline(self.limits.line + 1)
                except _DAMAGE as err:
                    raise self._damaged(name, err, f" at row {n}") from None
                if not line:
                    return
                read += len(line)
                self._tally(name, read, ceiling, self.limits.table, len(line))
                if len(line) > self.limits.line:
                    raise ArchiveError(f"{self.path}: {name} row {n} is longer than {_mib(self.limits.line)}: "
                                       "refused")
                yield n, line

    def copy(self, info: zipfile.ZipInfo, target: Path) -> int:
        """One checkpoint file to `target`, checked against its CRC-32 by zipfile at the end; returns its size."""
        ceiling = self._ceiling(info, self.limits.file)
        read = 0
        with self.member(info) as src, target.open("wb") as dst:
            while True:
                try:
                    chunk = src.read(MIB)
                except _DAMAGE as err:
                    raise self._damaged(info.filename, err) from None
                if not chunk:
                    return read
                read += len(chunk)
                self._tally(info.filename, read, ceiling, self.limits.file, len(chunk))
                dst.write(chunk)


@contextmanager
def _open(path: Path, limits: Limits | None = None) -> Iterator[_Reader]:
    try:
        zf = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise ArchiveError(f"{path}: no such file") from None
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as err:
        raise ArchiveError(f"{path}: not a run archive: it is not a zip file, or it is truncated ({err})") from None
    with zf:
        try:
            _check_layout(zf, path)
            yield _Reader(zf, path, limits or Limits.from_env())
        except (zipfile.BadZipFile, EOFError, zipfile.LargeZipFile, zlib.error) as err:
            raise ArchiveError(f"{path}: the file is damaged ({err})") from None


LOCAL_HEADER = struct.Struct("<4s22xHH")  # a member's local header: signature, ..., name length, extra length
LOCAL_HEADER_SIZE = 30


def _check_layout(zf: zipfile.ZipFile, path: Path) -> None:
    """Refuse a zip whose members share bytes or names, before any member is read.

    Each member must own its bytes: its local header and data, from the header's offset to the end of its
    compressed data, may not reach into another member's or into the central directory. Members that overlap
    are how a small zip inflates to many times its size within the per-member ratio (the "overlapping files"
    zip bomb: many entries of the directory over one shared deflate stream); no zip writer makes them. Two
    members of one name would leave which one counts to whichever reader comes last."""
    infos = zf.infolist()
    names: set[str] = set()
    for info in infos:
        if info.filename in names:
            raise ArchiveError(f"{path}: the member {info.filename!r:.120} appears twice: refused (which copy "
                               "counts would be up to the reader)")
        names.add(info.filename)
    spans = []
    fp = zf.fp
    assert fp is not None
    for info in infos:
        fp.seek(info.header_offset)
        head = fp.read(LOCAL_HEADER_SIZE)
        if len(head) < LOCAL_HEADER_SIZE or head[:4] != zipfile.stringFileHeader:
            raise ArchiveError(f"{path}: {info.filename!r:.120} has no local header where the directory says: "
                               "the file is damaged")
        _, name_length, extra_length = LOCAL_HEADER.unpack(head)
        end = info.header_offset + LOCAL_HEADER_SIZE + name_length + extra_length + info.compress_size
        spans.append((info.header_offset, end, info.filename))
    spans.sort()
    directory = zf.start_dir
    for (_, end, name), (next_start, _, next_name) in itertools.pairwise([*spans, (directory, 0, "")]):
        if end > next_start:
            other = f"member {next_name!r:.120}" if next_name else "the zip's directory"
            raise ArchiveError(f"{path}: member {name!r:.120} overlaps {other} (bytes {next_start}..{end}): "
                               "refused (members that share bytes are a zip bomb)")


def _is_id(value: Any) -> bool:
    """Whether a row's primary key is one: an integer (not a boolean), 0 or more."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class RunEntry(_Strict):
    """The run a file holds, as its source database knew it."""

    id: NonNegativeInt
    uuid: str
    name: str


class TableEntry(_Strict):
    """One table file: how many rows, and the columns each row holds."""

    rows: NonNegativeInt
    columns: list[str]


class CheckpointEntry(_Strict):
    """One checkpoint folder in the file: the stage it belongs to and its stored path."""

    stage_index: NonNegativeInt
    path: str
    files: NonNegativeInt


class Manifest(_Strict):
    """`manifest.json`: what a run archive holds (docs/archive.md). Keys the reader does not use travel as they
    are; the ones it uses have their types here."""

    format: str
    version: int = Field(ge=1)
    run: RunEntry
    tables: dict[str, TableEntry]
    checkpoints: list[CheckpointEntry]


# What a manifest that fails `Manifest` gets told, by the key where the first problem is.
_MANIFEST_SHAPES = {
    "run": "'run' needs the run's id, uuid and name",
    "tables": f"'tables' must list the {ROOT} table",
    "checkpoints": "'checkpoints' must be a list of {stage_index, path, files, bytes}",
}


def _shape_problem(err: ValidationError) -> str:
    """The first problem of a manifest, in the words of `_MANIFEST_SHAPES` (a table's entry: its own words)."""
    loc = err.errors(include_url=False)[0]["loc"]
    if loc[0] == "tables" and len(loc) > 1:
        if len(loc) > 2 and loc[2] == "columns":
            return f"tables.{loc[1]}.columns must be a list of column names (strings)"
        return f"tables.{loc[1]} needs a row count and a column list"
    return _MANIFEST_SHAPES.get(str(loc[0]), f"{loc[0]} is not what an envlab run archive holds")


def _in_run_folder(path: str, uuid: str, what: str) -> PurePosixPath:
    """A checkpoint path, refused unless it is a plain relative path inside the run's own folder (`<uuid>/...`):
    the one rule for the manifest's checkpoints and the stage rows' `checkpoint`."""
    stored = _stored_path(path, what)
    if stored.parts[0] != uuid or len(stored.parts) < 2:
        raise ArchiveError(f"{what} {path!r:.120} is not inside the run's own folder ({uuid}/...): refused")
    return stored


def _check_table(table: Table, entry: TableEntry, names: set[str], where: str) -> None:
    if len(set(entry.columns)) != len(entry.columns):
        raise ArchiveError(f"{where}: tables.{table.name}.columns names a column twice")
    columns = {c.name: c for c in table.columns}
    if unknown := [c for c in entry.columns if c not in columns]:
        raise ArchiveError(f"{where}: table {table.name} has columns this envlab does not know "
                           f"({', '.join(map(str, unknown))}): import it with a newer envlab")
    needed = [c.name for c in table.columns if c.name not in entry.columns and not c.nullable
              and c.default is None and c.server_default is None]
    if needed:
        raise ArchiveError(f"{where}: table {table.name} lacks columns this database needs ({', '.join(needed)})")
    if f"tables/{table.name}.jsonl" not in names:
        raise ArchiveError(f"{where}: tables/{table.name}.jsonl is missing")


def _check_manifest(reader: _Reader) -> dict[str, Any]:
    """The file's manifest, checked against `Manifest` and against this envlab (its tables, its version) and the
    file (the members it lists); returned as the JSON it is."""
    zf, path = reader.zf, reader.path
    if MANIFEST not in zf.namelist():
        raise ArchiveError(f"{path}: no {MANIFEST}: not an envlab run archive")
    try:
        manifest = json.loads(reader.read(MANIFEST, reader.limits.manifest))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise ArchiveError(f"{path}: {MANIFEST} is not JSON ({str(err)[:200]})") from None
    where = f"{path}: {MANIFEST}"
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise ArchiveError(f"{where} names format {found!r:.80}, not {FORMAT!r}: not an envlab run archive")
    version = manifest.get("version")
    try:
        TypeAdapter(Annotated[int, Field(ge=1, strict=True)]).validate_python(version)
    except ValidationError:
        raise ArchiveError(f"{where}: version {version!r:.80} is not a format version (1, 2, ...)") from None
    if version > VERSION:
        raise ArchiveError(f"{path} was written by a newer envlab (format version {version}; this one reads "
                           f"versions 1 to {VERSION}): upgrade envlab to import it")
    try:
        checked = Manifest.model_validate(manifest)
    except ValidationError as err:
        raise ArchiveError(f"{where}: {_shape_problem(err)}") from None
    run = checked.run
    if not RUN_UUID.fullmatch(run.uuid):
        raise ArchiveError(f"{where}: run uuid {run.uuid!r:.80} is not 32 hex digits: refused (it names the "
                           "run's folder under the runs root)")
    if ROOT not in checked.tables:
        raise ArchiveError(f"{where}: {_MANIFEST_SHAPES['tables']}")
    known = {t.name: t for t in run_tables()}
    if unknown := sorted(set(checked.tables) - set(known)):
        raise ArchiveError(f"{where}: tables this envlab does not know ({', '.join(unknown)[:200]}): "
                           "import it with a newer envlab")
    names = set(zf.namelist())
    for name, entry in checked.tables.items():
        _check_table(known[name], entry, names, where)
    paths = [c.path for c in checked.checkpoints]
    if len(set(paths)) != len(paths):
        raise ArchiveError(f"{where}: a checkpoint path is listed twice")
    for c in checked.checkpoints:
        _in_run_folder(c.path, run.uuid, f"{where}: checkpoint")
        if any(other.startswith(f"{c.path}/") for other in paths):
            raise ArchiveError(f"{where}: checkpoint {c.path!r:.120} lies inside another checkpoint")
        found = len(_members(zf, c.path))
        if c.files < 1:
            raise ArchiveError(f"{where}: checkpoint {c.path} lists {c.files} files: a checkpoint holds at "
                               "least one")
        if found != c.files:
            raise ArchiveError(f"{where}: checkpoint {c.path} should hold {c.files} files, the file has {found}")
    return manifest


def read_manifest(path: str | Path, limits: Limits | None = None) -> dict[str, Any]:
    """What a run archive holds (its checked manifest: the run, row counts per table, checkpoints), to show
    before importing it. Raises `ArchiveError` for a file that is not one this envlab can import."""
    with _open(Path(path), limits) as reader:
        return _check_manifest(reader)


def _members(zf: zipfile.ZipFile, stored: str) -> list[tuple[zipfile.ZipInfo, PurePosixPath]]:
    """The files of one checkpoint folder in the archive, each with its path inside that folder."""
    prefix = f"checkpoints/{stored}/"
    out = []
    for info in zf.infolist():
        if info.filename.startswith(prefix) and not info.is_dir():
            rel = _stored_path(info.filename[len(prefix):], "archive member")
            if info.external_attr >> 16 & 0o170000 == 0o120000:  # a symbolic link: never written as one
                raise ArchiveError(f"archive member {info.filename!r} is a symbolic link: refused")
            out.append((info, rel))
    return out


# --- what a row may hold -------------------------------------------------------------------------------------


def _model_classes() -> dict[str, type[SQLModel]]:
    """Each table's SQLModel class, by table name (the classes are the one description of a row's types)."""
    found: dict[str, type[SQLModel]] = {}
    todo = list(SQLModel.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if isinstance(getattr(cls, "__table__", None), Table):
            found[cls.__table__.name] = cls
    return found


def _validated(model: type[BaseModel], value: Any) -> Any:
    """`value` as it is, once `model` accepts it; else a ValueError with the first problem, in one line."""
    try:
        model.model_validate(value)
    except ValidationError as err:
        e = err.errors(include_url=False)[0]
        where = ".".join(map(str, e["loc"]))
        raise ValueError(f"not a valid {model.__name__}: {where + ': ' if where else ''}"
                         f"{e['msg'].removeprefix('Value error, ').splitlines()[0]}") from None
    return value


def _env_config(value: Any) -> Any:
    from envsim.config import EnvConfig

    return _validated(EnvConfig, value)


def _instance(value: Any) -> Any:
    from envsim.instance import Instance

    return _validated(Instance, value)


def _run_settings(value: Any) -> Any:
    from lab.settings import RunSettings

    return _validated(RunSettings, value)


def _run_uuid(value: str) -> str:
    if not RUN_UUID.fullmatch(value):
        raise ValueError("is not 32 hex digits (it names the run's folder under the runs root)")
    return value


def _bounded(column: str) -> tuple[Any, Callable[[str], str]]:
    """A person's text (`lab.text`'s bounds: a name, a description, a note), refused when longer than the lab
    lets a person type it."""
    from lab.text import NAME_LIMIT, TEXT_LIMIT, too_long

    limit = NAME_LIMIT if column in ("name", "user") else TEXT_LIMIT

    def check(value: str) -> str:
        if (why := too_long(column, value, limit)) is not None:
            raise ValueError(why)
        return value
    return str, check


# Beyond a column's type: what the lab reads the value as. One table's column -> a check that raises ValueError.
VALUE_CHECKS: dict[tuple[str, str], tuple[Any, Callable[[Any], Any]]] = {
    ("runs", "name"): _bounded("name"),
    ("runs", "description"): _bounded("description"),
    ("decisions", "note"): _bounded("note"),
    ("decisions", "user"): _bounded("user"),
    ("runs", "uuid"): (str, _run_uuid),
    ("runs", "settings"): (dict[str, Any], _run_settings),
    ("stages", "config"): (dict[str, Any], _env_config),
    ("proposals", "projected_config"): (dict[str, Any] | None, lambda v: v if v is None else _env_config(v)),
    ("decisions", "config"): (dict[str, Any] | None, lambda v: v if v is None else _env_config(v)),
    ("episodes", "instance"): (dict[str, Any], _instance),
}


def _annotation(table: Table, name: str, models: dict[str, type[SQLModel]]) -> Any:
    column = table.columns[name]
    optional = column.nullable or column.primary_key
    if (table.name, name) in VALUE_CHECKS:
        kind, check = VALUE_CHECKS[(table.name, name)]
        return Annotated[kind, AfterValidator(check)]
    if _is_datetime(column):
        return AwareDatetime | None if optional else AwareDatetime
    field = models[table.name].model_fields.get(name)
    kind = field.annotation if field is not None else Any
    return kind | None if optional else kind


@lru_cache(maxsize=64)
def _row_type(table_name: str, columns: tuple[str, ...]) -> TypeAdapter:
    """The type a row of `table_name` with these columns must have: every column present and of its model's
    type (strict: no "1" for 1, no 1 for true), enums by value, datetimes with their zone, no other key."""
    table = SQLModel.metadata.tables[table_name]
    models = _model_classes()
    row = TypedDict(f"{table_name}_row", {c: _annotation(table, c, models) for c in columns})  # type: ignore[misc]
    row.__pydantic_config__ = ConfigDict(strict=True, extra="forbid")  # type: ignore[attr-defined]
    return TypeAdapter(row)


def _rows(reader: _Reader, table: Table, entry: dict[str, Any], where: str) -> Iterator[tuple[int, int, dict]]:
    """(row number, bytes, row) of a table file, each row checked against its table's model."""
    adapter = _row_type(table.name, tuple(entry["columns"]))
    for n, line in reader.lines(f"tables/{table.name}.jsonl"):
        if n > entry["rows"]:  # refused at once: reading on could take as long as the file likes
            raise ArchiveError(f"{where} holds more rows than the manifest says ({entry['rows']})")
        if not line.strip():
            raise ArchiveError(f"{where} row {n} is empty (a table file holds one JSON object per line)")
        try:
            row = adapter.validate_json(line)
        except ValidationError as err:
            raise ArchiveError(f"{where} row {n}{_problem(err)}") from None
        yield n, len(line), row


def _problem(err: ValidationError) -> str:
    e = err.errors(include_url=False)[0]
    if e["type"] == "json_invalid":
        return f" is not JSON ({e['msg']})"
    if not e["loc"]:
        return f": {e['msg'].lower()} (a row is a JSON object, one key per column)"
    column, rest = e["loc"][0], ".".join(map(str, e["loc"][1:]))
    shown = json.dumps(e.get("input"), default=str)[:60]
    got = "" if e["type"] in ("missing", "extra_forbidden") else f" (got {shown})"
    msg = e["msg"].removeprefix("Value error, ")
    return f", column {column}{'.' + rest if rest else ''}: {msg}{got}"


# --- import --------------------------------------------------------------------------------------------------


def _refuse_duplicate(engine: Engine, run: dict[str, Any]) -> None:
    with engine.connect() as connection:
        found = connection.execute(select(Run.id).where(Run.uuid == run["uuid"])).scalar()
    if found is not None:
        raise ArchiveError(f"run {run['uuid']} ({run['name']}) is already in this database as run #{found}")


class _Rows:
    """Turns a table's checked rows into rows of this database: ids mapped (`ids`: per table, the file's id ->
    the new one), the detached ones left empty."""

    def __init__(self, table: Table, ids: dict[str, dict[int, int]], where: str):
        self.table, self.ids, self.where = table, ids, where
        self.pk = _pk(table).name
        self.fks = {fk.parent.name: fk.column.table.name for fk in _links(table)}
        self.detached = {column for name, column in DETACHED if name == table.name}
        self.json_ids = {column: keys for (name, column), keys in JSON_IDS.items() if name == table.name}

    def _id(self, parent: str, old: Any, n: int, column: str) -> int:
        new = self.ids[parent].get(old) if isinstance(old, int) and not isinstance(old, bool) else None
        if new is None:
            raise ArchiveError(f"{self.where} row {n}: {column} = {old!r:.40} names no {parent} row of this archive")
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
            elif isinstance(value, dict) and name in self.json_ids:
                value = {k: self._id(self.json_ids[name][k], v, n, f"{name}.{k}")
                         if k in self.json_ids[name] and v is not None else v for k, v in value.items()}
            out[name] = value
        return out


# The engineer backends a run from another lab may name: models this lab picks itself (the run's own checkpoint,
# the offline Gemma) or a model name for this machine's own server. `hf:<path or name>` would load whatever the
# file names, from this machine's disk.
ARCHIVE_BACKENDS = ("hf:policy", "hf:gemma3-270m", "openai:")


def _foreign_run(row: dict[str, Any], where: str) -> list[str]:
    """A network destination or a model spec is never taken from another lab: a run's engineer backend must be one
    of `ARCHIVE_BACKENDS` (else the file is refused), and its server URL is dropped on import (this machine's
    own server serves it, `lab.llm.allowed_servers`). Returns what the import drops, each in a few words."""
    backend = row.get("engineer_backend") or ""
    if backend and not (backend in ARCHIVE_BACKENDS[:-1] or
                        backend.startswith(ARCHIVE_BACKENDS[-1]) and len(backend) > len(ARCHIVE_BACKENDS[-1])):
        raise ArchiveError(f"{where}, column engineer_backend: {backend!r:.120} names a model this lab does not "
                           f"take from an archive (only {', '.join(ARCHIVE_BACKENDS)}<model>): refused")
    url = (row.get("settings") or {}).get("base_url")
    return [f"the run's server URL {url!r:.120} (an archive names no server: this lab uses its own)"] if url else []


# A model name as `training.policy.load_policy` loads it by name (a hub name such as Qwen/Qwen3-4B): one optional
# owner, no leading dot, no "..", no third part (those it loads as a folder).
MODEL_NAME = re.compile(r"(?!.*\.\.)[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?", re.ASCII)


def _check_policy(value: str, root: Path, where: str) -> None:
    """A run's policy (what its stages load and train) is never a folder the file chooses: it must be the lab's
    own `tiny` or `gemma3-270m`, a model name that is no folder here, or a folder inside this lab's runs root."""
    if value in ("tiny", GEMMA) or MODEL_NAME.fullmatch(value) and not Path(value).exists():
        return
    path = Path(value)
    try:
        if path.is_absolute() and path.is_relative_to(root):
            inside(root, str(path.relative_to(root)), "policy")
            return
    except ValueError:  # UnsafePath, or a name the file system cannot hold
        pass
    raise ArchiveError(f"{where}, column policy: {value!r:.120} is not a policy this lab takes from an archive "
                       f"(tiny, {GEMMA}, a model name such as Qwen/Qwen3-4B, or a folder inside this lab's runs "
                       "root): refused")


def _without_server(row: dict[str, Any]) -> dict[str, Any]:
    settings = row.get("settings")
    return {**row, "settings": {**settings, "base_url": None}} if settings and settings.get("base_url") else row


def _ended(row: dict[str, Any]) -> dict[str, Any]:
    """A job arrives ended and at the lowest priority: a queued or running job belongs to the workers of the lab
    that wrote the file (and a file can say anything), so none is claimed here, and none jumps this lab's queue
    when it is requeued. A status the file leaves out is the column's default, queued."""
    status, error = row.get("status", JobStatus.QUEUED), row.get("error")
    if status in ACTIVE_JOB:
        note = f"was {status} in the archive: imported as cancelled"
        status, error = JobStatus.CANCELLED, f"{error}\n{note}" if error else note
    return {**row, "status": status, "error": error, "priority": Priority.BACKGROUND}


def _as_imported(table: str, row: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """What an import changes in a row beyond its ids: the run's server URL goes (`_foreign_run`), every job
    arrives ended (`_ended`), and stage 0's checkpoint becomes the run's policy (checked by `_check_policy`): the
    file's value is the folder the source machine loaded that policy from (`training.stage.checkpoint_path`),
    which stage 1 and a benchmark of stage 0 would load here."""
    if table == ROOT:
        return _without_server(row)
    if table == Job.__tablename__:
        return _ended(row)
    if table == Stage.__tablename__ and row["index"] == 0 and row.get("checkpoint") is not None:
        return {**row, "checkpoint": run["policy"]}
    return row


def _vouch(reader: _Reader, manifest: dict[str, Any], root: Path) -> tuple[dict[str, Any], list[str]]:
    """Read every row of the archive once, storing nothing, and refuse it at the first row that does not fit:
    a wrong type, a foreign key to no row of the file, a repeated id, a run that is not the manifest's, a
    trained stage's checkpoint outside the run's folder, a listed checkpoint no stage names, a model spec this
    lab does not take from a file (`root`: this lab's runs root). Returns the run's row and what the import will
    drop (`_foreign_run`)."""
    path, run = reader.path, manifest["run"]
    stored_run: dict[str, Any] = {}
    dropped: list[str] = []
    ids: dict[str, dict[int, int]] = {}
    checkpoints: dict[str, int] = {}
    for table in run_tables():
        seen = ids[table.name] = {}
        entry = manifest["tables"].get(table.name)
        if entry is None:
            continue
        where = f"{path}: tables/{table.name}.jsonl"
        rows = _Rows(table, ids, where)
        pk = rows.pk
        if pk not in entry["columns"]:
            raise ArchiveError(f"{where}: the manifest lists no {pk} column (the ids that link its rows)")
        for n, _, row in _rows(reader, table, entry, where):
            old = row[pk]
            if not _is_id(old) or old in seen:
                raise ArchiveError(f"{where} row {n}, column {pk}: {old!r} is " +
                                   ("not an id" if not _is_id(old) else "the id of an earlier row"))
            rows.convert(row, n)  # every foreign key names a row of the file
            seen[old] = old
            if table.name == ROOT and (old != run["id"] or row.get("uuid") != run["uuid"]):
                raise ArchiveError(f"{where} row {n}: run {old} ({row.get('uuid')}) is not the manifest's run "
                                   f"{run['id']} ({run['uuid']})")
            if table.name == ROOT:
                dropped += _foreign_run(row, f"{where} row {n}")
                _check_policy(row["policy"], root, f"{where} row {n}")
                stored_run = row
            if table.name == Stage.__tablename__ and row.get("index", 0) > 0 and row.get("checkpoint") is not None:
                _in_run_folder(row["checkpoint"], run["uuid"], f"{where} row {n}, column checkpoint:")
                checkpoints[row["checkpoint"]] = row["index"]
        if len(seen) != entry["rows"]:
            raise ArchiveError(f"{where} holds {len(seen)} rows, the manifest says {entry['rows']}")
    if list(ids[ROOT]) != [run["id"]]:
        raise ArchiveError(f"{path}: tables/{ROOT}.jsonl should hold exactly run {run['id']}")
    for c in manifest["checkpoints"]:
        if checkpoints.get(c["path"]) != c["stage_index"]:
            raise ArchiveError(f"{path}: {MANIFEST}: checkpoint {c['path']} is not the checkpoint of stage "
                               f"{c['stage_index']} in tables/stages.jsonl: refused")
    return stored_run, dropped


def _insert_rows(connection: Connection, reader: _Reader, manifest: dict[str, Any], run: dict[str, Any]) -> int:
    """Insert every row of the archive (one transaction, the caller's), as `_as_imported` changes it (`run`: the
    run's row, as `_vouch` checked it), and return the new run id."""
    path = reader.path
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
            for batch in _batches(_rows(reader, table, entry, where)):
                values = [rows.convert(_as_imported(table.name, row, run), n) for n, _, row in batch]
                try:
                    new = connection.execute(insert, values).scalars().all()
                except SQLAlchemyError as err:
                    if isinstance(err, IntegrityError) and table.name == ROOT:
                        raise  # the run's uuid taken meanwhile, most likely: import_run says by whom
                    raise ArchiveError(f"{where}: rows {batch[0][0]}..{batch[-1][0]} do not fit this database "
                                       f"({str(getattr(err, 'orig', err)).splitlines()[0]})") from None
                mapping.update(zip((row[pk.name] for _, _, row in batch), new, strict=True))
                bar.update(len(batch))
            if len(mapping) != entry["rows"]:
                raise ArchiveError(f"{where} holds {len(mapping)} rows, the manifest says {entry['rows']}")
    return ids[ROOT][manifest["run"]["id"]]


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


def _batches(rows: Iterator[tuple[int, int, dict]], n: int = BATCH_ROWS,
             size: int = BATCH_BYTES) -> Iterator[list[tuple[int, int, dict]]]:
    """Rows in batches of at most `n` rows and about `size` bytes of JSON, so a batch of long rows stays small."""
    batch: list[tuple[int, int, dict]] = []
    held = 0
    for row in rows:
        batch.append(row)
        held += row[1]
        if len(batch) >= n or held >= size:
            yield batch
            batch, held = [], 0
    if batch:
        yield batch


def _unpack(reader: _Reader, manifest: dict[str, Any], root: Path, created: list[Path]) -> tuple[Path, list[str]]:
    """Unpack the checkpoints this database lacks into a scratch folder under `root`; returns it and their paths.

    A folder already in place with the very same files (a runs root the two labs share) is kept as it is;
    one with other files is refused before anything is written.
    """
    zf = reader.zf
    todo = []
    for c in manifest["checkpoints"]:
        dest = _inside(root, c["path"])
        if dest.exists():
            if not _same_files(zf, c["path"], dest):
                raise ArchiveError(f"{dest} exists already with other files: move it away, or import into a "
                                   "database with another runs root (ENVLAB_RUNS)")
            continue
        todo.append(c["path"])
    members = {stored: _members(zf, stored) for stored in todo}
    total = reader.room([info for m in members.values() for info, _ in m], root)
    _makedirs(root, created)
    scratch = Path(tempfile.mkdtemp(prefix=".import-", dir=root))
    try:
        with tqdm(total=total, desc="checkpoints", unit="B", unit_scale=True, disable=None) as bar:
            for i, stored in enumerate(todo):
                for info, rel in members[stored]:
                    target = _inside(scratch / str(i), rel.as_posix())
                    target.parent.mkdir(parents=True, exist_ok=True)
                    bar.update(reader.copy(info, target))  # zipfile checks the CRC-32 at the end
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)  # the caller never saw it: it is this function's to remove
        raise
    return scratch, todo


def _existing(path: Path) -> Path:
    """`path`, or its nearest parent that exists (the disk a folder not yet made will be on)."""
    return next(p for p in (path, *path.parents) if p.exists())


def _inside(root: Path, relative: str) -> Path:
    try:
        return inside(root, relative, "checkpoint path")
    except UnsafePath as err:
        raise ArchiveError(str(err)) from None


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


@dataclass(frozen=True)
class Imported:
    """An imported run: its new id, and what the import left out of it (each in a few words)."""

    run_id: int
    dropped: tuple[str, ...] = ()

    def note(self) -> str:
        """What was dropped, as the end of a sentence ("" when nothing was)."""
        return f"; dropped: {'; '.join(self.dropped)}" if self.dropped else ""


def import_run(engine: Engine, path: str | Path, limits: Limits | None = None) -> int:
    """`import_archive`'s new run id."""
    return import_archive(engine, path, limits).run_id


def import_archive(engine: Engine, path: str | Path, limits: Limits | None = None) -> Imported:
    """Load a run archive into this database with new ids, and its checkpoints under this database's runs root;
    return the new run id and what was left out (a server URL: `_foreign_run`).

    Everything in the file is checked before anything is stored (docs/archive.md, "What import trusts"): the
    manifest, every row against its table's model, every path against the run's own folder, and every member's
    inflated size against `limits` (default `Limits.from_env()`). Raises `ArchiveError` (and changes nothing:
    no row, no folder) for a file that fails any check, one written by a newer envlab, or a run this database
    holds already (same uuid).
    """
    path = Path(path)
    with _open(path, limits) as reader:
        manifest = _check_manifest(reader)
        _refuse_duplicate(engine, manifest["run"])
        root = runs_root(engine)
        run, dropped = _vouch(reader, manifest, root)
        try:
            run_folder(engine, manifest["run"]["uuid"])
        except UnsafePath as err:
            raise ArchiveError(f"{path}: {err}") from None
        created: list[Path] = []
        placed: list[Path] = []
        scratch, todo = None, []
        try:
            if manifest["checkpoints"]:
                scratch, todo = _unpack(reader, manifest, root, created)
            with engine.begin() as connection:
                run_id = _insert_rows(connection, reader, manifest, run)
                for i, stored in enumerate(todo):  # into place just before the commit; removed if it fails
                    dest = _inside(root, stored)
                    _makedirs(dest.parent, created)
                    (scratch / str(i)).rename(dest)
                    placed.append(dest)
        except BaseException as err:
            _undo(placed, scratch, created)
            if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
                raise ArchiveError(f"{path}: the disk of {root} filled up while the checkpoints were written "
                                   f"({err.strerror}): nothing was imported; free some space and import again"
                                   ) from None
            if isinstance(err, IntegrityError):
                _refuse_duplicate(engine, manifest["run"])  # someone imported it meanwhile
                raise ArchiveError(f"{path}: the rows do not fit this database ({err.orig})") from None
            raise
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return Imported(run_id, tuple(dropped))
