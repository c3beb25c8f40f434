"""Episodes and stage metrics may be of the `dev` split: the boards a run's engineers read, drawn like the
validation boards and disjoint from them (envsim.suite.dev_entries).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24

Downgrading deletes the dev episodes and metrics (an older version has no word for them).

Frozen: plain SQLAlchemy types only, never the models.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SPLITS = ("benchmark", "validation", "dev")
OLD_SPLITS = ("benchmark", "validation")
TABLES = ("episodes", "stage_metrics")


def _in(column: str, values: Sequence[str]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def _splits(splits: Sequence[str]) -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(op.f(f"ck_{table}_split"), type_="check")
            batch.create_check_constraint(op.f(f"ck_{table}_split"), _in("split", splits))


def upgrade() -> None:
    _splits(SPLITS)


def downgrade() -> None:
    for table in TABLES:
        op.execute(f"DELETE FROM {table} WHERE split = 'dev'")
    _splits(OLD_SPLITS)
