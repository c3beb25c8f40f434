"""Sampling for learnability: the `learnability` engineer samples candidate hole and wait ratios per size,
measures each on the policy (`training.probe`), keeps the most learnable and weights the sizes by learnability
(as in unsupervised environment design)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from envsim.config import KNOBS, EnvConfig
from lab.context import Evidence, knob_text
from lab.engineers.answer import EngineerAnswer, FillCheck, ProbeFn, answer_of, revert_unfillable, shares
from training.probe import ProbeResult  # the probe's numbers; torch loads only where a probe samples

# ---------------------------------------------------------------- sampling for learnability

LEARN_FLOOR = 0.02  # the least data weight a size gets (learnability is at most 0.25): no size is dropped
HOLE_DELTA = 0.1  # candidate hole ratios: the current one, this much fewer holes, this much more
WAIT_DELTA = 0.25  # and one candidate with the wait ratio moved this much toward the middle of its range
# Each candidate is probed on this many boards, each answered this many times (a GRPO group of the tiny policy):
# 8 sizes x 4 candidates x 4 boards x 8 answers = 1,024 sampled answers, within a quarter of a default stage's
# wall time on one CPU thread (benchmarks/bench_probe.py).
LEARN_BOARDS = 4
LEARN_ANSWERS = 8


def candidates(config: EnvConfig, size: int) -> list[tuple[float, float]]:
    """The (hole, wait) ratios the `learnability` engineer measures at `size`: the current pair first, then
    fewer and more holes, then another wait ratio; clipped to the legal ranges, each pair once."""
    (hole_lo, hole_hi), (wait_lo, wait_hi) = KNOBS["hole_ratio"], KNOBS["wait_ratio"]
    hole, wait = config.hole_ratio[size], config.wait_ratio[size]
    other_wait = wait + WAIT_DELTA if wait <= (wait_lo + wait_hi) / 2 else wait - WAIT_DELTA
    pairs = [(hole, wait), (hole - HOLE_DELTA, wait), (hole + HOLE_DELTA, wait), (hole, other_wait)]
    found: list[tuple[float, float]] = []
    for h, w in pairs:
        pair = (round(min(max(h, hole_lo), hole_hi), 3), round(min(max(w, wait_lo), wait_hi), 3))
        if pair not in found:
            found.append(pair)
    return found


def learnability(evidence: Evidence, *, seed: int = 0, probe_fn: ProbeFn | None = None,
                 cannot_fill: FillCheck | None = None, **_options: Any) -> EngineerAnswer:
    """Per size, measure each candidate (hole, wait) pair (`candidates`) with `probe_fn` (one size per probe),
    keep the most learnable (mean p_b(1 - p_b) over boards; a tie keeps the earlier, the current pair first),
    and set data_ratio in proportion to the kept learnability, never below `LEARN_FLOOR`.

    `probe_fn(config) -> ProbeResult` measures a one-size config on the run's checkpoint; the propose job
    passes one (`training.probe.measure`). A candidate the generator cannot fill is skipped, and with
    `cannot_fill` (the next stage's check) a size whose kept pair the stage's boards cannot fill goes back to
    its current ratios. The rationale
    names, per size, p and learnability of the kept and the next-best candidate; `compute` is what the probes
    cost (a probe found in the cache costs nothing).
    """
    base = evidence.current.config
    if probe_fn is None:
        return EngineerAnswer(prompt="", raw="", proposed=None, projection=None, rationale="",
                              error="the learnability engineer measures configs on the policy: it needs a probe "
                                    "(the propose job passes one)")
    hole, wait, weight = dict(base.hole_ratio), dict(base.wait_ratio), {}
    spent: list[ProbeResult] = []
    lines: list[str] = []
    for size in base.sizes:
        measured = _measure_candidates(base, size, probe_fn, spent)
        if not measured:
            weight[size] = LEARN_FLOOR
            lines.append(f"size {size}: no candidate could be generated; kept hole {knob_text(hole[size])}, "
                         f"wait {knob_text(wait[size])}")
            continue
        ranked = sorted(range(len(measured)), key=lambda i: (-measured[i][1].learnability, i))
        (h, w), kept = measured[ranked[0]]
        hole[size], wait[size] = h, w
        weight[size] = max(kept.learnability, LEARN_FLOOR)
        line = f"size {size}: hole {knob_text(h)}, wait {knob_text(w)} kept (p {kept.p:.0%}, learnability " \
               f"{kept.learnability:.3f})"
        if len(ranked) > 1:
            (h2, w2), second = measured[ranked[1]]
            line += f"; next best hole {knob_text(h2)}, wait {knob_text(w2)} (p {second.p:.0%}, learnability " \
                    f"{second.learnability:.3f})"
        lines.append(line)
    data = shares(weight)
    for size in base.sizes:
        lines[base.sizes.index(size)] += f"; data_ratio {knob_text(base.data_ratio[size])} -> {knob_text(data[size])}"
    config = EnvConfig(data_ratio=data, hole_ratio=hole, wait_ratio=wait, num_agents=base.num_agents,
                       num_instances=base.num_instances)
    config, reverted = revert_unfillable(config, base, cannot_fill)
    lines += reverted
    compute = compute_of(spent)
    lines.append(f"probe compute: {compute['completions']} sampled answers, {compute['seconds']:.1f} s "
                 f"({compute['probes']} probes, {compute['cached']} cached)")
    return replace(answer_of(config, base, "\n".join(lines)), compute=compute)


def _measure_candidates(base: EnvConfig, size: int, probe_fn: ProbeFn,
                        spent: list[ProbeResult]) -> list[tuple[tuple[float, float], Any]]:
    """Each candidate pair at `size` with its measurement (`SizeProbe`), probed as a one-size config; a pair the
    generator cannot make is no candidate. Every probe is added to `spent`."""
    from envsim.generator import GenerationError

    measured = []
    for h, w in candidates(base, size):
        one = EnvConfig(data_ratio={size: 1.0}, hole_ratio={size: h}, wait_ratio={size: w},
                        num_agents=base.num_agents, num_instances=base.num_instances)
        try:
            spent.append(probe_fn(one))
        except GenerationError:
            continue
        measured.append(((h, w), spent[-1].sizes[size]))
    return measured


def compute_of(results: list[ProbeResult]) -> dict[str, Any]:
    """What probes cost: the answers sampled and the seconds spent by those not found in the cache."""
    new = [r for r in results if not r.cached]
    return {"completions": sum(r.completions for r in new), "seconds": round(sum(r.seconds for r in new), 3),
            "probes": len(results), "cached": len(results) - len(new)}
