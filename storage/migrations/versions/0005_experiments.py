"""Experiments: a named set of runs (arms x seeds); a run knows its experiment and arm.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23

- `experiments` (name UNIQUE, policy, arms and settings as JSON, seeds, created_at).
- `runs.experiment_id` (foreign key, indexed) and `runs.arm`, both NULL for the runs an earlier version made.

Frozen: plain SQLAlchemy types only, never the models.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_json = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "experiments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("policy", sa.String(), nullable=False),
        sa.Column("arms", _json, nullable=False),
        sa.Column("seeds", sa.Integer(), nullable=False),
        sa.Column("settings", _json, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_experiments"),
        sa.UniqueConstraint("name", name="uq_experiments_name"),
    )
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("experiment_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("arm", sa.String(), nullable=True))
        batch.create_foreign_key(op.f("fk_runs_experiment_id_experiments"), "experiments", ["experiment_id"], ["id"])
        batch.create_index(op.f("ix_runs_experiment_id"), ["experiment_id"])


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_index("ix_runs_experiment_id")
        batch.drop_constraint("fk_runs_experiment_id_experiments", type_="foreignkey")
        batch.drop_column("arm")
        batch.drop_column("experiment_id")
    op.drop_table("experiments")
