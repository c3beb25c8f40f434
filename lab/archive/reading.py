"""Reading a run archive that comes from someone else: the file's layout, its manifest and every row, checked.

An archive comes from someone else: nothing in it is trusted until it is checked, and everything is checked
before anything is stored (docs/archive.md, "What import trusts"). Members are read as streams and their
bytes counted as they inflate (the sizes a zip's directory declares can lie); tables are read line by line,
each row checked against its table's model and what the lab reads the value as.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
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
from sqlalchemy import Column, DateTime, Table, TypeDecorator
from sqlmodel import SQLModel
from typing_extensions import TypedDict

from lab.archive.tables import FORMAT, MANIFEST, ROOT, VERSION, ArchiveError, run_tables, stored_path
from storage.db import RUN_UUID

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


def _existing(path: Path) -> Path:
    """`path`, or its nearest parent that exists (the disk a folder not yet made will be on)."""
    return next(p for p in (path, *path.parents) if p.exists())


_DAMAGE = (zipfile.BadZipFile, EOFError, zlib.error, zipfile.LargeZipFile, NotImplementedError, RuntimeError,
           OSError, ValueError)


class Reader:
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
def open_archive(path: Path, limits: Limits | None = None) -> Iterator[Reader]:
    try:
        zf = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise ArchiveError(f"{path}: no such file") from None
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as err:
        raise ArchiveError(f"{path}: not a run archive: it is not a zip file, or it is truncated ({err})") from None
    with zf:
        try:
            _check_layout(zf, path)
            yield Reader(zf, path, limits or Limits.from_env())
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


def is_id(value: Any) -> bool:
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


def in_run_folder(path: str, uuid: str, what: str) -> PurePosixPath:
    """A checkpoint path, refused unless it is a plain relative path inside the run's own folder (`<uuid>/...`):
    the one rule for the manifest's checkpoints and the stage rows' `checkpoint`."""
    stored = stored_path(path, what)
    if stored.parts[0] != uuid or len(stored.parts) < 2:
        raise ArchiveError(f"{what} {path!r:.120} is not inside the run's own folder ({uuid}/...): refused")
    return stored


def _check_table(table: Table, entry: TableEntry, names: set[str], where: str) -> None:
    if len(set(entry.columns)) != len(entry.columns):
        raise ArchiveError(f"{where}: tables.{table.name}.columns names a column twice")
    columns = {column.name: column for column in table.columns}
    if unknown := [column for column in entry.columns if column not in columns]:
        raise ArchiveError(f"{where}: table {table.name} has columns this envlab does not know "
                           f"({', '.join(map(str, unknown))}): import it with a newer envlab")
    needed = [column.name for column in table.columns if column.name not in entry.columns and not column.nullable
              and column.default is None and column.server_default is None]
    if needed:
        raise ArchiveError(f"{where}: table {table.name} lacks columns this database needs ({', '.join(needed)})")
    if f"tables/{table.name}.jsonl" not in names:
        raise ArchiveError(f"{where}: tables/{table.name}.jsonl is missing")


def check_manifest(reader: Reader) -> dict[str, Any]:
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
    paths = [checkpoint.path for checkpoint in checked.checkpoints]
    if len(set(paths)) != len(paths):
        raise ArchiveError(f"{where}: a checkpoint path is listed twice")
    for checkpoint in checked.checkpoints:
        in_run_folder(checkpoint.path, run.uuid, f"{where}: checkpoint")
        if any(other.startswith(f"{checkpoint.path}/") for other in paths):
            raise ArchiveError(f"{where}: checkpoint {checkpoint.path!r:.120} lies inside another checkpoint")
        found = len(checkpoint_files(zf, checkpoint.path))
        if checkpoint.files < 1:
            raise ArchiveError(f"{where}: checkpoint {checkpoint.path} lists {checkpoint.files} files: a checkpoint "
                               "holds at least one")
        if found != checkpoint.files:
            raise ArchiveError(f"{where}: checkpoint {checkpoint.path} should hold {checkpoint.files} files, the file "
                               f"has {found}")
    return manifest


def read_manifest(path: str | Path, limits: Limits | None = None) -> dict[str, Any]:
    """What a run archive holds (its checked manifest: the run, row counts per table, checkpoints), to show
    before importing it. Raises `ArchiveError` for a file that is not one this envlab can import."""
    with open_archive(Path(path), limits) as reader:
        return check_manifest(reader)


def checkpoint_files(zf: zipfile.ZipFile, stored: str) -> list[tuple[zipfile.ZipInfo, PurePosixPath]]:
    """The files of one checkpoint folder in the archive, each with its path inside that folder."""
    prefix = f"checkpoints/{stored}/"
    out = []
    for info in zf.infolist():
        if info.filename.startswith(prefix) and not info.is_dir():
            rel = stored_path(info.filename[len(prefix):], "archive member")
            if info.external_attr >> 16 & 0o170000 == 0o120000:  # a symbolic link: never written as one
                raise ArchiveError(f"archive member {info.filename!r} is a symbolic link: refused")
            out.append((info, rel))
    return out


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
    """A run's settings, checked as this lab checks its own but for the GRPO fields a run may not set: those are
    dropped on import (`lab.archive.importing`), and said, rather than refused."""
    from storage.settings import RunSettings, allowed_grpo

    grpo = value.get("grpo")
    _validated(RunSettings, {**value, "grpo": allowed_grpo(grpo)} if isinstance(grpo, dict) else value)
    return value


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


def _clipped(value: str) -> str:
    """An engineer's text (prompt, answer, rationale), cut as the lab stores its own (`lab.text.clipped`)."""
    from lab.text import clipped

    return clipped(value)


# Beyond a column's type: what the lab reads the value as. One table's column -> a check that raises ValueError.
VALUE_CHECKS: dict[tuple[str, str], tuple[Any, Callable[[Any], Any]]] = {
    ("runs", "name"): _bounded("name"),
    ("runs", "description"): _bounded("description"),
    ("decisions", "note"): _bounded("note"),
    ("decisions", "user"): _bounded("user"),
    ("proposals", "prompt"): (str, _clipped),
    ("proposals", "raw_answer"): (str, _clipped),
    ("proposals", "rationale"): (str, _clipped),
    ("runs", "uuid"): (str, _run_uuid),
    ("runs", "settings"): (dict[str, Any], _run_settings),
    ("stages", "config"): (dict[str, Any], _env_config),
    ("proposals", "projected_config"): (dict[str, Any] | None, lambda v: v if v is None else _env_config(v)),
    ("decisions", "config"): (dict[str, Any] | None, lambda v: v if v is None else _env_config(v)),
    ("episodes", "instance"): (dict[str, Any], _instance),
}


def _is_datetime(column: Column) -> bool:
    kind = column.type.impl_instance if isinstance(column.type, TypeDecorator) else column.type
    return isinstance(kind, DateTime)


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
    row = TypedDict(f"{table_name}_row", {column: _annotation(table, column, models) for column in columns})  # type: ignore[misc]
    row.__pydantic_config__ = ConfigDict(strict=True, extra="forbid")  # type: ignore[attr-defined]
    return TypeAdapter(row)


def checked_rows(reader: Reader, table: Table, entry: dict[str, Any], where: str) -> Iterator[tuple[int, int, dict]]:
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
