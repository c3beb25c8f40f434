"""How fast `score_batch` scores episodes, against the step-by-step `score` in the same run.

Run: `python benchmarks/bench_scoring.py [--episodes 100000] [--sample 2000] [--repeats 3] [--seed 0]`.

Builds seeded random instances (sizes 3..10, 2-5 agents, random holes; no solver needed) and random plans,
half of them walks towards the goals so that many episodes play to the end and some are valid. Times
`score_batch` end to end (from Python objects) on one core, best of the repeats, and the step-by-step `score`
on a sample; prints agent-steps per second for both and their ratio, checks that both agree on the sample,
and exits 1 if the batch path is under 5 million agent-steps per second or they disagree.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"  # one core: set before numpy is imported
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runs from a checkout without an install

import argparse  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any, TypeVar  # noqa: E402

import numpy as np  # noqa: E402

from envsim.instance import Instance  # noqa: E402
from envsim.parser import Plan  # noqa: E402
from envsim.rules import ACTIONS, Failure  # noqa: E402
from envsim.scoring import BatchScores, score, score_batch  # noqa: E402

TARGET = 5_000_000  # agent-steps per second, one core
T = TypeVar("T")


def random_instance(rng: np.random.Generator) -> Instance:
    """A well-formed board: distinct starts, distinct goals (a goal may be another agent's start), up to 30%
    of the remaining cells holes."""
    size = int(rng.integers(3, 11))
    k = int(rng.integers(2, 6))
    cells = [divmod(int(c), size) for c in range(size * size)]
    starts = [cells[c] for c in rng.permutation(len(cells))[:k]]
    goals = starts
    while any(s == g for s, g in zip(starts, goals, strict=True)):
        goals = [cells[c] for c in rng.permutation(len(cells))[:k]]
    free = sorted(set(cells) - set(starts) - set(goals))
    holes = [free[c] for c in rng.permutation(len(free))[:int(rng.uniform(0, 0.3) * len(free))]]
    return Instance(size=size, holes=tuple(sorted(holes)), starts=tuple(starts), goals=tuple(goals))


def random_plan(instance: Instance, rng: np.random.Generator) -> Plan:
    """Uniform random words, or a shuffled shortest walk to the goal with a few WAITs (half and half)."""
    if rng.random() < 0.5:
        return tuple(tuple(ACTIONS[a] for a in rng.integers(0, 5, rng.integers(0, 2 * instance.size + 3)))
                     for _ in instance.starts)
    plan = []
    for (sr, sc), (gr, gc) in zip(instance.starts, instance.goals, strict=True):
        walk = ["DOWN" if gr > sr else "UP"] * abs(gr - sr) + ["RIGHT" if gc > sc else "LEFT"] * abs(gc - sc)
        walk += ["WAIT"] * int(rng.integers(0, 3))
        plan.append(tuple(walk[i] for i in rng.permutation(len(walk))))
    return tuple(plan)


def agreement(batch: BatchScores, instances: list[Instance], plans: list[Plan]) -> int:
    """How many of the first `len(plans)` episodes the batch scores differently from `score`."""
    failures = list(Failure)
    wrong = 0
    for e, (instance, plan) in enumerate(zip(instances, plans, strict=True)):
        o = score(instance, plan)
        wrong += (batch.valid[e], batch.optimal[e], batch.soc_optimal[e],
                  failures[batch.failure[e]] if batch.failure[e] >= 0 else None,
                  batch.failure_time[e] if batch.failure_time[e] >= 0 else None,
                  batch.makespan[e] if batch.makespan[e] >= 0 else None,
                  batch.soc[e] if batch.soc[e] >= 0 else None, batch.isr[e]) != (
            o.valid, o.optimal, o.soc_optimal, o.failure, o.failure_time, o.makespan, o.soc, o.isr)
    return wrong


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=100_000)
    ap.add_argument("--sample", type=int, default=2_000, help="episodes for the step-by-step baseline")
    ap.add_argument("--repeats", type=int, default=3, help="batch timings; the best is reported")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    instances = [random_instance(rng) for _ in range(args.episodes)]
    plans = [random_plan(instance, rng) for instance in instances]
    print(f"built {args.episodes:,} episodes in {time.perf_counter() - t0:.1f} s")

    walls, cpus = [], []
    for _ in range(args.repeats):
        batch, wall, cpu = timed(score_batch, instances, plans)
        walls.append(wall)
        cpus.append(cpu)
    batch_rate, batch_wall_rate = batch.agent_steps / min(cpus), batch.agent_steps / min(walls)

    sample_instances, sample_plans = instances[:args.sample], plans[:args.sample]
    sample_steps = score_batch(sample_instances, sample_plans).agent_steps
    _, scalar_wall, scalar_cpu = timed(lambda: list(map(score, sample_instances, sample_plans)))
    scalar_rate = sample_steps / scalar_cpu
    mismatches = agreement(batch, sample_instances, sample_plans)

    shares = np.bincount(batch.failure + 1, minlength=len(Failure) + 1) / len(batch.failure)
    print(f"episodes             {args.episodes:>14,}   agent-steps {batch.agent_steps:,}; valid {shares[0]:.1%}, "
          + ", ".join(f"{f.value} {s:.1%}" for f, s in zip(Failure, shares[1:], strict=True) if s))
    print(f"score_batch          {batch_rate:>14,.0f} agent-steps/s   (best of {args.repeats}: {min(cpus):.3f} s CPU; "
          f"wall {min(walls):.3f} s = {batch_wall_rate:,.0f}/s; all CPU: {', '.join(f'{c:.3f}' for c in cpus)})")
    print(f"score (baseline)     {scalar_rate:>14,.0f} agent-steps/s   ({args.sample:,} episodes, "
          f"{sample_steps:,} agent-steps in {scalar_cpu:.3f} s CPU, {scalar_wall:.3f} s wall)")
    print(f"ratio batch/score    {batch_rate / scalar_rate:>14.1f}x")
    print(f"target               {TARGET:>14,} agent-steps/s   {'met' if batch_rate >= TARGET else 'MISSED'}")
    print(f"agreement on sample  {args.sample - mismatches:,}/{args.sample:,} episodes")
    return 0 if batch_rate >= TARGET and mismatches == 0 else 1


def timed(fn: Callable[..., T], *args: Any) -> tuple[T, float, float]:
    """fn(*args), its wall time and this process's CPU time. Rates use CPU time, so that other users of a
    shared machine, who take the core away now and then, do not count against the code measured."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn(*args)
    return result, time.perf_counter() - wall, time.process_time() - cpu


if __name__ == "__main__":
    sys.exit(main())
