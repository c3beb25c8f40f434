"""Replayed boards: `proposals.replay` and `stages.replay`, the boards a stage trains on as they are.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05

The `learnability` engineer keeps a buffer of the most learnable boards it probed and replays them as a share of the
next stage (`lab.engineers.learnability`): the proposal holds them (`{"boards": [instance JSON, ...]}`), and a
decision that applies its config passes them on to the stage it queues. Both columns are nullable JSON and start
empty: a proposal or stage stored before has no replayed board, and trains as it did.

Frozen: plain SQLAlchemy types only, never the models.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("proposals", "stages")
_json = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("replay", _json, nullable=True))


def downgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("replay")
