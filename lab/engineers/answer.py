"""What every engineer returns (`EngineerAnswer`), and the pieces the engineers that build their config
themselves share: the answer of a config made by construction, data shares in steps of 0.001, and the sizes put
back where the next stage's generator cannot fill the config."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from envsim.config import EnvConfig, Projection, project
from envsim.generator import Unfillable
from lab.context import knob_text

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
    compute: dict[str, Any] | None = None  # what measuring cost: {"completions", "seconds", "probes", "cached"}


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


def revert_unfillable(config: EnvConfig, base: EnvConfig, cannot_fill: FillCheck | None) -> tuple[EnvConfig, list[str]]:
    """`config` with sizes put back to `base`'s hole and wait ratios until the next stage's generator can fill it,
    and one rationale line per size put back.

    A few probe or dev boards may be drawn where a stage's many cannot (a wait ratio the size rarely needs). Each
    round asks `cannot_fill`: the size it names goes back when its ratios changed, else the last changed size; it
    stops when the config fills, or when no changed size is left (the caller's check then fails the answer).
    Without `cannot_fill` the config is returned as it is."""
    changed = [s for s in base.sizes
               if (config.hole_ratio[s], config.wait_ratio[s]) != (base.hole_ratio[s], base.wait_ratio[s])]
    hole, wait = dict(config.hole_ratio), dict(config.wait_ratio)
    lines: list[str] = []
    while cannot_fill is not None and changed and (why := cannot_fill(config)) is not None:
        size = why.size if why.size in changed else changed[-1]
        changed.remove(size)
        hole[size], wait[size] = base.hole_ratio[size], base.wait_ratio[size]
        lines.append(f"size {size}: back to hole {knob_text(hole[size])}, wait {knob_text(wait[size])}: the "
                     f"generator could not fill the config ({why})")
        config = config.model_copy(update={"hole_ratio": dict(hole), "wait_ratio": dict(wait)})
    return config, lines
