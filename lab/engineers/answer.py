"""What every engineer returns (`EngineerAnswer`), and the pieces the engineers that build their config
themselves share: the answer of a config made by construction, and data shares in steps of 0.001."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from envsim.config import EnvConfig, Projection, project

if TYPE_CHECKING:
    from training.probe import ProbeResult

ProbeFn = Callable[[EnvConfig], "ProbeResult"]  # measures a config on the run's checkpoint (the propose job's)



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
    return {s: round(c * step, 6) for s, c in counts.items()}
