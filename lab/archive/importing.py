"""Loading a run archive into this lab: new ids, checkpoints under this runs root, one transaction (docs/archive.md).

An import is one transaction: every row or none. Checkpoints are unpacked into a scratch folder under the
runs root first, moved into place just before the commit, and removed again if anything fails.
"""

from __future__ import annotations

import errno
import re
import shutil
import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, Table, select
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from tqdm import tqdm

from lab.archive.reading import (
    Limits,
    Reader,
    check_manifest,
    checked_rows,
    checkpoint_files,
    in_run_folder,
    is_id,
    open_archive,
)
from lab.archive.tables import (
    BATCH_BYTES,
    BATCH_ROWS,
    DETACHED,
    JSON_IDS,
    MANIFEST,
    ROOT,
    SETTINGS_LEFT_OUT,
    TINY_RENAMED,
    ArchiveError,
    links,
    primary_key,
    run_tables,
)
from lab.llm import shown_url
from storage.db import UnsafePath, inside, run_folder, runs_root
from storage.models import ACTIVE_JOB, Job, JobStatus, Priority, Run, Stage
from storage.settings import allowed_grpo, refused_grpo
from training.resolve import GEMMA, SHIPPED


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
        self.pk = primary_key(table).name
        self.fks = {fk.parent.name: fk.column.table.name for fk in links(table)}
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
    own server serves it, `lab.llm.allowed_servers`), as are the GRPO fields a run may not set
    (`storage.settings.refused_grpo`: a place to write or read, somewhere to send data, code to load). Returns what
    the import drops, each in a few words."""
    backend = row.get("engineer_backend") or ""
    if backend and not (backend in ARCHIVE_BACKENDS[:-1] or
                        backend.startswith(ARCHIVE_BACKENDS[-1]) and len(backend) > len(ARCHIVE_BACKENDS[-1])):
        raise ArchiveError(f"{where}, column engineer_backend: {backend!r:.120} names a model this lab does not "
                           f"take from an archive (only {', '.join(ARCHIVE_BACKENDS)}<model>): refused")
    settings = row.get("settings") or {}
    refused = refused_grpo(settings.get("grpo") or {})
    dropped = [f"the run's GRPO {'field' if len(refused) == 1 else 'fields'} {', '.join(refused)} (a run from "
               "another lab sets only how its policy learns and samples)"] if refused else []
    if url := settings.get("base_url"):
        dropped.append(f"the run's server URL {shown_url(url)!r:.120} (an archive names no server: this lab uses its "
                       "own)")
    return dropped


# A model name as `training.policy.load_policy` loads it by name (a hub name such as Qwen/Qwen3-4B): one optional
# owner, no leading dot, no "..", no third part (those it loads as a folder).
MODEL_NAME = re.compile(r"(?!.*\.\.)[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?", re.ASCII)


def _check_policy(value: str, root: Path, where: str) -> None:
    """A run's policy (what its stages load and train) is never a folder the file chooses: it must be the lab's
    own `tiny`, `tiny-2agent` or `gemma3-270m`, a model name that is no folder here, or a folder inside this lab's
    runs root."""
    if value in SHIPPED or value == GEMMA or MODEL_NAME.fullmatch(value) and not Path(value).exists():
        return
    path = Path(value)
    try:
        if path.is_absolute() and path.is_relative_to(root):
            inside(root, str(path.relative_to(root)), "policy")
            return
    except ValueError:  # UnsafePath, or a name the file system cannot hold
        pass
    raise ArchiveError(f"{where}, column policy: {value!r:.120} is not a policy this lab takes from an archive "
                       f"(tiny, tiny-2agent, {GEMMA}, a model name such as Qwen/Qwen3-4B, or a folder inside this "
                       "lab's runs root): refused")


def _without_server(row: dict[str, Any]) -> dict[str, Any]:
    """A run's row without the server its settings name and the GRPO fields a run may not set (vouched for
    already: `lab.archive.reading`)."""
    if row.get("settings") is None:
        return row
    settings = row["settings"]
    return {**row, "settings": {**settings, "base_url": None, "grpo": allowed_grpo(settings.get("grpo") or {})}}


def _ended(row: dict[str, Any]) -> dict[str, Any]:
    """A job arrives ended and at the lowest priority: a queued or running job belongs to the workers of the lab
    that wrote the file (and a file can say anything), so none is claimed here, and none jumps this lab's queue
    when it is requeued. A status the file leaves out is the column's default, queued."""
    status, error = row.get("status", JobStatus.QUEUED), row.get("error")
    if status in ACTIVE_JOB:
        note = f"was {status} in the archive: imported as cancelled"
        status, error = JobStatus.CANCELLED, f"{error}\n{note}" if error else note
    return {**row, "status": status, "error": error, "priority": Priority.BACKGROUND}


def _read_as_now(row: dict[str, Any], version: int) -> dict[str, Any]:
    """The run's row as this envlab reads it: its policy named as this envlab names it (`TINY_RENAMED`: an earlier
    file's `tiny`), and the settings its version left out filled in as that version read them
    (`SETTINGS_LEFT_OUT`: an earlier file's run that names no validation agent counts was scored on 2)."""
    policy = TINY_RENAMED.get(version, {}).get(row.get("policy"))
    if policy is not None:
        row = {**row, "policy": policy}
    settings = row.get("settings")
    if isinstance(settings, dict) and (left_out := {k: v for k, v in SETTINGS_LEFT_OUT.get(version, {}).items()
                                                    if k not in settings}):
        row = {**row, "settings": {**settings, **left_out}}
    return row


def _as_imported(table: str, row: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """What an import changes in a row beyond its ids: the run's server URL goes (`_foreign_run`; the row is read
    as this envlab reads it already), every job arrives ended (`_ended`), and stage 0's checkpoint becomes the
    run's policy (checked by `_check_policy`): the file's value is the folder the source machine loaded that policy
    from (`training.stage.checkpoint_path`), which stage 1 and a benchmark of stage 0 would load here."""
    if table == ROOT:
        return _without_server(row)
    if table == Job.__tablename__:
        return _ended(row)
    if table == Stage.__tablename__ and row["index"] == 0 and row.get("checkpoint") is not None:
        return {**row, "checkpoint": run["policy"]}
    return row


@dataclass
class _Found:
    """What reading an archive's rows finds on the way: the run's row as this envlab reads it, what the import
    drops (`_foreign_run`), and each trained stage's checkpoint (its path -> the stage's index)."""

    run: dict[str, Any] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    checkpoints: dict[str, int] = field(default_factory=dict)


def _checked(reader: Reader, manifest: dict[str, Any], root: Path, table: Table, ids: dict[str, dict[int, int]],
             found: _Found) -> Iterator[tuple[int, int, dict[str, Any], dict[str, Any]]]:
    """A table file's rows, each refused at once where it does not fit: a wrong type, a repeated id, a foreign key
    to no row of the file (`ids`: per table read before, the file's id -> the id here), a run that is not the
    manifest's, a trained stage's checkpoint outside the run's folder, a model spec this lab does not take from a
    file (`root`: this lab's runs root); and the file refused at its end where it holds another count of rows than
    the manifest says. Yields (row number, bytes, the file's row, the row as this database stores it: `_as_imported`,
    its links mapped), and notes in `found` what it finds."""
    entry = manifest["tables"].get(table.name)
    if entry is None:  # a table this file's envlab did not have: it had no rows of it
        return
    path, run, version = reader.path, manifest["run"], manifest["version"]
    where = f"{path}: tables/{table.name}.jsonl"
    rows = _Rows(table, ids, where)
    pk = rows.pk
    if pk not in entry["columns"]:
        raise ArchiveError(f"{where}: the manifest lists no {pk} column (the ids that link its rows)")
    seen: set[int] = set()
    for n, size, row in checked_rows(reader, table, entry, where):
        old = row[pk]
        if not is_id(old) or old in seen:
            raise ArchiveError(f"{where} row {n}, column {pk}: {old!r} is " +
                               ("not an id" if not is_id(old) else "the id of an earlier row"))
        seen.add(old)
        if table.name == ROOT:
            if old != run["id"] or row.get("uuid") != run["uuid"]:
                raise ArchiveError(f"{where} row {n}: run {old} ({row.get('uuid')}) is not the manifest's run "
                                   f"{run['id']} ({run['uuid']})")
            row = _read_as_now(row, version)
            found.dropped += _foreign_run(row, f"{where} row {n}")
            _check_policy(row["policy"], root, f"{where} row {n}")
            found.run = row
        if table.name == Stage.__tablename__ and row.get("index", 0) > 0 and row.get("checkpoint") is not None:
            in_run_folder(row["checkpoint"], run["uuid"], f"{where} row {n}, column checkpoint:")
            found.checkpoints[row["checkpoint"]] = row["index"]
        yield n, size, row, rows.convert(_as_imported(table.name, row, found.run), n)  # every link names a row
    if len(seen) != entry["rows"]:
        raise ArchiveError(f"{where} holds {len(seen)} rows, the manifest says {entry['rows']}")


# What decides what an import writes to disk, read before it writes anything: the run's row (its policy) and the
# stages' (their checkpoints). Every table's rows are read once more as they are inserted, the largest only then.
FIRST_READ = (ROOT, Stage.__tablename__)


def _vouch(reader: Reader, manifest: dict[str, Any], root: Path) -> _Found:
    """Read the rows that decide what the import puts on disk (`FIRST_READ`), storing nothing, and refuse the file
    at the first that does not fit (`_checked`), where its run is not exactly the manifest's, or where a listed
    checkpoint is no stage's. Returns what it found: the run's row and what the import will drop."""
    path, run = reader.path, manifest["run"]
    found = _Found()
    ids: dict[str, dict[int, int]] = {}
    for table in run_tables():
        if table.name in FIRST_READ:
            pk = primary_key(table).name
            ids[table.name] = {row[pk]: row[pk] for _, _, row, _ in _checked(reader, manifest, root, table, ids, found)}
    if list(ids.get(ROOT, ())) != [run["id"]]:
        raise ArchiveError(f"{path}: tables/{ROOT}.jsonl should hold exactly run {run['id']}")
    for checkpoint in manifest["checkpoints"]:
        if found.checkpoints.get(checkpoint["path"]) != checkpoint["stage_index"]:
            raise ArchiveError(f"{path}: {MANIFEST}: checkpoint {checkpoint['path']} is not the checkpoint of stage "
                               f"{checkpoint['stage_index']} in tables/stages.jsonl: refused")
    return found


def _insert_rows(connection: Connection, reader: Reader, manifest: dict[str, Any], root: Path) -> int:
    """Insert every row of the archive (one transaction, the caller's), each checked as it is read (`_checked`: the
    first that does not fit refuses the file, and the caller's transaction stores none), and return the new run
    id."""
    ids: dict[str, dict[int, int]] = {}
    found = _Found()
    total = sum(entry["rows"] for entry in manifest["tables"].values())
    with tqdm(total=total, desc="rows", unit="row", disable=None) as bar:
        for table in run_tables():
            mapping = ids[table.name] = {}
            where = f"{reader.path}: tables/{table.name}.jsonl"
            pk = primary_key(table)
            insert = table.insert().returning(pk, sort_by_parameter_order=True)
            for batch in _batches(_checked(reader, manifest, root, table, ids, found)):
                try:
                    new = connection.execute(insert, [stored for _, _, _, stored in batch]).scalars().all()
                except SQLAlchemyError as err:
                    if isinstance(err, IntegrityError) and table.name == ROOT:
                        raise  # the run's uuid taken meanwhile, most likely: import_run says by whom
                    raise ArchiveError(f"{where}: rows {batch[0][0]}..{batch[-1][0]} do not fit this database "
                                       f"({str(getattr(err, 'orig', err)).splitlines()[0]})") from None
                mapping.update(zip((row[pk.name] for _, _, row, _ in batch), new, strict=True))
                bar.update(len(batch))
    return ids[ROOT][manifest["run"]["id"]]


def _makedirs(path: Path, created: list[Path]) -> None:
    """`mkdir -p`, noting each folder it made, so a failed import can remove exactly those."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for p in reversed(missing):
        p.mkdir()
        created.append(p)


def _same_files(zf: zipfile.ZipFile, stored: str, folder: Path) -> bool:
    """Whether `folder` holds exactly the checkpoint's files (same names, sizes and CRC-32)."""
    members = {rel.as_posix(): info for info, rel in checkpoint_files(zf, stored)}
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


def _batches(rows: Iterator[tuple[int, int, dict, dict]], n: int = BATCH_ROWS,
             size: int = BATCH_BYTES) -> Iterator[list[tuple[int, int, dict, dict]]]:
    """Rows in batches of at most `n` rows and about `size` bytes of JSON, so a batch of long rows stays small."""
    batch: list[tuple[int, int, dict, dict]] = []
    held = 0
    for row in rows:
        batch.append(row)
        held += row[1]
        if len(batch) >= n or held >= size:
            yield batch
            batch, held = [], 0
    if batch:
        yield batch


def _unpack(reader: Reader, manifest: dict[str, Any], root: Path, created: list[Path]) -> tuple[Path, list[str]]:
    """Unpack the checkpoints this database lacks into a scratch folder under `root`; returns it and their paths.

    A folder already in place with the very same files (a runs root the two labs share) is kept as it is;
    one with other files is refused before anything is written.
    """
    zf = reader.zf
    todo = []
    for checkpoint in manifest["checkpoints"]:
        dest = _inside(root, checkpoint["path"])
        if dest.exists():
            if not _same_files(zf, checkpoint["path"], dest):
                raise ArchiveError(f"{dest} exists already with other files: move it away, or import into a "
                                   "database with another runs root (ENVLAB_RUNS)")
            continue
        todo.append(checkpoint["path"])
    members = {stored: checkpoint_files(zf, stored) for stored in todo}
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
    with open_archive(path, limits) as reader:
        manifest = check_manifest(reader)
        _refuse_duplicate(engine, manifest["run"])
        root = runs_root(engine)
        found = _vouch(reader, manifest, root)
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
                run_id = _insert_rows(connection, reader, manifest, root)
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
    return Imported(run_id, tuple(found.dropped))
