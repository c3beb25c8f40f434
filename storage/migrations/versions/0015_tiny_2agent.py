"""The 2-agent tiny policy keeps its name: every stored `tiny` becomes `tiny-2agent`.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06

The shipped `tiny` policy plays 2 to 5 agents now (assets/tiny-policy); the one every run so far was made with,
warm-started on 2 agents only, is shipped beside it as `tiny-2agent` (assets/tiny-2agent-policy). A stored `tiny`
meant the 2-agent one, so it is rewritten to say so where it names a policy: `runs.policy`, `experiments.policy`,
a stage's checkpoint (stage 0's is the run's policy: the spec, or the folder it was loaded from, which ends in
assets/tiny-policy) and a probe's checkpoint. A probe's cache key hashed the checkpoint as written, so a rewritten
probe gets a key of its own (the old key with the new name, hashed), which the 2-to-5-agent `tiny` never computes:
it cannot read the 2-agent policy's measurements as its own, and nothing is lost.

A run's validation and dev boards were 2-agent boards unless its settings named other counts
(`validation_agents`, whose default was 2); the settings that do not name them are made to say 2, so a later default
never changes what a stored run was scored on. Downgrading makes `tiny-2agent` `tiny` again (a rewritten probe
keeps its new key: the earlier version measures it again rather than reading it) and leaves the settings as they
are.

Frozen: plain SQLAlchemy types only, never the models.
"""

import hashlib
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD, NEW = "tiny", "tiny-2agent"
OLD_FOLDER, NEW_FOLDER = "assets/tiny-policy", "assets/tiny-2agent-policy"
COUNTS = "validation_agents"

runs = sa.table("runs", sa.column("id", sa.Integer()), sa.column("policy", sa.String()),
                sa.column("settings", sa.JSON()))
experiments = sa.table("experiments", sa.column("id", sa.Integer()), sa.column("policy", sa.String()),
                       sa.column("settings", sa.JSON()))
stages = sa.table("stages", sa.column("id", sa.Integer()), sa.column("checkpoint", sa.String()))
probes = sa.table("probes", sa.column("id", sa.Integer()), sa.column("key", sa.String()),
                  sa.column("checkpoint", sa.String()))


def renamed(value: Any, old: str, new: str, old_folder: str, new_folder: str) -> Any:
    """`old` as `new`, and a folder path ending in `old_folder` as the same path ending in `new_folder`."""
    if value == old:
        return new
    if isinstance(value, str) and value.rstrip("/").endswith("/" + old_folder):
        return value.rstrip("/")[: -len(old_folder)] + new_folder
    return value


def with_counts(settings: Any) -> Any:
    """Run settings that name no validation agent counts, naming the 2 they were scored on."""
    if isinstance(settings, dict) and COUNTS not in settings:
        return {**settings, COUNTS: [2]}
    return settings


def _experiment_settings(settings: Any) -> Any:
    if isinstance(settings, dict) and isinstance(settings.get("run"), dict):
        return {**settings, "run": with_counts(settings["run"])}
    return settings


def _rewrite(old: str, new: str, old_folder: str, new_folder: str, counts: bool) -> None:
    connection = op.get_bind()
    for table in (runs, experiments):
        for row in connection.execute(sa.select(table)).mappings().all():
            values = {}
            if (policy := renamed(row["policy"], old, new, old_folder, new_folder)) != row["policy"]:
                values["policy"] = policy
            if counts:
                settings = (with_counts if table is runs else _experiment_settings)(row["settings"])
                if settings != row["settings"]:
                    values["settings"] = settings
            if values:
                connection.execute(table.update().where(table.c.id == row["id"]).values(values))
    for row in connection.execute(sa.select(stages.c.id, stages.c.checkpoint)).mappings().all():
        if (checkpoint := renamed(row["checkpoint"], old, new, old_folder, new_folder)) != row["checkpoint"]:
            connection.execute(stages.update().where(stages.c.id == row["id"]).values(checkpoint=checkpoint))
    for row in connection.execute(sa.select(probes)).mappings().all():
        if (checkpoint := renamed(row["checkpoint"], old, new, old_folder, new_folder)) != row["checkpoint"]:
            key = hashlib.sha256(f"{row['key']}:{checkpoint}".encode()).hexdigest()[:32]
            connection.execute(probes.update().where(probes.c.id == row["id"]).values(checkpoint=checkpoint,
                                                                                     key=key))


def upgrade() -> None:
    _rewrite(OLD, NEW, OLD_FOLDER, NEW_FOLDER, counts=True)


def downgrade() -> None:
    _rewrite(NEW, OLD, NEW_FOLDER, OLD_FOLDER, counts=False)
