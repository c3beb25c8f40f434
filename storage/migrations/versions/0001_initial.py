"""The initial schema: runs, stages, proposals, decisions, jobs, episodes, stage metrics, training logs.

Revision ID: 0001
Revises:
Create Date: 2026-11-21

Frozen: plain SQLAlchemy types only, never the models (they keep changing; this must not).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _json() -> sa.types.TypeEngine:
    return sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def _time() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def _id() -> sa.Column:
    return sa.Column("id", sa.Integer(), nullable=False)


def _run_id(table: str) -> list[sa.Column | sa.ForeignKeyConstraint]:
    return [
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=f"fk_{table}_run_id_runs"),
    ]


def upgrade() -> None:
    _runs_and_decisions()
    _work_and_results()


def _runs_and_decisions() -> None:
    """runs, stages, proposals and decisions."""
    op.create_table(
        "runs",
        _id(),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("policy", sa.String(), nullable=False),
        sa.Column("engineer", sa.String(), nullable=False),
        sa.Column("engineer_backend", sa.String(), nullable=False),
        sa.Column("settings", _json(), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("created_at", _time(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_runs"),
    )
    op.create_table(
        "stages",
        _id(),
        *_run_id("stages"),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("config", _json(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("checkpoint", sa.String(), nullable=True),
        sa.Column("started_at", _time(), nullable=True),
        sa.Column("finished_at", _time(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_stages"),
        sa.UniqueConstraint("run_id", "index", name="uq_stages_run_id_index"),
    )
    op.create_table(
        "proposals",
        _id(),
        *_run_id("proposals"),
        sa.Column("after_stage", sa.Integer(), nullable=False),
        sa.Column("engineer", sa.String(), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("raw_answer", sa.Text(), nullable=False),
        sa.Column("parsed_config", _json(), nullable=True),
        sa.Column("projected_config", _json(), nullable=True),
        sa.Column("adjustments", _json(), nullable=False),
        sa.Column("rationale", sa.Text(), nullable=False),
        sa.Column("diff", _json(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", _time(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_proposals"),
    )
    op.create_index("ix_proposals_run_id_after_stage", "proposals", ["run_id", "after_stage"])
    op.create_table(
        "decisions",
        _id(),
        sa.Column("proposal_id", sa.Integer(), nullable=False),
        sa.Column("action", sa.String(), nullable=False),
        sa.Column("user", sa.String(), nullable=False),
        sa.Column("config", _json(), nullable=True),
        sa.Column("note", sa.Text(), nullable=False),
        sa.Column("created_at", _time(), nullable=False),
        sa.CheckConstraint("action IN ('accept', 'edit', 'reject', 'auto')", name="ck_decisions_action"),
        sa.ForeignKeyConstraint(["proposal_id"], ["proposals.id"], name="fk_decisions_proposal_id_proposals"),
        sa.PrimaryKeyConstraint("id", name="pk_decisions"),
        # One decision per proposal, kept by the database (storage.decisions relies on it).
        sa.UniqueConstraint("proposal_id", name="uq_decisions_proposal_id"),
    )


def _work_and_results() -> None:
    """jobs, episodes, training logs and stage metrics."""
    op.create_table(
        "jobs",
        _id(),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("payload", _json(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("worker", sa.String(), nullable=True),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("total", sa.Integer(), nullable=True),
        sa.Column("heartbeat_at", _time(), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("log_tail", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("result", _json(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("created_at", _time(), nullable=False),
        sa.Column("started_at", _time(), nullable=True),
        sa.Column("finished_at", _time(), nullable=True),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'done', 'failed', 'cancelled')", name="ck_jobs_status"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
    )
    op.create_index("ix_jobs_status_id", "jobs", ["status", "id"])
    op.create_table(
        "episodes",
        _id(),
        *_run_id("episodes"),
        sa.Column("stage_index", sa.Integer(), nullable=False),
        sa.Column("split", sa.String(), nullable=False),
        sa.Column("instance_id", sa.String(), nullable=False),
        sa.Column("instance", _json(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("num_agents", sa.Integer(), nullable=False),
        sa.Column("completion", sa.Text(), nullable=False),
        sa.Column("plan", _json(), nullable=True),
        sa.Column("outcome", _json(), nullable=False),
        sa.Column("valid", sa.Boolean(), nullable=False),
        sa.Column("optimal", sa.Boolean(), nullable=False),
        sa.Column("failure", sa.String(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_episodes"),
    )
    op.create_index("ix_episodes_run_id_stage_index_split", "episodes", ["run_id", "stage_index", "split"])
    op.create_table(
        "stage_metrics",
        _id(),
        *_run_id("stage_metrics"),
        sa.Column("stage_index", sa.Integer(), nullable=False),
        sa.Column("split", sa.String(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("episodes", sa.Integer(), nullable=False),
        sa.Column("valid", sa.Integer(), nullable=False),
        sa.Column("optimal", sa.Integer(), nullable=False),
        sa.Column("failures", _json(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_stage_metrics"),
        sa.UniqueConstraint(
            "run_id", "stage_index", "split", "size", name="uq_stage_metrics_run_id_stage_index_split_size"
        ),
    )
    op.create_table(
        "training_logs",
        _id(),
        *_run_id("training_logs"),
        sa.Column("stage_index", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("metrics", _json(), nullable=False),
        sa.Column("created_at", _time(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_training_logs"),
    )
    op.create_index(
        "ix_training_logs_run_id_stage_index_step", "training_logs", ["run_id", "stage_index", "step"]
    )


def downgrade() -> None:
    for table in ("training_logs", "stage_metrics", "episodes", "jobs", "decisions", "proposals"):
        op.drop_table(table)
    for table in ("stages", "runs"):
        op.drop_table(table)
