"""One engine, one session helper, and the Alembic upgrade the lab runs when it starts.

The database is one setting: `ENVLAB_DB`, a file path (SQLite) or a full SQLAlchemy URL such as
`postgresql+psycopg://user@host/envlab` for a lab shared by several people or worker machines.
Without it the lab uses `runs/envlab.db` under the working directory.

A SQLite file is shared by the web page and a worker process, so each connection turns on WAL
(readers do not block the writer), foreign keys (off by default in SQLite) and a busy timeout
(a writer waits for the other writer instead of failing at once).

Schema changes go through the migrations in `storage/migrations`; nothing calls `create_all`.
Nothing in the lab updates a decision row in place or deletes any row but the training logs of a dead
stage attempt past the checkpoint its successor resumes from: the tables are the audit trail.
"""

from __future__ import annotations

import errno
import os
import re
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import ExceptionContext, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlmodel import Session, select

from storage.models import Run, Stage

DB_SETTING = "ENVLAB_DB"
RUNS_SETTING = "ENVLAB_RUNS"
DEFAULT_DB_PATH = "runs/envlab.db"
BUSY_TIMEOUT_MS = 30_000
MIGRATIONS = Path(__file__).parent / "migrations"
# Any constant shared by every process that migrates: PostgreSQL's advisory lock key.
_MIGRATION_LOCK_KEY = 0x656E766C6162
PRIVATE_UMASK = 0o077  # what the lab's processes make (database, run folders, checkpoints, exports): theirs alone


def keep_private() -> None:
    """Make every file and folder this process (and each process it starts) creates from now on readable by its user
    only: a lab's database, run folders and exports hold its runs, its people's notes and names. Called once at each
    entry point (`envlab ...`, the page, a Slurm worker)."""
    os.umask(PRIVATE_UMASK)


def database_url(setting: str | None = None) -> str:
    """The SQLAlchemy URL for `setting`, else `$ENVLAB_DB`, else `runs/envlab.db`.

    A value without "://" is a SQLite file path; its folder is created so a fresh checkout starts.
    """
    value = setting or os.environ.get(DB_SETTING) or DEFAULT_DB_PATH
    if "://" in value:
        return value
    path = Path(value).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    _use_wal(cursor)
    cursor.execute("PRAGMA synchronous=NORMAL")  # WAL's own advice: a sync per checkpoint, not per commit
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _use_wal(cursor: sqlite3.Cursor) -> None:
    # WAL is a property of the file, so only its first connection switches it. The switch needs an
    # exclusive lock, and SQLite answers at once (an error, or the old mode) rather than wait for it:
    # when two processes open a new file together, the one that loses retries.
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            mode = cursor.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode in ("wal", "memory"):  # an in-memory database has no journal file to switch
                return
        except sqlite3.OperationalError:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise sqlite3.OperationalError(f"could not switch the database to WAL; it stays in {mode} mode")
        time.sleep(0.05)


def runs_root(engine: Engine) -> Path:
    """The folder every stored file path of this database is relative to (`$ENVLAB_RUNS`, else the SQLite
    file's folder, else `./runs` for a server database), absolute.

    A run's files live in `<runs root>/<run uuid>/`, so any worker, started in any folder or on any machine
    that sees this folder at the same place, finds them, and two databases never share a run's folder.
    """
    if value := os.environ.get(RUNS_SETTING):
        return Path(value).expanduser().resolve()
    url = engine.url
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        return Path(url.database).expanduser().resolve().parent
    return Path("runs").resolve()


class RunsRootUnusable(RuntimeError):
    """The runs root cannot be written where the setting points; the message is one line."""


def usable_runs_root(engine: Engine) -> Path:
    """The runs root, created when missing and checked writable: a worker refuses to start without it, since
    every job it runs writes there (on a cluster: a folder every node sees at the same path)."""
    root = runs_root(engine)
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".envlab-write-check-"):
            pass
    except OSError as err:
        raise RunsRootUnusable(f"runs root {str(root)!r} (${RUNS_SETTING}) cannot be used: "
                               f"{err.strerror or type(err).__name__}") from None
    return root


RUN_UUID = re.compile(r"[0-9a-f]{32}")


class UnsafePath(ValueError):
    """A stored name would put a run's files outside its own folder under the runs root; nothing was written."""


def inside(root: Path, relative: str, what: str) -> Path:
    """`root / relative`, refused unless it resolves (symbolic links followed) to a path inside `root`.

    Every folder made from stored data goes through here: a row can come from another lab's archive, and an
    older version's import did not check it.
    """
    root = root.resolve()
    path = (root / relative).resolve()
    if Path(relative).is_absolute() or path == root or not path.is_relative_to(root):
        raise UnsafePath(f"{what} {relative!r} does not stay inside {root}")
    return path


def run_folder(engine: Engine, uuid: str) -> Path:
    """`<runs root>/<run uuid>`, the one folder a run's files live in; a uuid that is not 32 hex digits (the
    only kind `storage.models.new_uuid` makes) is refused, so no run's folder can be anywhere else."""
    if not isinstance(uuid, str) or not RUN_UUID.fullmatch(uuid):
        raise UnsafePath(f"run uuid {uuid!r} is not 32 hex digits: its folder would not be <runs root>/<uuid>")
    return inside(runs_root(engine), uuid, "run folder")


def checkpoint_of(engine: Engine, stage: Stage) -> str | None:
    """Where a stage's policy is: stage 0 keeps the run's policy spec as it is ("tiny", a model name, an
    absolute folder); a trained stage's folder is stored relative to the runs root and resolved here, refused
    (`UnsafePath`) when it would lead out of the runs root."""
    if stage.checkpoint is None or stage.index == 0:
        return stage.checkpoint
    return str(inside(runs_root(engine), stage.checkpoint, f"stage {stage.index}'s checkpoint"))


def stage_at(s: Session, run_id: int, index: int) -> Stage | None:
    """Run `run_id`'s stage `index`, or None when the run has no such stage."""
    return s.exec(select(Stage).where(Stage.run_id == run_id, Stage.index == index)).first()


def lock_run(s: Session, run_id: int) -> Run | None:
    """Take run `run_id`'s row lock for the rest of the session's transaction and return the run.

    Whoever holds it may read a run's state and write what comes next without another process doing the
    same in between. PostgreSQL locks the row (`SELECT ... FOR UPDATE`); SQLite has one lock for the whole
    file and takes it now (`BEGIN IMMEDIATE`), so this must come before any write in the transaction.
    """
    connection = s.connection()
    if connection.dialect.name == "sqlite":
        if not connection.connection.dbapi_connection.in_transaction:
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        return s.get(Run, run_id, populate_existing=True)
    return s.exec(select(Run).where(Run.id == run_id).with_for_update()).first()


class DatabaseFull(OSError):
    """The database could not write because its disk is full (SQLite's SQLITE_FULL, PostgreSQL's disk_full): an
    OSError of errno ENOSPC, so whatever says a full disk plainly (the command line, the worker) says this one too,
    and its message is one line naming the database, without the statement or its parameters."""

    def __str__(self) -> str:
        return (f"the disk is full: the database {self.filename} could not be written ({self.strerror}); free some "
                "space: what was written before is kept")


class DatabaseDamaged(RuntimeError):
    """The database file is no database, or its pages are damaged (SQLite's SQLITE_NOTADB and SQLITE_CORRUPT,
    PostgreSQL's data_corrupted); the message is one line naming the file."""


_FULL = {13: "SQLITE_FULL", "53100": "disk_full"}  # SQLite's result codes and PostgreSQL's SQLSTATEs
_DAMAGED = {11: "SQLITE_CORRUPT", 26: "SQLITE_NOTADB", "XX001": "data_corrupted", "XX002": "index_corrupted"}


def _plain_errors(context: ExceptionContext) -> None:
    """SQLAlchemy's `handle_error` hook: a full disk or a damaged file becomes `DatabaseFull` or `DatabaseDamaged`,
    whichever statement met it, so the page, the worker and the command line show one plain line, never the SQL,
    its parameters and SQLAlchemy's link."""
    err = context.original_exception
    code = getattr(err, "sqlite_errorcode", None) or getattr(err, "sqlstate", None)
    if code not in _FULL and code not in _DAMAGED:
        return
    engine = context.engine
    url = engine.url if engine is not None else None
    where = (url.database if url is not None and url.get_backend_name() == "sqlite"
             else url.render_as_string(hide_password=True) if url is not None else "?")
    reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
    if code in _FULL:
        raise DatabaseFull(errno.ENOSPC, reason, where) from None
    raise DatabaseDamaged(f"the database file {where} is damaged ({reason}): restore it from a copy, or start the "
                          "lab on another file (--db, $ENVLAB_DB)") from None


def make_engine(url: str | None = None) -> Engine:
    """The engine for a URL or SQLite path (default: the `ENVLAB_DB` setting); make one per process. A full disk
    or a damaged file raises `DatabaseFull` or `DatabaseDamaged` from any statement."""
    url = database_url(url)
    if make_url(url).get_backend_name() != "sqlite":
        engine = create_engine(url, pool_pre_ping=True)
    else:
        # Connections move between threads through the pool (a web server's request threads).
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": BUSY_TIMEOUT_MS / 1000})
        event.listen(engine, "connect", _sqlite_pragmas)
    event.listen(engine, "handle_error", _plain_errors)
    return engine


@contextmanager
def session(engine: Engine) -> Iterator[Session]:
    """A session that rolls back whatever was not committed when the block ends.

    Objects stay readable after commit (`expire_on_commit=False`): a web page reads the rows it
    just wrote after the session has closed.
    """
    with Session(engine, expire_on_commit=False) as s:
        yield s


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic config pointing at the migrations inside this package, from any working directory.

    With `connection`, the migrations run on it; without, `env.py` opens `make_engine()`.
    """
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def _lock_for_migrations(connection: Connection) -> None:
    # The web page and its worker start together: the first to lock migrates, the other finds
    # the schema already at head.
    if connection.dialect.name == "sqlite":
        # pysqlite opens no transaction before DDL by itself; BEGIN IMMEDIATE takes the write lock
        # now and makes the whole upgrade one transaction (SQLite DDL is transactional).
        connection.exec_driver_sql("BEGIN IMMEDIATE")
    elif connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK_KEY})


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to `revision`: create a fresh database, or upgrade one an earlier version made.

    Safe to call from several processes at once; all migrations run in one transaction.
    """
    with engine.connect() as connection:
        sqlite = connection.dialect.name == "sqlite"
        if sqlite:
            # SQLite alters a table by copying it and dropping the old one, and with foreign keys on
            # that drop fails for a table others reference. The pragma only works outside a transaction.
            connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
            connection.commit()
        try:
            with connection.begin():
                _lock_for_migrations(connection)
                command.upgrade(alembic_config(connection), revision)
                if sqlite and (broken := connection.exec_driver_sql("PRAGMA foreign_key_check").all()):
                    raise RuntimeError(f"migration broke foreign keys (table, rowid, ...): {broken[:5]}")
        finally:
            if sqlite:
                connection.exec_driver_sql("PRAGMA foreign_keys=ON")
                connection.commit()


class DatabaseUnusable(RuntimeError):
    """The database cannot be opened, created or upgraded where the setting points; the message is one line."""


def open_database(setting: str | None = None) -> Engine:
    """`make_engine` and `upgrade` for a command: a location that cannot be used (a folder that cannot be
    written, a server that refuses) raises `DatabaseUnusable` naming it and the reason, instead of a traceback."""
    where = setting or os.environ.get(DB_SETTING) or DEFAULT_DB_PATH
    try:
        if "://" in where:
            where = make_url(where).render_as_string(hide_password=True)
    except ArgumentError:
        pass
    try:
        engine = make_engine(setting)
        upgrade(engine)
    except DatabaseDamaged as err:
        raise DatabaseUnusable(str(err)) from None
    except (OSError, DBAPIError, ArgumentError, sqlite3.Error) as err:
        reason = str(getattr(err, "orig", None) or err).strip().splitlines()
        raise DatabaseUnusable(f"database {where!r} cannot be used: {reason[0] if reason else type(err).__name__}"
                               ) from None
    return engine


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (None for an empty database)."""
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()
