"""What a run archive is: its format's name and version, the tables that travel with a run, and how their ids link.

Which tables travel, and how their ids are rewritten, is read from the SQLModel metadata: `runs`, then every
table with a foreign key into a table that travels (stages, jobs, episodes, ... on runs; decisions on
proposals). A column added later travels with no change here. The one exception is ids the lab keeps inside
JSON, listed in `JSON_IDS`: a job's payload names its run, so a resumed job must find the new id there.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from sqlalchemy import Column, Table
from sqlalchemy.sql.ddl import sort_tables
from sqlmodel import SQLModel

from storage.models import Run

FORMAT = "envlab-run"
# Raise it when a file of this version would be read wrongly by the code that reads it now. 2: `tiny` is the
# 2-to-5-agent policy; a version-1 file's `tiny` was the 2-agent one, read as `tiny-2agent` (`lab.archive.importing`).
# 3: a run's validation and dev boards are of 3, 4 and 5 agents unless its settings say otherwise; an earlier file's
# run whose settings name no counts was scored on 2 agents, and reads so.
VERSION = 3
TINY_RENAMED = {1: {"tiny": "tiny-2agent"}}  # a version's policy names as this version calls them
# A version's run settings that its runs left out, as that version read them: filled in on import.
SETTINGS_LEFT_OUT = {1: {"validation_agents": [2]}, 2: {"validation_agents": [2]}}
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


def links(table: Table) -> list:
    """The table's foreign keys that travel with a run (all but the `DETACHED` ones)."""
    return [fk for fk in table.foreign_keys if (table.name, fk.parent.name) not in DETACHED]


class ArchiveError(ValueError):
    """A run cannot be exported or imported as asked; the message says what is wrong. Nothing was changed."""


def run_tables() -> list[Table]:
    """The tables that travel with a run, each after the tables its ids name: `runs`, then every table with a
    foreign key into one that travels."""
    tables: list[Table] = []
    for table in SQLModel.metadata.sorted_tables:  # parents before children
        parents = {fk.column.table.name for fk in links(table)}
        if table.name == ROOT or parents & {t.name for t in tables}:
            tables.append(table)
    names = {t.name for t in tables}
    for table in tables:
        if outside := {fk.column.table.name for fk in links(table)} - names:
            raise ArchiveError(f"table {table.name} refers to {', '.join(sorted(outside))}, which does not travel "
                               "with a run: lab/archive/tables.py cannot remap those ids")
        if len(table.primary_key.columns) != 1:
            raise ArchiveError(f"table {table.name} has no single-column primary key to remap")
    metadata = SQLModel.metadata.tables
    json_parents = [(metadata[parent], metadata[name]) for (name, _), keys in JSON_IDS.items()
                    for parent in keys.values()]
    return sort_tables(tables, extra_dependencies=json_parents)


def primary_key(table: Table) -> Column:
    return next(iter(table.primary_key.columns))


def stored_path(value: str, what: str) -> PurePosixPath:
    """A checkpoint path relative to the runs root, refused when it could point anywhere else."""
    path = PurePosixPath(value)
    if value != str(path) or path.is_absolute() or ".." in path.parts or not path.parts or "\\" in value:
        raise ArchiveError(f"{what} {value!r} is not a plain relative path under the runs root")
    return path

