"""What every engineer returns (`EngineerAnswer`), and the pieces the engineers that build their config
themselves share: the answer of a config made by construction, data shares in steps of 0.001, the agent mix
weighted by learnability over the run's agent counts, and the sizes put back where the next stage's generator cannot
fill the config."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from envsim.config import AGENT_RATIO, EnvConfig, Projection, mix_text, project
from envsim.generator import Unfillable
from envsim.instance import Instance
from lab.context import Evidence, knob_text

if TYPE_CHECKING:
    from training.probe import ProbeResult

ProbeFn = Callable[[EnvConfig], "ProbeResult"]  # measures a config on the run's checkpoint (the propose job's)
FillCheck = Callable[[EnvConfig], Unfillable | None]  # why the next stage cannot fill a config (the loop's check)


@dataclass(frozen=True)
class EngineerAnswer:
    """What an engineer returned. `proposed` is the config as the answer gave it (None when unreadable),
    `projection` the legal config made of it (None when the proposal failed, and `error` says why)."""

    prompt: str
    raw: str
    proposed: dict[str, Any] | None
    projection: Projection | None
    rationale: str
    error: str | None = None
    attempts: int = 1
    compute: dict[str, Any] | None = None  # what measuring cost: a `storage.models.ProbeCompute`, as JSON
    replay: tuple[Instance, ...] = ()  # boards the next stage trains on as they are, beside its config's (learnability)


def with_changes(base: EnvConfig, **changes: Any) -> EnvConfig:
    """`base` with some fields changed, checked as a new config is (ranges, `data_ratio` summing to 1):
    `model_copy(update=...)` alone would skip `EnvConfig`'s validation."""
    return EnvConfig.model_validate(base.model_dump() | changes)


def answer_of(config: EnvConfig, base: EnvConfig, rationale: str) -> EngineerAnswer:
    """The answer of an engineer that builds its config itself (it is legal by construction)."""
    proposed = config.model_dump(mode="json")
    return EngineerAnswer(prompt="", raw=json.dumps(proposed, indent=2), proposed=proposed,
                          projection=project(proposed, base=base), rationale=rationale)


SHARE_STEP = 0.001


def shares(weights: dict[int, float], step: float = SHARE_STEP) -> dict[int, float]:
    """Weights as shares that are multiples of `step` and sum to 1 (largest remainder; ties: smaller size)."""
    units = round(1 / step)
    total = sum(weights.values())
    quotas = {s: w / total * units for s, w in weights.items()}
    counts = {s: math.floor(q) for s, q in quotas.items()}
    for s in sorted(quotas, key=lambda s: (counts[s] - quotas[s], s))[:units - sum(counts.values())]:
        counts[s] += 1
    return {s: round(count * step, 6) for s, count in counts.items()}


def learnable_mix(evidence: Evidence, floor: float, move: float = 1.0) -> tuple[dict[int, float], list[str]]:
    """The next stage's agent mix over the run's agent counts (`evidence.agent_counts`) and its rationale line (none
    where the mix stays): each count weighted by the learnability p(1-p) of its dev boards (p their valid rate),
    never below `floor` (a count without dev boards gets it), as the heuristic weights map sizes; the mix moves
    `move` of the way from the current shares toward those (a count outside the run's counts has none).

    Without agent counts (evidence made outside a run) the current mix stays; with one count every board has it."""
    base = evidence.current.config.agent_ratio
    counts = evidence.agent_counts
    if counts is None:
        return dict(base), []
    tallies = evidence.current.by_agents
    read = {k: tallies[k] for k in counts if k in tallies and tallies[k].episodes}
    target = shares({k: max(read[k].valid_rate * (1 - read[k].valid_rate), floor) if k in read else floor
                     for k in counts})
    mix = shares({k: base.get(k, 0.0) + move * (target[k] - base.get(k, 0.0)) for k in counts})
    if all(abs(mix.get(k, 0.0) - base.get(k, 0.0)) < SHARE_STEP for k in {*mix, *base}):
        return dict(base), []
    why = "; ".join(f"{k}: valid {read[k].valid_rate:.0%} of {read[k].episodes}, p(1-p) "
                    f"{read[k].valid_rate * (1 - read[k].valid_rate):.2f}" if k in read else f"{k}: no dev boards"
                    for k in counts)
    toward = "" if move == 1 else f" moved {move:g} of the way toward {mix_text(target)}"
    return mix, [f"{AGENT_RATIO} {mix_text(base)} -> {mix_text(mix)}{toward} (agent counts {list(counts)} by "
                 f"learnability p(1-p), floor {floor:g}: {why})"]


def revert_unfillable(config: EnvConfig, base: EnvConfig, cannot_fill: FillCheck | None) -> tuple[EnvConfig, list[str]]:
    """`config` with sizes put back to `base`'s hole and wait ratios until the next stage's generator can fill it,
    and one rationale line per size put back.

    A few probe or dev boards may be drawn where a stage's many cannot (a wait ratio the size rarely needs). Each
    round asks `cannot_fill`: the size it names goes back when its ratios changed, else the last changed size; it
    stops when the config fills, or when no changed size is left: then a changed agent mix goes back to `base`'s
    (where the config still cannot be filled, the caller's check fails the answer). Without `cannot_fill` the config
    is returned as it is."""
    changed = [s for s in base.sizes
               if (config.hole_ratio[s], config.wait_ratio[s]) != (base.hole_ratio[s], base.wait_ratio[s])]
    hole, wait = dict(config.hole_ratio), dict(config.wait_ratio)
    lines: list[str] = []
    if cannot_fill is None:
        return config, lines
    while changed:
        if (why := cannot_fill(config)) is None:
            return config, lines
        size = why.size if why.size in changed else changed[-1]
        changed.remove(size)
        hole[size], wait[size] = base.hole_ratio[size], base.wait_ratio[size]
        lines.append(f"size {size}: back to hole {knob_text(hole[size])}, wait {knob_text(wait[size])}: the "
                     f"generator could not fill the config ({why})")
        config = config.model_copy(update={"hole_ratio": dict(hole), "wait_ratio": dict(wait)})
    if config.agent_ratio != base.agent_ratio and (why := cannot_fill(config)) is not None:
        lines.append(f"{AGENT_RATIO}: back to {mix_text(base.agent_ratio)}: the generator could not fill the config "
                     f"({why})")
        config = config.model_copy(update={AGENT_RATIO: dict(base.agent_ratio)})
    return config, lines
