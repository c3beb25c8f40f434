"""The shipped tiny policy on the paper's 3,150-board benchmark, written to assets/leaderboard/tiny.json.

The Leaderboard shows this result in its local section, so a fresh lab has one row of its own beside the
paper's. Greedy decoding on the CPU, batched (`training.evaluate.evaluate`), scored exactly and tabled by
`envsim.suite.report` as the paper does (the mean over map sizes is the unweighted mean of the per-size
rates). The tiny policy was warm-started on 2-agent boards only, so on these boards of 3 to 5 agents it may
answer for too few agents; the failure counts in the file say so. A result, not a speed figure: the seconds
are recorded only so the next person knows what to expect.

    nice python benchmarks/tiny_benchmark.py --threads 1
    python benchmarks/tiny_benchmark.py --policy ~/envlab-long/ws-big/tiny --device cuda --out ws-big.json

`--policy` scores another checkpoint folder (a warm start on its way, say) the same way; `--device cuda` answers on
a GPU (the same greedy answers up to float rounding, in a minute rather than a quarter of an hour). `--boards N`
answers only N of the boards, spread evenly over the benchmark's (agents, size, subset) cells so that each agent count
keeps its share (only the cells they are in are built): a quick check of the path, never the shipped result, so it is
printed rather than written to assets/leaderboard/tiny.json (`--out FILE` writes it to another file).

    python benchmarks/tiny_benchmark.py --boards 3
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import torch

from envsim.suite import Entry, Split, build, build_cell, cells, report
from lab.study.reference import TINY_FILE, tiny_result
from training.evaluate import evaluate
from training.policy import load_policy


@dataclass
class Args:
    out: str = str(TINY_FILE)
    threads: int = 1
    batch_size: int = 64
    policy: str = "tiny"
    """the policy: "tiny" (the shipped one) or a checkpoint folder"""
    device: str = "cpu"
    boards: int = 0
    """answer only this many boards, spread over the cells (0: all 3,150); printed, not written to the shipped file"""


def sample(n: int) -> list[Entry]:
    """`n` benchmark boards in table order: each agent count's share of `n` (by its boards, largest remainder, so
    every count keeps at least one from n = 3 on), spread evenly over that count's boards in table order. Only the
    cells these boards are in are built, whole, so each is the board the full benchmark holds."""
    by_count: dict[int, list] = defaultdict(list)
    for cell in cells(Split.BENCHMARK):
        by_count[cell.agents].append(cell)
    boards = {k: sum(c.count for c in cs) for k, cs in by_count.items()}
    quotas = {k: n * b / sum(boards.values()) for k, b in boards.items()}
    shares = {k: int(q) for k, q in quotas.items()}
    for k in sorted(quotas, key=lambda k: (-(quotas[k] - shares[k]), k))[:n - sum(shares.values())]:
        shares[k] += 1
    chosen: list[Entry] = []
    for k, todo in by_count.items():
        wanted = sorted({i * boards[k] // shares[k] for i in range(shares[k])})
        first = 0
        for cell in todo:
            inside = [p - first for p in wanted if first <= p < first + cell.count]
            if inside:
                entries = build_cell(cell)[0]
                chosen.extend(entries[p] for p in inside)
            first += cell.count
    return chosen


def main(args: Args) -> None:
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    entries = sample(args.boards) if args.boards else build(Split.BENCHMARK)[0]
    print(f"{len(entries)} benchmark boards built in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    policy = load_policy(args.policy, device=args.device)

    def progress(done: int, total: int) -> bool:
        print(f"{done}/{total} answered, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        return False

    results = evaluate(policy, [e.instance for e in entries], batch_size=args.batch_size, progress=progress)
    table = report(entries, [r.outcome.valid for r in results], [r.outcome.optimal for r in results])
    command = f"python benchmarks/tiny_benchmark.py --threads {args.threads} --batch-size {args.batch_size}" + (
        f" --policy {args.policy}" * (args.policy != "tiny")) + f" --device {args.device}" * (args.device != "cpu") + (
        f" --boards {args.boards}" * bool(args.boards))
    failures = Counter(str(r.outcome.failure) for r in results if r.outcome.failure is not None)
    data = tiny_result(table, dict(failures), len(entries), command, datetime.now(UTC).strftime("%Y-%m-%d"),
                       time.perf_counter() - t0, policy.trained_agents)
    if args.boards and Path(args.out).resolve() == TINY_FILE.resolve():  # a sample is never the shipped result
        print(table.to_markdown())
        print(json.dumps(data, indent=1))
        print(f"{len(entries)} of the boards only: not written to {args.out} (--out FILE writes it elsewhere), "
              f"after {data['seconds']:.0f} s", file=sys.stderr)
        return
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    print(table.to_markdown())
    print(f"written to {args.out} after {data['seconds']:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    from flags import parse

    main(parse(Args, __doc__))
