"""What several tabs share: the page around them, tables, times, names of decisions, the knob table, and
the board viewer (an episode's replay and the playground draw boards the same way)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import gradio as gr
from sqlalchemy import Engine

from envsim.config import AGENT_RATIO, KNOBS, NUM_AGENTS, EnvConfig
from envsim.instance import Instance
from envsim.rules import Failure
from envsim.scoring import Outcome
from lab.pages import figures
from storage.models import Action

if TYPE_CHECKING:
    from lab.jobs.worker import KeptWorker

ALL = "all"  # a gallery filter that keeps every value
# The events that draw a run's tabs (the page's load, the poll, opening a run, a proposal or a stage) answer one at a
# time: each answer's drawing reaches the browser in the order its `gr.State`s (what the page has drawn) were
# stored. Run side by side, a poll's answer could store "run 1 drawn" before a run was opened yet reach the browser
# after it, and the page then showed another run's proposals with nothing left to redraw them.
VIEW = {"concurrency_id": "view", "concurrency_limit": 1}
DECIDED = {Action.ACCEPT: "accepted", Action.EDIT: "edited", Action.REJECT: "rejected", Action.AUTO: "auto-applied"}
KNOB_COLUMNS = ["size", *KNOBS]
# The agent mix table of the Proposal form: a row per count, its share in the config shown (typed) and in force.
MIX_COLUMNS = ["agents", AGENT_RATIO, "in force"]
MIX_COUNTS = (2, 3, 4, 5)  # the validation set's count and the benchmark's: a row each, whatever the configs say


# What a stored row the lab did not write (an older version's import, a hand edit) can make a view raise. The view
# that meets one says so for that run, in one line, and the other runs and views still draw.
BAD_ROW = (ValueError, TypeError, KeyError, AttributeError, IndexError, ArithmeticError)


def cannot_draw(what: str, run_id: Any, err: Exception) -> str:
    """The line a view shows instead of drawing a run whose rows do not hold what the lab writes."""
    text = str(err).splitlines()[0][:160] if str(err) else ""
    of = f" of run #{run_id}" if run_id is not None else ""
    return (f"✗ {what}{of} cannot be drawn: a stored row does not hold what the lab writes "
            f"({type(err).__name__}: {text})")


@dataclass(frozen=True)
class Page:
    """What every tab's `build` is given: the database, and the widgets around the tabs."""

    engine: Engine
    run_pick: gr.Dropdown  # the open run, above the tabs
    tabs: gr.Tabs
    worker: gr.HTML  # the worker's badge
    quiet: gr.HTML  # never shown: where the events that show no progress show it (`no_progress`)
    own_worker: bool = True  # whether a worker was started with the page (`envlab serve` without --no-worker)
    kept: KeptWorker | None = None  # the worker `envlab serve` started and keeps, if it did


def no_progress(page: Page) -> dict[str, Any]:
    """An event's options for showing no progress: Gradio 6 still draws the timer text ("0.1s", "processing |
    0.1/0.2s", "queue: 1/1") of an event with `show_progress="hidden"` on each of its outputs (the poll's, in every
    status line), so its progress goes to one component that is never shown."""
    return {"show_progress": "hidden", "show_progress_on": page.quiet}


def table(headers: list[str], rows: list[list[Any]]) -> dict[str, Any]:
    """A `gr.Dataframe` value."""
    return {"headers": headers, "data": rows}


def user_of(request: gr.Request | None) -> str:
    """Who clicked: the login name (under `--auth-file`), else "local"."""
    return (getattr(request, "username", None) or "local") if request is not None else "local"


def when(t: datetime | None) -> str:
    return f"{t:%Y-%m-%d %H:%M:%S} UTC" if t else "-"


# ---------------------------------------------------------------- the knob table


def config_rows(config: EnvConfig) -> list[list[Any]]:
    """The knob table's rows, each value to 4 significant digits: as the diff shows it (0.07897, not 0.079)."""
    return [[row["size"], *(float(f"{row[k]:.4g}") for k in KNOBS)] for row in config.knob_rows()]


def _number_or_text(value: Any) -> Any:
    """A table cell as a number when it reads as one; otherwise as typed, so the validator can name it."""
    if isinstance(value, int | float):
        return value
    try:
        return float(str(value).strip())
    except ValueError:
        return value


def _blank(row: Sequence[Any] | None) -> bool:
    return not row or all(str(v).strip() == "" for v in row)


def _key(cell: Any) -> str:
    """A table's key cell (a size, an agent count) as typed: `3`, also where the table sent it as `3.0`."""
    return str(cell).strip().removesuffix(".0")


def mix_rows(config: EnvConfig, in_force: EnvConfig) -> list[list[Any]]:
    """The agent mix table's rows: one per count of `MIX_COUNTS` and any other that either config names, fewest
    agents first; each with its share in `config` (what the form applies) and in `in_force`, to 4 significant
    digits as the diff shows them."""
    counts = sorted(set(MIX_COUNTS) | config.agent_ratio.keys() | in_force.agent_ratio.keys())
    return [[k, *(float(f"{c.agent_ratio.get(k, 0.0):.4g}") for c in (config, in_force))] for k in counts]


def mix_from_rows(rows: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """The agent mix a person typed in the mix table, as the raw `agent_ratio` that `project` checks: each row's
    count to its share as typed (a number where it reads as one). A row whose share is 0 or blank is left out: no
    boards at that count, the same config as one that does not name it."""
    mix: dict[str, Any] = {}
    for row in rows:
        if _blank(row):
            continue
        share = _number_or_text(row[1] if len(row) > 1 else "")
        if share != 0 and str(share).strip() != "":
            mix[_key(row[0])] = share
    return mix


def config_from_table(rows: Sequence[Sequence[Any]], agents: Any, num_instances: Any) -> dict[str, Any]:
    """The raw config a person typed: one row per size, and the agents as the mix table's rows (`mix_from_rows`),
    one count (`num_agents`) or a mix as text (`agent_ratio`, `2=0.5, 3=0.5`; blank: the config's own); checked
    later by `project(..., strict=True)`."""
    raw: dict[str, Any] = {k: {} for k in KNOBS}
    for row in rows:
        if _blank(row):
            continue
        for knob, value in zip(KNOBS, row[1:], strict=False):
            raw[knob][_key(row[0])] = _number_or_text(value)
    if isinstance(agents, list | tuple):
        raw[AGENT_RATIO] = mix_from_rows(agents)
    else:
        agents = None if agents is None or str(agents).strip() == "" else _number_or_text(agents)
        raw[NUM_AGENTS if isinstance(agents, int | float) else AGENT_RATIO] = agents
    raw["num_instances"] = _number_or_text(num_instances)
    return raw


# ---------------------------------------------------------------- the board viewer


def verdict(instance: Instance, outcome: Outcome) -> str:
    if outcome.valid:
        head = "✓ **valid**" + (" and **optimal**" if outcome.optimal else ", not optimal")
        return f"{head}: {outcome.message}."
    what = outcome.message.removeprefix(f"{outcome.failure}: ")
    on_goal = f" Agents on their goal at the end: {outcome.isr:.0%}." \
        if outcome.failure == Failure.GOAL_NOT_REACHED else ""
    return f"✗ **{outcome.failure}**: {what}.{on_goal}"


def view_end(view: dict[str, Any] | None) -> int:
    """The last time step of a viewer state's outcome (0 with no outcome)."""
    return figures.last_step(Outcome.from_dict(view["outcome"])) if view and view.get("outcome") else 0


def draw(view: dict[str, Any] | None, step: Any, ghost: bool = True) -> tuple[Any, str]:
    """The viewer's board at `step` and the events that happen then (for any view: episode or playground).

    A view is the `gr.State` of a viewer: `{"instance": Instance JSON, "outcome": Outcome dict or None}`.
    """
    if not view:
        return figures.empty_figure("no board open"), ""
    instance = Instance.model_validate(view["instance"])
    outcome = Outcome.from_dict(view["outcome"]) if view.get("outcome") else None
    step = int(step or 0)
    fig = figures.board_figure(instance, outcome, step, ghost=ghost)
    if outcome is None:
        return fig, ""
    now = [figures.describe(e) for e in outcome.events if e.time == step]
    later = [e for e in outcome.events if e.time > step]
    text = ("**At this step:** " + "; ".join(now)) if now else f"Nothing goes wrong at t={step}."
    if not now and step == view_end(view) and not outcome.valid:
        text = f"The answer has ended (t={step}); what went wrong: {outcome.message}."
    if later:
        text += f" Next event: {figures.describe(later[0])}."
    if ghost and instance.reference_plan is None:
        text += " (This board has no solver plan, so no ghost.)"
    return fig, text + " Cells are (row, col), counted from 0 at the top left."
