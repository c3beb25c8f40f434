"""Stage metrics per agent count: `stage_metrics.agents`, one row per (run, stage, split, size, agents).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03

A stored row summed one size's episodes of a split whatever their agent count. The episodes say it: each has its
`num_agents`, and an evaluation's episodes and metrics were always stored (and copied) together. So each row is
filled from its episodes: where they hold exactly the row's counts, the row takes their agent count, or, for
boards of several counts (the benchmark's 3, 4 and 5 agents share sizes 4 to 10), becomes one row per count with
that count's episodes, valid, optimal and failures, which sum to the row's. A row whose episodes do not add up to
it (none such is written by the lab) keeps its sums under 2 agents, the count of every validation and dev board so
far (`envsim.suite`: those sets are 2-agent boards whatever the stage's config trains on). The column's server
default, 2, is what a row inserted without it (an archive written before this revision) gets.

Downgrading sums each size's rows back into one.

Frozen: plain SQLAlchemy types only, never the models.
"""

from collections import Counter
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KEY = ("run_id", "stage_index", "split", "size")
OLD_UNIQUE = "uq_stage_metrics_run_id_stage_index_split_size"
UNIQUE = "uq_stage_metrics_run_id_stage_index_split_size_agents"
UNKNOWN = 2  # a row its episodes do not account for: the agent count of every validation and dev board so far

metrics = sa.table("stage_metrics", sa.column("id", sa.Integer()), *(sa.column(c) for c in KEY),
                   sa.column("agents", sa.Integer()), sa.column("episodes", sa.Integer()),
                   sa.column("valid", sa.Integer()), sa.column("optimal", sa.Integer()),
                   sa.column("failures", sa.JSON()))
episodes = sa.table("episodes", *(sa.column(c) for c in KEY), sa.column("num_agents", sa.Integer()),
                    sa.column("valid", sa.Boolean()), sa.column("optimal", sa.Boolean()),
                    sa.column("failure", sa.String()))


def _counts(connection: sa.Connection) -> dict[tuple, dict[int, dict]]:
    """(run, stage, split, size) -> agent count -> the episodes' counts, as a stage metric row holds them."""
    key = [episodes.c[c] for c in KEY]
    out: dict[tuple, dict[int, dict]] = {}
    ones = [sa.func.sum(sa.case((episodes.c[c], 1), else_=0)) for c in ("valid", "optimal")]
    for *k, agents, n, valid, optimal in connection.execute(
            sa.select(*key, episodes.c.num_agents, sa.func.count(), *ones).group_by(*key, episodes.c.num_agents)):
        out.setdefault(tuple(k), {})[agents] = {"episodes": n, "valid": int(valid), "optimal": int(optimal),
                                               "failures": Counter()}
    for *k, agents, failure, n in connection.execute(
            sa.select(*key, episodes.c.num_agents, episodes.c.failure, sa.func.count())
            .where(episodes.c.failure.is_not(None)).group_by(*key, episodes.c.num_agents, episodes.c.failure)):
        out[tuple(k)][agents]["failures"][failure] = n
    return out


def _fill(connection: sa.Connection) -> None:
    counts = _counts(connection)
    for row in connection.execute(sa.select(metrics)).mappings().all():
        by_agents = counts.get(tuple(row[c] for c in KEY), {})
        failures = sum((c["failures"] for c in by_agents.values()), Counter())
        if not by_agents or [sum(c[f] for c in by_agents.values()) for f in ("episodes", "valid", "optimal")] \
                != [row["episodes"], row["valid"], row["optimal"]] or failures != Counter(row["failures"] or {}):
            connection.execute(metrics.update().where(metrics.c.id == row["id"]).values(agents=UNKNOWN))
            continue
        for i, (agents, c) in enumerate(sorted(by_agents.items())):
            values = {**c, "agents": agents, "failures": dict(sorted(c["failures"].items()))}
            if i == 0:
                connection.execute(metrics.update().where(metrics.c.id == row["id"]).values(values))
            else:
                connection.execute(metrics.insert().values({**{k: row[k] for k in KEY}, **values}))


def _sum_over_agents(connection: sa.Connection) -> None:
    """Each (run, stage, split, size)'s rows as one: the first keeps the sums, the others go."""
    rows: dict[tuple, list] = {}
    for row in connection.execute(sa.select(metrics).order_by(metrics.c.id)).mappings().all():
        rows.setdefault(tuple(row[c] for c in KEY), []).append(row)
    for first, *rest in rows.values():
        if not rest:
            continue
        every = [first, *rest]
        failures = sum((Counter(r["failures"] or {}) for r in every), Counter())
        connection.execute(metrics.update().where(metrics.c.id == first["id"]).values(
            {f: sum(r[f] for r in every) for f in ("episodes", "valid", "optimal")}
            | {"failures": dict(sorted(failures.items()))}))
        connection.execute(metrics.delete().where(metrics.c.id.in_([r["id"] for r in rest])))


def upgrade() -> None:
    with op.batch_alter_table("stage_metrics") as batch:
        batch.add_column(sa.Column("agents", sa.Integer(), nullable=True))
        batch.drop_constraint(OLD_UNIQUE, type_="unique")  # a size's rows per agent count go in next
    _fill(op.get_bind())
    with op.batch_alter_table("stage_metrics") as batch:
        batch.alter_column("agents", existing_type=sa.Integer(), nullable=False, server_default=str(UNKNOWN))
        batch.create_unique_constraint(UNIQUE, [*KEY, "agents"])


def downgrade() -> None:
    _sum_over_agents(op.get_bind())
    with op.batch_alter_table("stage_metrics") as batch:
        batch.drop_constraint(UNIQUE, type_="unique")
        batch.create_unique_constraint(OLD_UNIQUE, list(KEY))
        batch.drop_column("agents")
