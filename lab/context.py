"""What an engineer reads: the evidence of a run so far, and the context text built from it.

`Evidence` is plain data: the stage just evaluated (`current`), the stages before it, and the round's
bookkeeping. `load_stage_result` reads one stage's part of it from the database. `build_context` turns
evidence into deterministic text, one section per context module; `ContextModules` says which sections
appear. The paper's best context (`ContextModules.paper_best()`) is the failure breakdown, the guideline,
the history without the round-0 default, and the bookkeeping. The `measured` module shows the current config
probed on the policy (`training.probe`): per size, how much GRPO signal its boards carry. `CONTEXT_PRESETS` names
the combinations a context ablation compares (docs/engineers.md), so an llm arm of an experiment is written
`llm:<backend>@<preset>`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from sqlmodel import Session, select

from envsim.config import (
    AGENT_COUNTS,
    AGENT_RATIO,
    AGENT_RATIO_RANGE,
    DEFAULT_AGENTS,
    GLOBALS,
    KNOB_HELP,
    KNOBS,
    EnvConfig,
)
from envsim.instance import Instance
from envsim.rules import Failure
from envsim.scoring import Outcome, Tally
from envsim.suite import Split
from lab.results import outcome_of, stage_summaries
from storage.db import stage_at
from storage.models import Episode, TrainingLog
from storage.settings import RunSettings
from training import advantage
from training.advantage import Cell, CellSignal
from training.probe import ProbeResult  # the probe's numbers (torch loads only where a probe samples)

SPLIT = Split.DEV  # the engineer reads dev results: the validation results score the run, so it never sees those
ANSWER_CHARS = 600  # a failure case shows at most this much of the policy's answer


@dataclass(frozen=True)
class FailureCase:
    """One failed dev episode: the board, what the policy answered, and how it went."""

    instance: Instance
    completion: str
    outcome: Outcome


@dataclass(frozen=True)
class BoardOutcome:
    """One dev board as an engineer that reads failures board by board sees it: its size, hole ratio, whether its
    optimal plan needs a wait, how the policy did (`failure` None when valid, `optimal`) and its agent count."""

    size: int
    hole_ratio: float
    needs_wait: bool
    valid: bool
    failure: str | None = None
    agents: int = DEFAULT_AGENTS
    optimal: bool = False

    @classmethod
    def of(cls, instance: Instance, valid: bool, failure: str | None, optimal: bool = False) -> BoardOutcome:
        return cls(instance.size, round(len(instance.holes) / instance.size ** 2, 4), bool(instance.needs_wait),
                   valid, failure, instance.num_agents, optimal)


@dataclass(frozen=True)
class StageResult:
    """A stage's config and its results per map size on the dev boards, with a few failed episodes and every
    board's outcome (`boards`, in stored order), and what its training boards taught: TRL's advantages per cell
    (agent count, map size), summed over its training logs (`cells`, `training.advantage`; None where the stage
    recorded none: stage 0 trains nothing, and a stage trained before the record existed has none)."""

    stage_index: int
    config: EnvConfig
    by_size: dict[int, Tally]
    cases: tuple[FailureCase, ...] = ()
    boards: tuple[BoardOutcome, ...] = ()
    cells: dict[Cell, CellSignal] | None = None

    @property
    def total(self) -> Tally:
        """Every size together: the stage's pooled counts on those boards (docs/results.md)."""
        return Tally.total(self.by_size.values())

    @property
    def by_agents(self) -> dict[int, Tally]:
        """The stage's results per agent count, fewest agents first, counted from its dev boards (`boards`)."""
        counts: dict[int, list[BoardOutcome]] = {}
        for board in self.boards:
            counts.setdefault(board.agents, []).append(board)
        return {k: Tally(len(b), sum(x.valid for x in b), sum(x.optimal for x in b),
                         dict(sorted(Counter(x.failure for x in b if x.failure is not None).items())))
                for k, b in sorted(counts.items())}


@dataclass(frozen=True)
class Evidence:
    """Everything an engineer may read when it proposes the config of the next stage.

    `history` holds the stages before `current`, oldest first; stage 0 (when present) was evaluated on the
    round-0 default config. `round_index` is the stage the proposal is for, `rounds_left` the training
    stages still to come counting that one, `instances_per_stage` the training instances per stage.
    """

    current: StageResult
    history: tuple[StageResult, ...] = ()
    round_index: int = 1
    rounds_left: int = 1
    instances_per_stage: int | None = None  # None: the current config's num_instances
    hyperparameters: dict[str, Any] | None = None
    self_summary: str | None = None
    measured: ProbeResult | None = None  # the current config probed on the current checkpoint (`training.probe`)
    # the agent counts the engineer may put in the next stage's mix (the run's `agent_counts`, else the config in
    # force's); None: an engineer keeps the mix as it is, and the llm's schema names every legal count (evidence made
    # outside a run)
    agent_counts: tuple[int, ...] | None = None


@dataclass(frozen=True)
class ContextModules:
    """Which sections the context text holds (the paper's context modules).

    `history` shows the earlier stages without stage 0; `history_with_default` shows them with stage 0,
    the round-0 default (either flag turns the history section on).
    """

    failure_breakdown: bool = True
    guideline: bool = True
    history: bool = True
    history_with_default: bool = False
    bookkeeping: bool = True
    failure_cases: bool = False
    self_summary: bool = False
    hyperparameters: bool = False
    measured: bool = False

    @classmethod
    def paper_best(cls) -> ContextModules:
        """Failure breakdown + guideline + history without the default + bookkeeping."""
        return cls()

    @classmethod
    def every(cls) -> ContextModules:
        return cls(**{f.name: True for f in fields(cls)})

    @classmethod
    def none(cls) -> ContextModules:
        return cls(**{f.name: False for f in fields(cls)})


# What each preset holds is named by its name; `paper-best` is the default everywhere.
CONTEXT_PRESETS: dict[str, ContextModules] = {
    "paper-best": ContextModules.paper_best(),
    "failures-only": ContextModules(failure_breakdown=True, guideline=False, history=False, bookkeeping=False),
    "no-history": ContextModules(history=False),
    "with-default": ContextModules(history_with_default=True),
    "full": ContextModules.every(),
}
DEFAULT_PRESET = "paper-best"


def context_preset(name: str) -> ContextModules:
    """The modules of a named preset; a ValueError naming the presets for any other name."""
    if name not in CONTEXT_PRESETS:
        raise ValueError(f"unknown context preset {name!r}: one of {', '.join(CONTEXT_PRESETS)}")
    return CONTEXT_PRESETS[name]


def preset_of(modules: ContextModules) -> str | None:
    """The name of the preset that holds exactly `modules`, or None for another combination."""
    return next((name for name, m in CONTEXT_PRESETS.items() if m == modules), None)


# ---------------------------------------------------------------- from the database


def evidence_split(settings: RunSettings) -> Split:
    """The split a run's engineers read: its dev boards; a run of an earlier version, which has none (no
    `dev_per_size` among its settings), was read on its validation boards, and is read as it was."""
    return SPLIT if settings.dev_per_size else Split.VALIDATION


def load_stage_result(session: Session, run_id: int, stage_index: int, cases: int = 3,
                      split: Split = SPLIT) -> StageResult:
    """A stage's config, its per-size metrics on `split` (the dev boards), up to `cases` failed episodes there and
    its training's advantages per cell.

    Cases are picked one per failure type, the most common type first (ties: the rule order), then a
    second of each type, and so on; within a type the earliest stored episode comes first.
    Raises LookupError when the run has no such stage.
    """
    stage = stage_at(session, run_id, stage_index)
    if stage is None:
        raise LookupError(f"run {run_id} has no stage {stage_index}")
    summary = stage_summaries(session, run_id, split, stage_index).get(stage_index)
    by_size = summary.by_size if summary else {}
    logs = session.exec(select(TrainingLog.metrics).where(TrainingLog.run_id == run_id,
                                                          TrainingLog.stage_index == stage_index))
    return StageResult(stage_index, stage.config, by_size,
                       _failure_cases(session, run_id, stage_index, cases, split) if cases > 0 else (),
                       _boards(session, run_id, stage_index, split), advantage.read(logs))


class NoEvidence(LookupError):
    """The stage an engineer reads holds fewer episodes on its split than its per-size metrics count: none, where
    a snapshot left them out. Read anyway, the engineer would propose on nothing, so the proposal fails instead."""


def require_boards(result: StageResult, run_id: int, split: Split) -> StageResult:
    """`result` when it holds every board its per-size metrics count on `split`; else `NoEvidence` naming the run,
    the stage and the split."""
    counted, held = result.total.episodes, len(result.boards)
    if counted and held == counted:
        return result
    what = (f"{held} of the {counted} {split} episodes its per-size metrics count (left out of a snapshot?)"
            if counted else f"no {split} evaluation")
    raise NoEvidence(f"run {run_id}'s stage {result.stage_index} holds {what}: the engineer would read no {split} "
                     "board, so it proposes nothing")


def _boards(session: Session, run_id: int, stage_index: int, split: Split) -> tuple[BoardOutcome, ...]:
    rows = session.exec(select(Episode.instance, Episode.valid, Episode.failure, Episode.optimal).where(
        Episode.run_id == run_id, Episode.stage_index == stage_index, Episode.split == split).order_by(Episode.id))
    return tuple(BoardOutcome.of(Instance.model_validate(inst), valid, failure, optimal)
                 for inst, valid, failure, optimal in rows)


def _failure_cases(session: Session, run_id: int, stage_index: int, n: int,
                   split: Split) -> tuple[FailureCase, ...]:
    failed = session.exec(select(Episode).where(
        Episode.run_id == run_id, Episode.stage_index == stage_index, Episode.split == split,
        Episode.valid == False,  # noqa: E712 (SQL, not Python)
    ).order_by(Episode.id)).all()
    by_type: dict[str, list[Episode]] = {}
    for ep in failed:
        by_type.setdefault(ep.failure or "unknown", []).append(ep)
    order = sorted(by_type, key=lambda f: (-len(by_type[f]), _failure_rank(f)))
    picked: list[Episode] = []
    for depth in range(n):
        picked += [by_type[f][depth] for f in order if depth < len(by_type[f])]
    return tuple(_case(ep) for ep in picked[:n])


def _case(ep: Episode) -> FailureCase:
    instance = Instance.model_validate(ep.instance)
    return FailureCase(instance, ep.completion, outcome_of(ep, instance))


def _failure_rank(name: str) -> int:
    order = [f.value for f in Failure]
    return order.index(name) if name in order else len(order)


# ---------------------------------------------------------------- the text


def build_context(evidence: Evidence, modules: ContextModules | None = None) -> str:
    """The context text: the sections `modules` turns on, in a fixed order, separated by blank lines."""
    modules = modules or ContextModules.paper_best()
    sections = []
    if modules.bookkeeping:
        sections.append(_bookkeeping(evidence))
    if modules.failure_breakdown:
        sections.append(_breakdown(evidence.current))
    if modules.history or modules.history_with_default:
        sections.append(_history(evidence, with_default=modules.history_with_default))
    if modules.failure_cases:
        sections.append(_cases(evidence.current))
    if modules.guideline:
        sections.append(guideline(evidence.current.config, evidence.agent_counts))
    if modules.hyperparameters:
        sections.append(_hyperparameters(evidence.hyperparameters))
    if modules.self_summary:
        sections.append(_self_summary(evidence.self_summary))
    if modules.measured:
        sections.append(_measured(evidence))
    return "\n\n".join(sections)


def _bookkeeping(ev: Evidence) -> str:
    return (f"## Round\n"
            f"You are choosing the environment config of stage {ev.round_index}, after stage "
            f"{ev.current.stage_index} was evaluated. Training stages left, this one included: {ev.rounds_left}. "
            f"Each stage trains on {ev.instances_per_stage or ev.current.config.num_instances} instances.")


def _breakdown(result: StageResult) -> str:
    """The stage's results per map size; where its boards had several agent counts, per agent count too."""
    head = f"## Failure breakdown of stage {result.stage_index} ({SPLIT} set, per map size)"
    if not result.by_size:
        return f"{head}\nNo {SPLIT} results were recorded for this stage."
    text = f"{head}\n{_results_table(result.by_size, 'size', result.total)}"
    by_agents = result.by_agents
    if len(by_agents) > 1:
        text += (f"\n\nThe same boards per agent count:\n"
                 f"{_results_table(by_agents, 'agents', Tally.total(by_agents.values()))}")
    return text


def _failure_types(results: list[Tally]) -> list[str]:
    """The failure types that occur in `results`, in the rule order (unknown names last, sorted)."""
    seen = {f for r in results for f, n in r.failures.items() if n}
    return sorted(seen, key=lambda f: (_failure_rank(f), f))


def _results_table(rows: dict[int, Tally], key: str, total: Tally) -> str:
    """One row per key (a map size, an agent count: `key` heads its column), then the `all` row, `total`."""
    keys = sorted(rows)
    kinds = _failure_types([rows[k] for k in keys])
    lines = [f"| {key} | episodes | valid | optimal | " + " | ".join(kinds) + " |" if kinds else
             f"| {key} | episodes | valid | optimal |", "|---" * (4 + len(kinds)) + "|"]
    for label, r in [*((str(k), rows[k]) for k in keys), ("all", total)]:
        cells = [label, str(r.episodes), _pct(r.valid_rate), _pct(r.optimal_rate),
                 *(str(r.failures.get(k, 0)) for k in kinds)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _history(ev: Evidence, *, with_default: bool) -> str:
    stages = [s for s in ev.history if with_default or s.stage_index != 0]
    head = "## Earlier stages (oldest first): config and results per map size"
    if not stages:
        return f"{head}\nNone yet."
    parts = [head]
    for s in stages:
        title = f"### Stage {s.stage_index}" + (" (the round-0 default config)" if s.stage_index == 0 else "")
        parts.append(f"{title}\n{_config_and_results(s)}")
    return "\n".join(parts)


def _config_and_results(result: StageResult) -> str:
    """One table of a stage's knobs and its results, size by size; the agent mix and the globals on a line above
    it."""
    config = result.config
    glob = ", ".join([f"{AGENT_RATIO} {agent_mix(config)}", *(f"{name} {getattr(config, name)}" for name in GLOBALS)])
    if config.random_share:
        glob += f", random_share {knob_text(config.random_share)}"
    lines = [glob, "| size | " + " | ".join(KNOBS) + " | valid | optimal | most common failure |",
             "|---" * (len(KNOBS) + 4) + "|"]
    for s in config.sizes:
        r = result.by_size.get(s)
        top = max(r.failures.items(), key=lambda kv: (kv[1], -_failure_rank(kv[0])), default=None) if r else None
        cells = [str(s), *(knob_text(getattr(config, k)[s]) for k in KNOBS),
                 _pct(r.valid_rate) if r else "-", _pct(r.optimal_rate) if r else "-",
                 f"{top[0]} ({top[1]})" if top and top[1] else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cases(result: StageResult) -> str:
    head = f"## Failed answers from stage {result.stage_index}"
    if not result.cases:
        return f"{head}\nNo failed answers were recorded."
    parts = [head]
    for n, case in enumerate(result.cases, 1):
        inst, outcome = case.instance, case.outcome
        answer = case.completion.strip()
        if len(answer) > ANSWER_CHARS:
            answer = answer[:ANSWER_CHARS] + f" ... ({len(answer) - ANSWER_CHARS} more characters)"
        failure = outcome.failure.value if outcome.failure else "none"
        parts.append(f"### Case {n}: size {inst.size}, {inst.num_agents} agents, {failure}\n"
                     f"Board (A, B, ... starts; a, b, ... goals; H holes):\n{inst.picture()}\n"
                     f"Answer:\n{answer or '(empty)'}\n"
                     f"Outcome: {outcome.message}")
    return "\n".join(parts)


def guideline(config: EnvConfig, counts: tuple[int, ...] | None = None) -> str:
    """What each knob does and its legal range, from `envsim.config` (the one source of truth); `counts`: the run's
    agent counts, the only keys `agent_ratio` may have (None: every count the rules allow)."""
    sizes = ", ".join(map(str, config.sizes))
    per_size = [f"- {k}: {KNOB_HELP[k]}; {knob_text(lo)} to {knob_text(hi)}" for k, (lo, hi) in KNOBS.items()]
    (least, most), (lo, hi) = AGENT_COUNTS, AGENT_RATIO_RANGE
    keys = f"agent counts {least} to {most}" if counts is None else \
        f"the run's agent counts {', '.join(map(str, counts))} only"
    globals_ = [f"- {AGENT_RATIO}: {KNOB_HELP[AGENT_RATIO]}; {keys}, each share {knob_text(lo)} to {knob_text(hi)}",
                *(f"- {k}: {KNOB_HELP[k]}; {lo} to {hi}" for k, (lo, hi) in GLOBALS.items())]
    return "\n".join([
        "## The knobs",
        f"Per map size (the keys are the map sizes {sizes}):", *per_size,
        "Global:", *globals_,
        f"A value outside its range is clamped into it, and data_ratio and {AGENT_RATIO} are rescaled to sum to 1.",
    ])


def _hyperparameters(hp: dict[str, Any] | None) -> str:
    head = "## Training hyperparameters"
    if not hp:
        return f"{head}\nNot given."
    lines = [f"- {k}: {json.dumps(v, sort_keys=True, default=str)}" for k, v in sorted(hp.items())]
    return "\n".join([head, *lines])


def _self_summary(summary: str | None) -> str:
    return "## Your summary of the earlier rounds\n" + (summary.strip() if summary and summary.strip() else "None yet.")


def _measured(ev: Evidence) -> str:
    head = f"## The current config measured on the policy (stage {ev.current.stage_index}'s checkpoint)"
    if ev.measured is None:
        return f"{head}\nNot measured."
    return f"{head}\n{measured_table(ev.measured)}"


def measured_table(result: ProbeResult, sizes: Sequence[int] | None = None) -> str:
    """A probe as text: how it was measured, then per size p, learnability, the boards with no valid answer and
    with every answer valid, and the verdict; then the signal share. `sizes` picks some (default all)."""
    first = next(iter(result.sizes.values()))
    lines = [f"Each size: {first.boards} boards drawn from the config, each answered {first.answers} times by "
             "sampling as training does. GRPO learns only from boards whose answers disagree: learnability is the "
             "mean over boards of p_b(1-p_b), p_b a board's share of valid answers (at most 0.25).",
             "| size | data_ratio | valid p | learnability | boards with no valid answer | boards all valid | "
             "verdict |", "|---" * 7 + "|"]
    for size in sizes if sizes is not None else result.sizes:
        m = result.sizes[size]
        lines.append(f"| {size} | {knob_text(result.data_ratio.get(size, 0.0))} | {_pct(m.p)} | "
                     f"{m.learnability:.3f} | {_pct(m.none_valid)} | {_pct(m.all_valid)} | {m.band} |")
    lines.append(f"Boards that carry signal, weighted by data_ratio: {_pct(result.signal_share)}.")
    return "\n".join(lines)


def _pct(x: float) -> str:
    return f"{x:.0%}"


def knob_text(x: float) -> str:
    """A knob value for people: at most 3 decimals, no trailing zeros (0.125, 0.2, 0)."""
    return f"{x:.3f}".rstrip("0").rstrip(".") or "0"


def agent_mix(config: EnvConfig) -> str:
    """The agent mix as the config's JSON writes it, the counts with a share: `{"2": 0.5, "3": 0.5}`."""
    return "{" + ", ".join(f'"{k}": {knob_text(v)}' for k, v in sorted(config.agent_ratio.items()) if v > 0) + "}"
