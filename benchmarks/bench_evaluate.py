"""Evaluation speed: episodes per second answered in batches vs one board at a time, tiny policy, greedy.

Generation dominates evaluation, and a transformer step over 64 sequences costs little more than over one
on a CPU, so batching should pay several times over (target: >= 5x). Both figures come from the same run
on the same boards, so the ratio holds on a loaded machine even where the absolute numbers do not.

    python benchmarks/bench_evaluate.py --boards 64 --batch-size 64

`--agents` names the validation set's agent counts (default: the standard set's, 3, 4, 5; `--agents 2` builds the
2-agent set in a fifth of the time).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from envsim.suite import VALIDATION_AGENTS, build
from training.evaluate import evaluate
from training.policy import TINY_DIR, build_tiny, load_policy


@dataclass
class Args:
    boards: int = 64
    batch_size: int = 64
    threads: int = 2
    agents: str = ",".join(map(str, VALIDATION_AGENTS))  # the validation set's agent counts, e.g. 3,4,5 or 2


def main(args: Args) -> None:
    torch.set_num_threads(args.threads)
    policy = load_policy("tiny") if (TINY_DIR / "config.json").exists() else build_tiny()
    entries = [e for e in build("validation", agents=[int(a) for a in args.agents.split(",")])[0] if e.size <= 6]
    boards = [entries[i * len(entries) // args.boards].instance for i in range(args.boards)]  # spread over sizes
    evaluate(policy, boards[:2], batch_size=2)  # warm-up: first-call allocations

    t0 = time.perf_counter()
    batched = evaluate(policy, boards, batch_size=args.batch_size)
    t_batched = time.perf_counter() - t0
    t0 = time.perf_counter()
    single = evaluate(policy, boards, batch_size=1)
    t_single = time.perf_counter() - t0

    same = sum(a.completion == b.completion for a, b in zip(batched, single, strict=True))
    print(f"{args.boards} validation boards (agents {args.agents}, sizes up to 6), tiny policy, greedy, "
          f"{args.threads} threads")
    print(f"batched (batch {args.batch_size}): {args.boards / t_batched:8.2f} episodes/s ({t_batched:.1f} s)")
    print(f"one at a time:        {args.boards / t_single:8.2f} episodes/s ({t_single:.1f} s)")
    print(f"speed-up: {t_single / t_batched:.1f}x; identical answers: {same}/{args.boards}; "
          f"valid: {sum(r.outcome.valid for r in batched)}/{args.boards}")


if __name__ == "__main__":
    from flags import parse

    main(parse(Args, __doc__))
