"""The `evidence` engineer: reads the dev failures board by board and moves each size's knobs toward them.

What the paper found to work: environment updates that rest on failure evidence and keep the configurations
that already work. Per map size, from the current stage's dev boards (size, hole ratio, whether the optimal plan
needs a wait, the failure type):

- `hole_ratio` moves `MOVE` of the way toward where the policy fails but sometimes succeeds: the boards are
  binned by hole ratio (`HOLE_BINS`), a bin with both valid and failed boards weighs `valid * failed / boards`
  (its learnability times its boards), and the target is the weighted mean hole ratio of those bins' boards.
  Where no bin is mixed: every board failed (target `HOLE_PROBE` fewer holes), none did (`HOLE_PROBE` more), or
  the boundary between them (the mean of the valid boards' mean hole ratio and the failed boards').
- `wait_ratio` moves `MOVE` of the way toward the share of wait boards among the failures.
- `data_ratio` is in proportion to the failures, tempered (`failures ** (1 / TEMPERATURE)`) and never below
  `FLOOR`; with no failure anywhere the shares are kept.
- A size whose config works is kept: its dev valid rate rose by at least `KEEP_GAIN` since the previous stage,
  so its hole and wait ratios stay (its data share still follows the failures).
- `agent_ratio` moves `MOVE` of the way toward the learning signal of each of the run's agent counts: shares by
  p(1-p) of that count's dev boards, never below `FLOOR` (`answer.learnable_mix`).

No probe: it spends no compute beyond the dev evaluation every stage has. Its rationale cites the counts it used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from envsim.config import KNOBS
from lab.context import BoardOutcome, Evidence, knob_text
from lab.engineers.answer import (
    EngineerAnswer,
    FillCheck,
    answer_of,
    learnable_mix,
    revert_unfillable,
    shares,
    with_changes,
)
from lab.engineers.needs import Needs
from storage.settings import RunSettings

HOLE_BINS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)  # bin edges of the boards' hole ratios; the last bin holds 0.5
MOVE = 0.5  # each knob moves this share of the way from its current value toward its target
HOLE_PROBE = 0.1  # with no bin of mixed outcomes: the target is this many fewer (all failed) or more (none) holes
TEMPERATURE = 2.0  # data weight = failures ** (1 / TEMPERATURE): 1 is plain proportion, higher is flatter
FLOOR = 0.04  # the least data share a size gets: no size is dropped
KEEP_GAIN = 0.1  # a size's dev valid rate that rose by this much since the previous stage: its config works


@dataclass(frozen=True)
class SizeReading:
    """What the evidence engineer read at one size: its boards, failures, wait boards among them, failures per
    type, and the hole ratio it aims at with the counts of the bins it weighed."""

    boards: int
    failed: int
    wait_failed: int
    types: dict[str, int]
    hole_target: float | None
    bins: tuple[tuple[float, float, int, int], ...]  # (lo, hi, boards, failed) of each bin with mixed outcomes


def read_size(boards: list[BoardOutcome], current_hole: float) -> SizeReading:
    """The counts of one size's dev boards and the hole ratio its failures point to (`current_hole` moved by
    `HOLE_PROBE` when no bin has both outcomes)."""
    failed = [b for b in boards if not b.valid]
    types: dict[str, int] = {}
    for b in failed:
        types[b.failure or "unknown"] = types.get(b.failure or "unknown", 0) + 1
    mixed, weight, weighted = [], 0.0, 0.0
    for i, (lo, hi) in enumerate(zip(HOLE_BINS, HOLE_BINS[1:], strict=False)):
        last = i == len(HOLE_BINS) - 2
        inside = [b for b in boards if lo <= b.hole_ratio < hi or (last and b.hole_ratio == hi)]
        n, f = len(inside), sum(not b.valid for b in inside)
        if 0 < f < n:
            w = (n - f) * f / n
            mixed.append((lo, hi, n, f))
            weight += w
            weighted += w * sum(b.hole_ratio for b in inside) / n
    lo_knob, hi_knob = KNOBS["hole_ratio"]
    valid = [b for b in boards if b.valid]
    if weight:
        target = weighted / weight
    elif not boards:
        target = None
    elif failed and valid:
        target = (sum(b.hole_ratio for b in valid) / len(valid) + sum(b.hole_ratio for b in failed) / len(failed)) / 2
    else:
        target = current_hole - HOLE_PROBE if failed else current_hole + HOLE_PROBE
    if target is not None:
        target = min(max(target, lo_knob), hi_knob)
    return SizeReading(len(boards), len(failed), sum(b.needs_wait for b in failed), types, target, tuple(mixed))


def _toward(current: float, target: float, knob: str) -> float:
    lo, hi = KNOBS[knob]
    return round(min(max(current + MOVE * (target - current), lo), hi), 2)


def evidence_engineer(evidence: Evidence, *, seed: int = 0,
                      cannot_fill: FillCheck | None = None,
                      **_options: Any) -> EngineerAnswer:
    """Per size, move hole and wait ratios toward the dev failures and weight the data by them (module doc).

    With `cannot_fill` (the next stage's check), a size whose new ratios the stage's boards cannot fill goes back
    to its current ratios (`revert_unfillable`: the size the generator names first, else the last changed) until
    the config fills.
    """
    base = evidence.current.config
    by_size: dict[int, list[BoardOutcome]] = {}
    for board in evidence.current.boards:
        by_size.setdefault(board.size, []).append(board)
    previous = evidence.history[-1].by_size if evidence.history else {}
    readings = {s: read_size(by_size.get(s, []), base.hole_ratio[s]) for s in base.sizes}
    total_failed = sum(r.failed for r in readings.values())
    hole, wait = dict(base.hole_ratio), dict(base.wait_ratio)
    lines: list[str] = []
    for s in base.sizes:
        r = readings[s]
        if not r.boards:
            lines.append(f"size {s}: no dev boards to read: hole {knob_text(hole[s])}, wait {knob_text(wait[s])} kept")
            continue
        line = f"size {s}: {r.failed} of {r.boards} dev boards failed"
        if r.types:
            line += " (" + ", ".join(f"{k} {n}" for k, n in sorted(r.types.items(), key=lambda kv: (-kv[1], kv[0])))
            line += ")"
        tally, before = evidence.current.by_size.get(s), previous.get(s)
        if tally and before and before.episodes and tally.valid_rate - before.valid_rate >= KEEP_GAIN - 1e-9:
            lines.append(f"{line}; valid {before.valid_rate:.0%} -> {tally.valid_rate:.0%} since stage "
                         f"{evidence.history[-1].stage_index}: the config works, hole {knob_text(hole[s])} and wait "
                         f"{knob_text(wait[s])} kept")
            continue
        if r.failed:
            target = r.wait_failed / r.failed
            wait[s] = _toward(base.wait_ratio[s], target, "wait_ratio")
            line += (f"; {r.wait_failed} of its {r.failed} failures need a wait: wait_ratio "
                     f"{knob_text(base.wait_ratio[s])} -> {knob_text(wait[s])} (toward {target:.2f})")
        if r.hole_target is not None:
            hole[s] = _toward(base.hole_ratio[s], r.hole_target, "hole_ratio")
            if r.bins:
                where = ", ".join(f"holes {lo:.1f}-{hi:.1f} fail {f} of {n}" for lo, hi, n, f in r.bins)
            elif r.failed == r.boards or not r.failed:
                where = "every board failed" if r.failed else "no board failed"
            else:
                where = "no hole bin holds both outcomes: between the valid and the failed boards' holes"
            line += (f"; {where}: hole_ratio {knob_text(base.hole_ratio[s])} -> {knob_text(hole[s])} "
                     f"(toward {r.hole_target:.2f})")
        lines.append(line)
    data = dict(base.data_ratio)
    if total_failed:
        weights = {s: readings[s].failed ** (1 / TEMPERATURE) for s in base.sizes}
        total = sum(weights.values())
        data = shares({s: max(w / total, FLOOR) for s, w in weights.items()})
        lines.append("data_ratio by failures ** (1/" + f"{TEMPERATURE:g}), floor {FLOOR:g} ({total_failed} failures): "
                     + ", ".join(f"{s}: {knob_text(base.data_ratio[s])} -> {knob_text(data[s])}" for s in base.sizes))
    else:
        read = sum(r.boards for r in readings.values())
        lines.append("no dev board failed: data_ratio kept" if read else "no dev boards to read: data_ratio kept")
    mix, said = learnable_mix(evidence, FLOOR, MOVE)
    config = with_changes(base, data_ratio=data, hole_ratio=hole, wait_ratio=wait, agent_ratio=mix)
    config, reverted = revert_unfillable(config, base, cannot_fill)
    return answer_of(config, base, "\n".join(lines + said + reverted))


def evidence_needs(_settings: RunSettings) -> Needs:
    """Every dev board of the stage it follows."""
    return Needs(reads_episodes=True)
