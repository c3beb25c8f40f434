"""What a larger validation set costs: seconds to evaluate the tiny policy on the standard validation boards (30 per
(agent count, map size): 630 boards at the default counts 3, 4, 5) and on a larger set (default 120 per (count, size),
2,520 boards), as a stage does after training; plus building the sets, and what the machine's cache of built sets
saves a fresh runs root.

Both evaluations run in the same process on the same policy, so their ratio holds on a loaded machine even where
the seconds do not. The larger set holds the standard one (docs/experiments.md), so the common boards must get the
same answers: the script checks that too. `--boards N` evaluates only N boards of the standard set, spread evenly
over it, and of the larger set those N and as many more of its own as its size calls for (a quick check; 0: every
board).

The sets are built with a machine cache of their own (`ENVLAB_CACHE` set to an empty temporary folder for the run):
the standard set is built into a fresh runs root while that cache is empty, then read into another fresh runs root
while the cache holds it (`training.evaluate._cached`); both in the same run, their ratio printed.

    python benchmarks/bench_validation.py --per-size 120
    python benchmarks/bench_validation.py --agents 2 --per-size 60 --boards 32
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from envsim.instance import Instance
from envsim.suite import VALIDATION_AGENTS, VALIDATION_PER_SIZE
from training.evaluate import CACHE_SETTING, evaluate, validation_entries
from training.policy import load_policy


@dataclass
class Args:
    per_size: int = 120
    agents: str = ",".join(map(str, VALIDATION_AGENTS))  # the sets' agent counts, e.g. 3,4,5 or 2
    boards: int = 0  # evaluate only this many boards of the standard set, and the larger set's share (0: all)
    threads: int = 1


@contextmanager
def machine_cache(folder: Path) -> Iterator[None]:
    """`ENVLAB_CACHE` set to `folder` meanwhile (the machine's cache of built board sets: `boards_cache()`)."""
    before = os.environ.get(CACHE_SETTING)
    os.environ[CACHE_SETTING] = str(folder)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(CACHE_SETTING, None)
        else:
            os.environ[CACHE_SETTING] = before


def spread(boards: list[Instance], n: int) -> list[Instance]:
    """`n` of `boards`, evenly spread over them in their order (all of them for n = 0 or n >= len)."""
    if not n or n >= len(boards):
        return list(boards)
    return [boards[i * len(boards) // n] for i in range(n)]


def evaluated(standard: list[Instance], larger: list[Instance], n: int) -> tuple[list[Instance], list[Instance]]:
    """The boards of each set to evaluate: all, or `n` of the standard set and, of the larger, those and its own
    boards spread evenly, as many in all as the larger set's share (n x its boards / the standard set's)."""
    if not n:
        return standard, larger
    small = spread(standard, n)
    common = {b.id for b in standard}
    own = [b for b in larger if b.id not in common]
    keep = {b.id for b in small} | {b.id for b in spread(own, len(small) * len(larger) // len(standard) - len(small))}
    return small, [b for b in larger if b.id in keep]


def main(args: Args) -> None:
    torch.set_num_threads(args.threads)
    agents = tuple(int(a) for a in args.agents.split(","))
    policy = load_policy("tiny")
    with tempfile.TemporaryDirectory() as folder, machine_cache(Path(folder) / "machine-cache"):
        root = Path(folder) / "runs"
        t0 = time.perf_counter()
        standard = [e.instance for e in validation_entries(root, VALIDATION_PER_SIZE, agents)]
        t_build_standard = time.perf_counter() - t0
        t0 = time.perf_counter()
        larger = [e.instance for e in validation_entries(root, args.per_size, agents)]
        t_build = time.perf_counter() - t0
        t0 = time.perf_counter()
        validation_entries(root, args.per_size, agents)
        t_cached = time.perf_counter() - t0
        t0 = time.perf_counter()
        copied = [e.instance for e in validation_entries(Path(folder) / "other-runs", VALIDATION_PER_SIZE, agents)]
        t_machine = time.perf_counter() - t0
    small_boards, large_boards = evaluated(standard, larger, args.boards)
    evaluate(policy, small_boards[:2], batch_size=2)  # warm-up: first-call allocations
    t0 = time.perf_counter()
    small = evaluate(policy, small_boards)
    t_small = time.perf_counter() - t0
    t0 = time.perf_counter()
    large = evaluate(policy, large_boards)
    t_large = time.perf_counter() - t0
    t0 = time.perf_counter()
    evaluate(policy, small_boards)  # again after the larger set: the machine's load drifts
    t_small = (t_small + time.perf_counter() - t0) / 2
    answers = {r.instance.id: r.completion for r in large}
    same = sum(answers.get(r.instance.id) == r.completion for r in small)
    rate = lambda rs: sum(r.outcome.valid for r in rs) / len(rs)  # noqa: E731
    of = lambda boards, whole: f" (of {len(whole)})" * (len(boards) < len(whole))  # noqa: E731
    print(f"tiny policy, greedy, batch 64, {args.threads} torch threads; agents {args.agents}")
    print(f"build: standard {len(standard)} boards {t_build_standard:.1f} s; {len(larger)} boards {t_build:.1f} s "
          f"(then read from the cache in {t_cached:.2f} s)")
    print(f"machine cache: the standard {len(standard)} boards into a fresh runs root {t_build_standard:.2f} s with "
          f"it empty, {t_machine:.3f} s into another with it holding them; ratio {t_build_standard / t_machine:.0f}x; "
          f"same boards: {'yes' if copied == standard else 'NO'}")
    print(f"evaluate {len(small_boards)} boards{of(small_boards, standard)}: {t_small:6.1f} s (mean of a run before "
          f"and after)  valid {rate(small):.1%}")
    print(f"evaluate {len(large_boards)} boards{of(large_boards, larger)}: {t_large:6.1f} s  valid {rate(large):.1%}")
    print(f"ratio: {t_large / t_small:.2f}x the seconds for {len(large_boards) / len(small_boards):.1f}x the boards; "
          f"answers on the common {len(small_boards)} boards identical: {same}/{len(small_boards)}")


if __name__ == "__main__":
    from flags import parse

    main(parse(Args, __doc__))
