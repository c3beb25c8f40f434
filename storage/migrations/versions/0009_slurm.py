"""Slurm: the Slurm job (array task) that ran a job, where it ran, its state and its log.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24

- `jobs.slurm` (JSON, NULL for a job no Slurm job ran): `{"array": "4182", "task": 3, "node": "gpu12",
  "state": "RUNNING", "log": "/shared/runs/experiments/2/slurm/4182_3_0_log.out", "gpus": "0"}`, written by the
  array task that claimed the job (`lab.study.slurm`), its state refreshed by whoever watches the array.

Frozen: plain SQLAlchemy types only, never the models.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_json = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("slurm", _json, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("slurm")
