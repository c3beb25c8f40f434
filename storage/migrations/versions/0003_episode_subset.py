"""Benchmark episodes keep their board's wait subset (0.25, 0.50, 0.75) for the per-subset tables.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21

Episodes stored before this revision read back with no subset (NULL).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("episodes") as batch:
        batch.add_column(sa.Column("subset", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("episodes") as batch:
        batch.drop_column("subset")
