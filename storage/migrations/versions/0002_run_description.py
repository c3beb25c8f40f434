"""Runs get a free-text description (a person's note on what the run is for).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21

Existing runs read back with an empty description (server default), so the column can be NOT NULL.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("description", sa.String(), server_default="", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("description")
