"""The baselines: `fixed` keeps the current config (the paper's fixed-environment baseline), `random` draws a
legal config from the seed and the round (the paper's random baseline), and `heuristic` is a transparent
curriculum rule whose rationale has one line per change it makes."""

from __future__ import annotations

from typing import Any

import numpy as np

from envsim.config import KNOBS, EnvConfig
from envsim.scoring import Tally
from lab.context import Evidence, knob_text
from lab.engineers.answer import (
    SHARE_STEP,
    EngineerAnswer,
    FillCheck,
    answer_of,
    learnable_mix,
    shares,
    with_changes,
)

# ---------------------------------------------------------------- fixed and random baselines


def fixed(evidence: Evidence, *, seed: int = 0, **_options: Any) -> EngineerAnswer:
    """Keep the current config: the paper's fixed-environment baseline."""
    config = evidence.current.config
    return answer_of(config, config, "fixed environment: keeps the current config")


RANDOM_DRAWS = 10  # the random engineer's draws per proposal before it gives up on a config the generator can fill


def random_config(evidence: Evidence, *, seed: int, cannot_fill: FillCheck | None = None,
                  **_options: Any) -> EngineerAnswer:
    """A random legal config from (seed, round): data shares from a flat Dirichlet, hole and wait ratios
    uniform over their ranges, rounded to 0.001 and 0.01, then agent shares from a flat Dirichlet over the run's
    agent counts (`evidence.agent_counts`: one count takes every board and draws nothing; none given keeps the
    mix); the instance count is kept.

    Some legal configs cannot be generated (3x3 boards with no holes rarely need a wait, so a wait ratio of 0.62
    there cannot be met). With `cannot_fill` (the loop passes the generator's check for the next stage's
    seed), such a draw is drawn again, up to `RANDOM_DRAWS` draws, so the random baseline trains on a random
    config rather than failing; the rationale names the draws it skipped and why.
    """
    base = evidence.current.config
    skipped: list[str] = []
    for draw in range(RANDOM_DRAWS):
        rng = np.random.default_rng([seed, evidence.round_index, *([draw] if draw else [])])
        config = _random_draw(base, rng, evidence.agent_counts)
        why = cannot_fill(config) if cannot_fill is not None else None
        if why is None:
            said = f"random baseline: a config drawn from seed {seed} and round {evidence.round_index}"
            if skipped:
                said += (f" (draw {draw + 1}: the generator could not fill the {len(skipped)} before it; "
                         f"the first: {skipped[0]})")
            return answer_of(config, base, said)
        skipped.append(why)
    error = f"none of {RANDOM_DRAWS} random configs could be generated; the first: {skipped[0]}"
    return EngineerAnswer(prompt="", raw="", proposed=None, projection=None, rationale="", error=error)


def _random_draw(base: EnvConfig, rng: np.random.Generator, counts: tuple[int, ...] | None) -> EnvConfig:
    """One draw; the agent shares are drawn last, so the per-size knobs are those a draw without them makes."""
    sizes = base.sizes
    data = shares(dict(zip(sizes, rng.dirichlet(np.ones(len(sizes))).tolist(), strict=True)))
    (hole_lo, hole_hi), (wait_lo, wait_hi) = KNOBS["hole_ratio"], KNOBS["wait_ratio"]
    hole = {s: round(float(rng.uniform(hole_lo, hole_hi)), 2) for s in sizes}
    wait = {s: round(float(rng.uniform(wait_lo, wait_hi)), 2) for s in sizes}
    mix = dict(base.agent_ratio) if counts is None else {counts[0]: 1.0} if len(counts) == 1 else \
        shares(dict(zip(counts, rng.dirichlet(np.ones(len(counts))).tolist(), strict=True)))
    return with_changes(base, data_ratio=data, hole_ratio=hole, wait_ratio=wait, agent_ratio=mix)


# ---------------------------------------------------------------- a transparent curriculum rule

FLOOR = 0.05  # the least learnability weight: mastered and unsolved sizes keep some data
UNLEARNED = 0.2  # a valid rate below this: the size is not learned yet
MASTERED = 0.9  # a valid rate at or above this: the size is mastered
DOMINANT = 0.5  # a failure kind "dominates" at a size when it is at least this share of the failures
HOLE_STEP = 0.05
WAIT_STEP = 0.1
CONFLICTS = ("vertex_conflict", "edge_conflict")


def heuristic(evidence: Evidence, *, seed: int = 0, **_options: Any) -> EngineerAnswer:
    """A deterministic curriculum rule over the current stage's dev results (what the engineer reads), size by size:

    - data_ratio by learnability p(1-p), p the valid rate, never below `FLOOR` (keeps what works);
    - wait_ratio + `WAIT_STEP` where conflicts are at least half of the failures;
    - hole_ratio - `HOLE_STEP` where holes are at least half of the failures and p < `UNLEARNED`,
      hole_ratio + `HOLE_STEP` where p >= `MASTERED`.

    A size without dev episodes keeps its hole and wait ratios and gets the floor weight. The agent mix follows
    the same learnability over the run's agent counts (`learnable_mix`: a count without dev boards gets the floor).
    """
    base = evidence.current.config
    results = evidence.current.by_size
    known = {s: r for s, r in results.items() if s in base.data_ratio and r.episodes}
    data = shares({s: max(known[s].valid_rate * (1 - known[s].valid_rate), FLOOR) if s in known else FLOOR
                   for s in base.sizes})
    if all(abs(data[s] - base.data_ratio[s]) < SHARE_STEP for s in base.sizes):
        data = dict(base.data_ratio)  # a difference below the rounding step is no change
    hole, wait = dict(base.hole_ratio), dict(base.wait_ratio)
    (hole_lo, hole_hi), wait_hi = KNOBS["hole_ratio"], KNOBS["wait_ratio"][1]
    lines: list[str] = []
    for s in base.sizes:
        if data[s] != base.data_ratio[s]:
            lines.append(f"size {s}: data_ratio {knob_text(base.data_ratio[s])} -> {knob_text(data[s])} "
                         f"({_learnability(known.get(s))})")
        r = known.get(s)
        if r is None:
            continue
        p, failed = r.valid_rate, r.episodes - r.valid
        conflicts = sum(r.failures.get(k, 0) for k in CONFLICTS)
        holes = r.failures.get("hole", 0)
        if failed and conflicts >= DOMINANT * failed and wait[s] < wait_hi:
            wait[s] = round(min(wait[s] + WAIT_STEP, wait_hi), 3)
            lines.append(f"size {s}: wait_ratio {knob_text(base.wait_ratio[s])} -> {knob_text(wait[s])} "
                         f"(conflicts are {conflicts} of {failed} failures)")
        if failed and holes >= DOMINANT * failed and p < UNLEARNED and hole[s] > hole_lo:
            hole[s] = round(max(hole[s] - HOLE_STEP, hole_lo), 3)
            lines.append(f"size {s}: hole_ratio {knob_text(base.hole_ratio[s])} -> {knob_text(hole[s])} "
                         f"(valid {p:.0%} and holes are {holes} of {failed} failures)")
        elif p >= MASTERED and hole[s] < hole_hi:
            hole[s] = round(min(hole[s] + HOLE_STEP, hole_hi), 3)
            lines.append(f"size {s}: hole_ratio {knob_text(base.hole_ratio[s])} -> {knob_text(hole[s])} "
                         f"(valid {p:.0%}: mastered, so harder boards)")
    mix, said = learnable_mix(evidence, FLOOR)
    config = with_changes(base, data_ratio=data, hole_ratio=hole, wait_ratio=wait, agent_ratio=mix)
    return answer_of(config, base, "\n".join(lines + said) or "no change: nothing in the dev results calls for one")


def _learnability(r: Tally | None) -> str:
    if r is None or r.episodes == 0:
        return f"no dev episodes: floor weight {FLOOR:g}"
    p = r.valid_rate
    if p * (1 - p) < FLOOR:
        return f"valid {p:.0%}: p(1-p) = {p * (1 - p):.2f} is below the floor weight {FLOOR:g}"
    return f"valid {p:.0%}: learnability p(1-p) = {p * (1 - p):.2f}"
