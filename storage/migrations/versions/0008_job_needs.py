"""What a job needs and how urgent it is: a worker claims only jobs it can run, a person's first.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24

- `jobs.needs_gpu` (boolean, default false): the job loads a policy too large for a CPU (storage.queue.claim
  gives it only to a worker that owns a GPU).
- `jobs.priority` (integer, default 0): a person's interactive jobs (a Measure, a stage queued after a decision)
  are claimed before an experiment's, then the oldest first; the claim's index covers (status, priority, id).

Frozen: plain SQLAlchemy types only, never the models.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("needs_gpu", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("priority", sa.Integer(), nullable=False, server_default="0"))
    op.create_index("ix_jobs_claim", "jobs", ["status", "priority", "id"])


def downgrade() -> None:
    op.drop_index("ix_jobs_claim", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("priority")
        batch.drop_column("needs_gpu")
