"""Probes: a config's boards answered by a checkpoint, measured for GRPO signal; what a proposal spent on them;
which of them a person saw before deciding.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24

- `probes` (key UNIQUE: the cache key of config, checkpoint, seed, boards and answers; the per-size measurement
  and the compute it took as JSON). No run id: a probe belongs to a checkpoint, and runs share stage 0's.
- `jobs.kind` may be `probe` (the Measure panel's job).
- `proposals.compute` (JSON, NULL for proposals that measured nothing) and `decisions.probes` (JSON list of the
  probe keys shown to the person who decided, NULL when none was).

Frozen: plain SQLAlchemy types only, never the models.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JOB_KINDS = ("stage", "propose", "benchmark", "probe")
OLD_JOB_KINDS = ("stage", "propose", "benchmark")

_json = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def _in(column: str, values: Sequence[str]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def _job_kinds(kinds: Sequence[str]) -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_constraint(op.f("ck_jobs_kind"), type_="check")
        batch.create_check_constraint(op.f("ck_jobs_kind"), _in("kind", kinds))


def upgrade() -> None:
    op.create_table(
        "probes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(), nullable=False),
        sa.Column("config", _json, nullable=False),
        sa.Column("checkpoint", sa.String(), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("boards", sa.Integer(), nullable=False),
        sa.Column("answers", sa.Integer(), nullable=False),
        sa.Column("temperature", sa.Float(), nullable=False),
        sa.Column("sizes", _json, nullable=False),
        sa.Column("completions", sa.Integer(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_probes"),
        sa.UniqueConstraint("key", name="uq_probes_key"),
    )
    with op.batch_alter_table("proposals") as batch:
        batch.add_column(sa.Column("compute", _json, nullable=True))
    with op.batch_alter_table("decisions") as batch:
        batch.add_column(sa.Column("probes", _json, nullable=True))
    _job_kinds(JOB_KINDS)


def downgrade() -> None:
    op.execute("DELETE FROM jobs WHERE kind = 'probe'")
    _job_kinds(OLD_JOB_KINDS)
    with op.batch_alter_table("decisions") as batch:
        batch.drop_column("probes")
    with op.batch_alter_table("proposals") as batch:
        batch.drop_column("compute")
    op.drop_table("probes")
