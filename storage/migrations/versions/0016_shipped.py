"""The lab's choice about the shipped example and studies, and how far their import has come: `shipped`.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06

- `shipped` (id, choice, done, total, studies, decided_at): one row. `choice` is what the lab's first `envlab serve`
  decided (`take` the shipped example run and studies, or `decline` them: `--no-example`, or a database that held
  a run already); a lab that takes them imports what is still missing at every start (`lab.study.example`), so a
  first start stopped in the middle of the import is finished by the next one.

A database made before holds no row yet. One that holds the example run (settings `"example": true`) took them:
its row says `take`, so a lab whose first start was stopped during the import gets the rest at its next start.
One that holds other runs only declined them, as the lab then decided (it imported only into a database without
runs). An empty one gets no row: its next start decides, as before.

Frozen: plain SQLAlchemy types only, never the models.
"""

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | Sequence[str] | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CHOICES = "choice IN ('take', 'decline')"
runs = sa.table("runs", sa.column("id", sa.Integer()), sa.column("settings", sa.JSON()))


def upgrade() -> None:
    shipped = op.create_table(
        "shipped",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("choice", sa.String(), nullable=False),
        sa.Column("done", sa.Integer(), nullable=False),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("studies", sa.String(), nullable=False),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(CHOICES, name="ck_shipped_choice"),
        sa.PrimaryKeyConstraint("id", name="pk_shipped"),
    )
    connection = op.get_bind()
    settings = [row.settings for row in connection.execute(sa.select(runs.c.settings))]
    if not settings:
        return
    took = any(isinstance(s, dict) and s.get("example") is True for s in settings)
    op.bulk_insert(shipped, [{"id": 1, "choice": "take" if took else "decline", "done": 0, "total": 0,
                              "studies": "", "decided_at": datetime.now(UTC)}])


def downgrade() -> None:
    op.drop_table("shipped")
