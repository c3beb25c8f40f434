"""The `levels` engineer: a self-evolving curriculum (SEC, as `bandit`) whose arms span difficulty, the settings that
move a stage's gain on this testbed, rather than (agent count, map size) cells.

- **Arms**, one bandit per knob: hole ratio `HOLES`, wait ratio `WAITS` (every size the same), and the agent mix
  `MIXES` over the run's agent counts (weighted toward the fewest, even, toward the most). A stage trains on one level
  of each knob.
- **Reward** of a trained stage: the mean |advantage| of its answers over every cell it trained on (TRL's own
  advantages, as `bandit` reads them: `StageResult.cells`), credited to the level of each knob the stage trained on;
  a stage whose config sits on no level of a knob (the run's initial config) teaches that knob nothing.
- **Value**: TD(0) per knob level, `Q <- ALPHA r + (1 - ALPHA) Q`, from the optimistic prior `PRIOR`, so a level
  never tried is tried.
- **Next stage**: per knob a level drawn from `exp(Q / TEMPERATURE)` with the proposal's seed (SEC samples its arms;
  a rejection moves the seed, so asked again it may draw other levels).

The same constants as `bandit` (its module doc says why they fit mean |advantage| here). It reads the training logs'
advantages of its run's stages and their configs; no probe, no dev board. A config the next stage's seed cannot fill
goes back size by size (`revert_unfillable`). A trained stage without the record fails the proposal, as in `bandit`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from envsim.config import EnvConfig, mix_text
from lab.context import Evidence, StageResult
from lab.engineers.answer import EngineerAnswer, FillCheck, answer_of, revert_unfillable, shares, with_changes
from lab.engineers.bandit import ALPHA, PRIOR, TEMPERATURE, boltzmann

HOLES = (0.05, 0.15, 0.3)
WAITS = (0.5, 0.75, 0.9)
MIXES = ("fewest", "even", "most")
KNOBS = ("holes", "waits", "agents")


def mix_of(name: str, counts: Sequence[int]) -> dict[int, float]:
    """The agent mix a level names over the run's counts: linear weights toward the fewest or the most, or even."""
    n = len(counts)
    weights = {"fewest": range(n, 0, -1), "even": [1] * n, "most": range(1, n + 1)}[name]
    return shares(dict(zip(sorted(counts), weights, strict=True)))


def level_of(config: EnvConfig, knob: str, counts: Sequence[int]) -> str | None:
    """The level of `knob` the config trained on (its name: `0.05`, `even`), or None where it sits on none."""
    if knob == "agents":
        return next((m for m in MIXES if mix_of(m, counts) == {k: v for k, v in config.agent_ratio.items() if v}),
                    None)
    ratios = set((config.hole_ratio if knob == "holes" else config.wait_ratio).values())
    levels = HOLES if knob == "holes" else WAITS
    return f"{ratios.pop():g}" if len(ratios) == 1 and next(iter(ratios)) in levels else None


def arms(knob: str) -> list[str]:
    return {"holes": [f"{h:g}" for h in HOLES], "waits": [f"{w:g}" for w in WAITS], "agents": list(MIXES)}[knob]


def reward(stage: StageResult) -> float | None:
    """A trained stage's mean |advantage| over every answer it trained on (None without any)."""
    cells = [c for c in (stage.cells or {}).values() if c.completions]
    completions = sum(c.completions for c in cells)
    return sum(c.abs_advantage for c in cells) / completions if completions else None


def values(stages: Sequence[StageResult], knob: str, counts: Sequence[int]) -> dict[str, float]:
    """Q of each level of `knob` after the trained stages, oldest first."""
    q = dict.fromkeys(arms(knob), PRIOR)
    for stage in stages:
        r, at = reward(stage), level_of(stage.config, knob, counts)
        if r is not None and at is not None:
            q[at] = ALPHA * r + (1 - ALPHA) * q[at]
    return q


def levels(evidence: Evidence, *, seed: int = 0, cannot_fill: FillCheck | None = None,
           **_options: Any) -> EngineerAnswer:
    """The next config: per knob a level drawn from its Boltzmann shares (module doc)."""
    current = evidence.current.config
    stages = (*evidence.history, evidence.current)
    if missing := [st.stage_index for st in stages if st.stage_index > 0 and st.cells is None]:
        return EngineerAnswer(prompt="", raw="", proposed=None, projection=None, rationale="", error=(
            f"the levels bandit reads each trained stage's GRPO advantages from its training logs, and stage(s) "
            f"{', '.join(map(str, missing))} recorded none: its Q values would rest on part of the run"))
    counts = evidence.agent_counts or current.agent_counts
    trained = [st for st in stages if st.stage_index > 0]
    rng = np.random.default_rng([seed, evidence.round_index])
    chosen, lines = {}, [f"SEC bandit over difficulty levels, one per knob: Q <- {ALPHA:g} r + {1 - ALPHA:g} Q per "
                         f"stage, r its mean |advantage|; prior {PRIOR:g}; a level drawn from exp(Q / "
                         f"{TEMPERATURE:g})"]
    for knob in KNOBS:
        q = values(trained, knob, counts)
        p = boltzmann(q)
        names = list(q)
        chosen[knob] = names[int(rng.choice(len(names), p=[p[n] for n in names]))]
        lines.append(f"{knob}: " + ", ".join(f"{n} Q {q[n]:.3f} p {p[n]:.2f}" for n in names)
                     + f" -> {chosen[knob]}")
    mix = mix_of(chosen["agents"], counts) if evidence.agent_counts is not None else dict(current.agent_ratio)
    config = with_changes(current, hole_ratio=dict.fromkeys(current.sizes, float(chosen["holes"])),
                          wait_ratio=dict.fromkeys(current.sizes, float(chosen["waits"])), agent_ratio=mix)
    lines.append(f"agent_ratio {mix_text(current.agent_ratio)} -> {mix_text(mix)}")
    config, reverted = revert_unfillable(config, current, cannot_fill)
    return answer_of(config, current, "\n".join(lines + reverted))
