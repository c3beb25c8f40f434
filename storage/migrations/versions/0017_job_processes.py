"""The processes a training stage was planned for: a worker claims it only where it launches that many.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07

- `jobs.processes` (integer, nullable): a training stage's planned processes (`RunSettings.processes`), whose
  GRPO steps were counted for them (storage.queue.claim gives it only to a worker that launches as many: one per GPU
  it owns, one without a GPU). NULL: any worker, as every job queued before was claimed.
- `jobs.vllm_server` (boolean, default false): a training stage in vLLM's server mode, launched on the worker's GPUs
  less those of its vLLM server, so a worker counts its processes so for it.

Frozen: plain SQLAlchemy types only, never the models.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | Sequence[str] | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("processes", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("vllm_server", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("vllm_server")
        batch.drop_column("processes")
