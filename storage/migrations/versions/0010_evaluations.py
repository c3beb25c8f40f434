"""Evaluations: one evaluation per key of everything that determines its answers, shared by the stages that ask it.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24

- `evaluations` (key, run_id, stage_index, split, source_run_id, source_stage_index, created_at): a row without a
  source is the stage that generates the answers of its key (at most one per key: a partial unique index, the
  claim two workers race for); a row with a source is a stage that copied that evaluation's episodes and stage
  metrics (`training.shared`). No foreign keys: the table stays in its database.

Frozen: plain SQLAlchemy types only, never the models.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SPLITS = "split IN ('benchmark', 'validation', 'dev')"


def upgrade() -> None:
    op.create_table(
        "evaluations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("stage_index", sa.Integer(), nullable=False),
        sa.Column("split", sa.String(), nullable=False),
        sa.Column("source_run_id", sa.Integer(), nullable=True),
        sa.Column("source_stage_index", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_evaluations"),
        sa.UniqueConstraint("run_id", "stage_index", "split", name="uq_evaluations_run_id_stage_index_split"),
        sa.CheckConstraint(SPLITS, name="ck_evaluations_split"),
    )
    op.create_index("uq_evaluations_key", "evaluations", ["key"], unique=True,
                    sqlite_where=sa.text("source_run_id IS NULL"), postgresql_where=sa.text("source_run_id IS NULL"))


def downgrade() -> None:
    op.drop_index("uq_evaluations_key", table_name="evaluations")
    op.drop_table("evaluations")
