"""One vocabulary, enforced; jobs know their run; runs have a UUID and say why they stopped.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22

- CHECK constraints on run, stage and job statuses, job kinds and episode/metric splits. Words written by
  earlier versions are renamed first: run "created"/"running" -> "active", stage "pending" -> "queued".
- `jobs.run_id` (foreign key, indexed) and `jobs.target` (the stage a job is about), filled from each
  job's JSON payload, and a partial unique index: one queued or running job per (run, kind, target).
  Duplicates an earlier version queued are cancelled first, the oldest kept, each with a note naming it.
- `runs.uuid` (unique; the name of the run's folder under the runs root) and `runs.status_reason`.

Frozen: plain SQLAlchemy types only, never the models.
"""

import uuid
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RUN_STATUSES = ("active", "waiting", "failed", "cancelled", "done")
STAGE_STATUSES = ("queued", "running", "done", "failed")
JOB_KINDS = ("stage", "propose", "benchmark")
SPLITS = ("benchmark", "validation")
TARGET_KEY = {"stage": "stage_index", "propose": "after_stage", "benchmark": "stage_index"}
ACTIVE = "status IN ('queued', 'running')"

_json = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
runs = sa.table("runs", sa.column("id", sa.Integer), sa.column("uuid", sa.String), sa.column("status", sa.String))
stages = sa.table("stages", sa.column("status", sa.String))
jobs = sa.table("jobs", sa.column("id", sa.Integer), sa.column("kind", sa.String), sa.column("payload", _json),
                sa.column("status", sa.String), sa.column("run_id", sa.Integer), sa.column("target", sa.Integer),
                sa.column("error", sa.Text), sa.column("finished_at", sa.DateTime(timezone=True)))


def _in(column: str, values: Sequence[str]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def upgrade() -> None:
    bind = op.get_bind()
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("uuid", sa.String(), nullable=True))
        batch.add_column(sa.Column("status_reason", sa.Text(), server_default="", nullable=False))
    for (run_id,) in bind.execute(sa.select(runs.c.id)).all():
        bind.execute(runs.update().where(runs.c.id == run_id).values(uuid=uuid.uuid4().hex))
    bind.execute(runs.update().where(runs.c.status.in_(("created", "running"))).values(status="active"))
    with op.batch_alter_table("runs") as batch:
        batch.alter_column("uuid", existing_type=sa.String(), nullable=False)
        batch.create_unique_constraint(op.f("uq_runs_uuid"), ["uuid"])
        batch.create_check_constraint(op.f("ck_runs_status"), _in("status", RUN_STATUSES))

    bind.execute(stages.update().where(stages.c.status == "pending").values(status="queued"))
    with op.batch_alter_table("stages") as batch:
        batch.create_check_constraint(op.f("ck_stages_status"), _in("status", STAGE_STATUSES))

    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("run_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("target", sa.Integer(), nullable=True))
        batch.create_foreign_key(op.f("fk_jobs_run_id_runs"), "runs", ["run_id"], ["id"])
        batch.create_index(op.f("ix_jobs_run_id"), ["run_id"])
        batch.create_check_constraint(op.f("ck_jobs_kind"), _in("kind", JOB_KINDS))
    _fill_jobs(bind)
    op.create_index(op.f("uq_jobs_active_target"), "jobs", ["run_id", "kind", "target"], unique=True,
                    sqlite_where=sa.text(ACTIVE), postgresql_where=sa.text(ACTIVE))

    for table in ("episodes", "stage_metrics"):
        with op.batch_alter_table(table) as batch:
            batch.create_check_constraint(op.f(f"ck_{table}_split"), _in("split", SPLITS))


def _fill_jobs(bind: sa.Connection) -> None:
    kept: dict[tuple, int] = {}
    for job_id, kind, payload, status in bind.execute(
            sa.select(jobs.c.id, jobs.c.kind, jobs.c.payload, jobs.c.status).order_by(jobs.c.id)).all():
        payload = payload or {}
        run_id, target = payload.get("run_id"), payload.get(TARGET_KEY.get(kind, ""))
        values: dict = {"run_id": run_id, "target": target}
        key = (run_id, kind, target)
        if status in ("queued", "running") and run_id is not None and target is not None:
            if key in kept:
                values.update(status="cancelled", finished_at=sa.func.now(),
                              error=f"a duplicate of job {kept[key]}, cancelled when the database was upgraded")
            else:
                kept[key] = job_id
        bind.execute(jobs.update().where(jobs.c.id == job_id).values(**values))


def downgrade() -> None:
    for table in ("episodes", "stage_metrics"):
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(f"ck_{table}_split", type_="check")
    op.drop_index("uq_jobs_active_target", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_constraint("ck_jobs_kind", type_="check")
        batch.drop_index("ix_jobs_run_id")
        batch.drop_constraint("fk_jobs_run_id_runs", type_="foreignkey")
        batch.drop_column("target")
        batch.drop_column("run_id")
    with op.batch_alter_table("stages") as batch:
        batch.drop_constraint("ck_stages_status", type_="check")
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint("ck_runs_status", type_="check")
        batch.drop_constraint("uq_runs_uuid", type_="unique")
        batch.drop_column("status_reason")
        batch.drop_column("uuid")
