"""The agent count as a mixture: every stored config's `num_agents: k` becomes `agent_ratio: {"k": 1.0}`.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02

A config names the shares of its boards per agent count (`agent_ratio`, as `data_ratio` names them per map size)
where it named one count for every board (`num_agents`). The lab still reads `num_agents` on input (a file, an
archive, an answer), so nothing stored becomes unreadable without this; it rewrites the stored configs into the one
form the lab writes now, in the place `num_agents` had: stages.config, proposals.parsed_config and
projected_config, decisions.config, probes.config, experiments.settings["config"] and the configs of probe jobs'
payloads. A config that names `agent_ratio` already, or whose `num_agents` is not a whole number (an engineer's
answer as given), is kept as it is. Probe keys stay as they are: a config of one agent count is hashed in its
`num_agents` form (`training.probe.probe_key`).

Frozen: plain SQLAlchemy types only, never the models.
"""

from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NUM_AGENTS, AGENT_RATIO = "num_agents", "agent_ratio"


def with_agent_ratio(config: Any) -> Any:
    """`num_agents: k` as `agent_ratio: {"k": 1.0}` in its place; anything else as it is."""
    if not isinstance(config, dict) or AGENT_RATIO in config:
        return config
    count = config.get(NUM_AGENTS)
    if isinstance(count, bool) or not isinstance(count, int):
        return config
    return {AGENT_RATIO if k == NUM_AGENTS else k: {str(count): 1.0} if k == NUM_AGENTS else v
            for k, v in config.items()}


def with_num_agents(config: Any) -> Any:
    """The way back: an `agent_ratio` of one count as `num_agents` in its place; a mix as it is (the earlier
    version cannot read it)."""
    if not isinstance(config, dict) or NUM_AGENTS in config or not isinstance(config.get(AGENT_RATIO), dict) \
            or len(config[AGENT_RATIO]) != 1:
        return config
    ((count, share),) = config[AGENT_RATIO].items()
    if share != 1 or not str(count).isdigit():
        return config
    return {NUM_AGENTS if k == AGENT_RATIO else k: int(count) if k == AGENT_RATIO else v for k, v in config.items()}


def _in_settings(change: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """An experiment's settings with `change` made to its `config`."""
    def changed(settings: Any) -> Any:
        if not isinstance(settings, dict) or "config" not in settings:
            return settings
        return {**settings, "config": change(settings["config"])}
    return changed


def _in_probe_job(change: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A job's payload with `change` made to each of its `configs` (a probe job's)."""
    def changed(payload: Any) -> Any:
        if not isinstance(payload, dict) or not isinstance(payload.get("configs"), dict):
            return payload
        return {**payload, "configs": {label: change(c) for label, c in payload["configs"].items()}}
    return changed


def _columns(change: Callable[[Any], Any]) -> list[tuple[str, str, Callable[[Any], Any]]]:
    """(table, JSON column, how its value changes) for every stored config."""
    return [("stages", "config", change), ("proposals", "parsed_config", change),
            ("proposals", "projected_config", change), ("decisions", "config", change), ("probes", "config", change),
            ("experiments", "settings", _in_settings(change)), ("jobs", "payload", _in_probe_job(change))]


def _rewrite(change: Callable[[Any], Any]) -> None:
    connection = op.get_bind()
    for name, column, changed in _columns(change):
        rows = sa.table(name, sa.column("id", sa.Integer()), sa.column(column, sa.JSON()))
        for row in connection.execute(sa.select(rows.c.id, rows.c[column])).all():
            value = row[1]
            if (new := changed(value)) != value:
                connection.execute(rows.update().where(rows.c.id == row.id).values({column: new}))


def upgrade() -> None:
    _rewrite(with_agent_ratio)


def downgrade() -> None:
    _rewrite(with_num_agents)
