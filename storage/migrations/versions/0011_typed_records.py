"""Typed records: an experiment's settings name its runs' settings whole (`run`).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27

The JSON columns that every layer reads are typed now (`storage.models.Typed`): configs as `EnvConfig`, a run's
settings as `RunSettings`, an experiment's as `ExperimentSettings`, which reads its runs' settings from `run`. An
experiment stored before `run` existed recorded them only as figures (stages, grpo, base_url, lora, the
validation subset, the validation boards per size, the dev boards per size): they are gathered into `run` here,
as the lab read them then. Configs and run settings need no change: every row the lab wrote validates as it is.

Frozen: plain SQLAlchemy types only, never the models.
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

EXPERIMENTS = sa.table("experiments", sa.column("id", sa.Integer()), sa.column("settings", sa.JSON()))


def with_run(settings: dict[str, Any]) -> dict[str, Any]:
    """An experiment's settings with `run` gathered from the figures an earlier version recorded."""
    figures = {"stages": settings.get("stages"), "grpo": settings.get("grpo") or {},
               "base_url": settings.get("base_url"), "lora": settings.get("lora", 0),
               "validation_boards": settings.get("validation_subset"),
               "validation_per_size": settings.get("validation_per_size"), "dev_per_size": settings.get("dev_per_size")}
    return {**settings, "run": {k: v for k, v in figures.items() if v is not None} | {"auto_apply": True}}


def upgrade() -> None:
    connection = op.get_bind()
    for row in connection.execute(sa.select(EXPERIMENTS.c.id, EXPERIMENTS.c.settings)).all():
        settings = row.settings
        if isinstance(settings, dict) and "run" not in settings and "stages" in settings:
            connection.execute(EXPERIMENTS.update().where(EXPERIMENTS.c.id == row.id)
                               .values(settings=with_run(settings)))


def downgrade() -> None:
    """Nothing to undo: `run` is one more key, which the earlier version read when it was there."""
