"""What a larger validation set costs: seconds to evaluate the tiny policy on the standard 240 validation boards
and on a larger set (default 120 per size, 960 boards), as a stage does after training; plus building the set.

Both evaluations run in the same process on the same policy, so their ratio holds on a loaded machine even where
the seconds do not. The larger set holds the 240 (docs/experiments.md), so the common boards must get the same
answers: the script checks that too.

    python benchmarks/bench_validation.py --per-size 120
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from envsim.suite import VALIDATION_PER_SIZE
from training.evaluate import evaluate, validation_entries
from training.policy import load_policy


@dataclass
class Args:
    per_size: int = 120
    threads: int = 1


def main(args: Args) -> None:
    torch.set_num_threads(args.threads)
    policy = load_policy("tiny")
    with tempfile.TemporaryDirectory() as cache:
        t0 = time.perf_counter()
        standard = [e.instance for e in validation_entries(Path(cache), VALIDATION_PER_SIZE)]
        t_build_standard = time.perf_counter() - t0
        t0 = time.perf_counter()
        larger = [e.instance for e in validation_entries(Path(cache), args.per_size)]
        t_build = time.perf_counter() - t0
        t0 = time.perf_counter()
        validation_entries(Path(cache), args.per_size)
        t_cached = time.perf_counter() - t0
    evaluate(policy, standard[:2], batch_size=2)  # warm-up: first-call allocations
    t0 = time.perf_counter()
    small = evaluate(policy, standard)
    t_small = time.perf_counter() - t0
    t0 = time.perf_counter()
    large = evaluate(policy, larger)
    t_large = time.perf_counter() - t0
    t0 = time.perf_counter()
    evaluate(policy, standard)  # again after the larger set: the machine's load drifts
    t_small = (t_small + time.perf_counter() - t0) / 2
    answers = {r.instance.id: r.completion for r in large}
    same = sum(answers.get(r.instance.id) == r.completion for r in small)
    rate = lambda rs: sum(r.outcome.valid for r in rs) / len(rs)  # noqa: E731
    print(f"tiny policy, greedy, batch 64, {args.threads} torch threads")
    print(f"build: standard {len(standard)} boards {t_build_standard:.1f} s; {len(larger)} boards {t_build:.1f} s "
          f"(then read from the cache in {t_cached:.2f} s)")
    print(f"evaluate {len(standard)} boards: {t_small:6.1f} s (mean of a run before and after)  "
          f"valid {rate(small):.1%}")
    print(f"evaluate {len(larger)} boards: {t_large:6.1f} s  valid {rate(large):.1%}")
    print(f"ratio: {t_large / t_small:.2f}x the seconds for {len(larger) / len(standard):.0f}x the boards; "
          f"answers on the common {len(standard)} boards identical: {same}/{len(standard)}")


if __name__ == "__main__":
    from flags import parse

    main(parse(Args, __doc__))
