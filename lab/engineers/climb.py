"""The `climb` engineer: keeps what works. It starts from the best config it knows and steps one knob at a time by
what its own earlier stages measured on the dev boards, so a lever such as "fewer holes" is found by the run itself.

- **What a stage is worth**: its dev gain, the stage's pooled dev valid rate minus the stage's before (what training
  on its config added). Stage 0 trains nothing, so it has no gain.
- **The best config it knows**: the config of the trained stage with the largest gain, where that gain is positive;
  before any stage gained, the config in force.
- **The knob it moves**: round by round in turn, `KNOBS`: the hole ratio (every size by `HOLE_STEP`), the wait ratio
  (every size by `WAIT_STEP`), and the agent mix (`MIX_STEP` of the shares moved from the fewest agents to the most,
  or back). One knob a stage, so each gain answers for one move.
- **Which way**: the way this knob last moved, kept where the stage that moved it gained more than the stage before
  it, reversed where it gained less; a knob never moved yet goes the way the seed draws (a rejection moves the seed,
  so asked again it may try the other way). At a range's end a step is cut to what is left, and a knob that cannot
  move that way moves the other.

It reads the dev results of its run's stages (their pooled rates) and their configs, nothing else: no probe, no
training log. A config the next stage's seed cannot fill goes back size by size (`revert_unfillable`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from envsim.config import EnvConfig, mix_text
from lab.context import Evidence, StageResult, knob_text
from lab.engineers.answer import EngineerAnswer, FillCheck, answer_of, revert_unfillable, shares, with_changes

KNOBS = ("holes", "waits", "agents")
HOLE_STEP = 0.05
WAIT_STEP = 0.1
MIX_STEP = 0.1
HOLE_RANGE = (0.0, 0.5)
WAIT_RANGE = (0.0, 1.0)


def gains(stages: Sequence[StageResult]) -> dict[int, float]:
    """Each trained stage's dev gain (its pooled valid rate minus the stage's before), by stage index."""
    return {b.stage_index: b.total.valid_rate - a.total.valid_rate
            for a, b in zip(stages, stages[1:], strict=False) if b.stage_index > 0 and a.total.episodes
            and b.total.episodes}


def level(config: EnvConfig, knob: str) -> float:
    """Where a config sits on a knob: the mean hole or wait ratio over its sizes, or its mix's mean agent count."""
    if knob == "agents":
        return sum(k * share for k, share in config.agent_ratio.items())
    ratios = config.hole_ratio if knob == "holes" else config.wait_ratio
    return sum(ratios.values()) / len(ratios)


def last_move(stages: Sequence[StageResult], knob: str) -> int | None:
    """The direction (+1 or -1) the knob last moved, judged by the gains: kept where the stage that moved it gained
    more than the stage before it, reversed where it gained less or as much; None where it never moved between two
    trained stages with gains."""
    g = gains(stages)
    for a, b in reversed(list(zip(stages, stages[1:], strict=False))):
        moved = level(b.config, knob) - level(a.config, knob)
        if abs(moved) > 1e-9 and b.stage_index in g and a.stage_index in g:
            direction = 1 if moved > 0 else -1
            return direction if g[b.stage_index] > g[a.stage_index] else -direction
    return None


def step(config: EnvConfig, knob: str, direction: int, counts: Sequence[int]) -> EnvConfig:
    """The config with one knob stepped `direction`, cut at its range's end (unchanged where nothing is left)."""
    if knob == "agents":
        few, many = (min(counts), max(counts)) if direction > 0 else (max(counts), min(counts))
        mix = {k: config.agent_ratio.get(k, 0.0) for k in counts}
        moved = min(MIX_STEP, mix[few])
        mix[few] -= moved
        mix[many] += moved
        return with_changes(config, agent_ratio=shares({k: v for k, v in mix.items() if v > 0} or mix))
    field, size, (low, high) = (("hole_ratio", HOLE_STEP, HOLE_RANGE) if knob == "holes"
                                else ("wait_ratio", WAIT_STEP, WAIT_RANGE))
    ratios = getattr(config, field)
    return with_changes(config, **{field: {s: round(min(high, max(low, r + direction * size)), 4)
                                           for s, r in ratios.items()}})


def climb(evidence: Evidence, *, seed: int = 0, cannot_fill: FillCheck | None = None,
          **_options: Any) -> EngineerAnswer:
    """The next config: the best config known, one knob stepped (module doc)."""
    stages = (*evidence.history, evidence.current)
    current = evidence.current.config
    g = gains(stages)
    best_stage = max(g, key=lambda k: (g[k], k)) if g else None
    kept = best_stage is not None and g[best_stage] > 0
    best = next(st.config for st in stages if st.stage_index == best_stage) if kept else current
    knob = KNOBS[(evidence.round_index - 1) % len(KNOBS)]
    known = last_move(stages, knob)
    direction = known if known is not None else int(np.random.default_rng([seed, evidence.round_index])
                                                     .choice([-1, 1]))
    counts = evidence.agent_counts or current.agent_counts
    config = step(best, knob, direction, counts)
    why = ("the way the seed drew (this knob has not moved yet)" if known is None else
           "the way that last gained more" if known == _raw_last(stages, knob) else
           "back: the last move this way gained less")
    if config == best:
        direction = -direction
        config = step(best, knob, direction, counts)
        why += "; at the end of its range, so the other way"
    lines = ["dev gains of the trained stages: " + (", ".join(f"stage {k}: {v * 100:+.2f} points"
                                                             for k, v in sorted(g.items())) or "none yet"),
             f"from the config of stage {best_stage} (its gain was the largest)" if kept else
             "from the config in force (no stage has gained yet)",
             f"{knob} {'up' if direction > 0 else 'down'}: {why}: {_moved(best, config, knob)}"]
    config, reverted = revert_unfillable(config, current, cannot_fill)
    return answer_of(config, current, "\n".join(lines + reverted))


def _raw_last(stages: Sequence[StageResult], knob: str) -> int | None:
    """The direction the knob last moved, whatever it gained."""
    for a, b in reversed(list(zip(stages, stages[1:], strict=False))):
        moved = level(b.config, knob) - level(a.config, knob)
        if abs(moved) > 1e-9:
            return 1 if moved > 0 else -1
    return None


def _moved(before: EnvConfig, after: EnvConfig, knob: str) -> str:
    if knob == "agents":
        return f"agent_ratio {mix_text(before.agent_ratio)} -> {mix_text(after.agent_ratio)}"
    field = "hole_ratio" if knob == "holes" else "wait_ratio"
    return f"{field} {knob_text(level(before, knob))} -> {knob_text(level(after, knob))} (mean over sizes)"
