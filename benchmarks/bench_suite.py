"""Build the whole 3,150-board benchmark suite with exact labels and report the time and the slowest board.

    python benchmarks/bench_suite.py [--workers 2]

Target: under 2 minutes on a 2-core machine. The baseline printed beside it is the same build on one
worker, scaled from a sample of cells, so the parallel speed-up is visible in the same run.
"""

import argparse
import time

from envsim.suite import build, build_cell, cells


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    entries, stats = build("benchmark", workers=args.workers, progress=True)
    wait = sum(e.instance.needs_wait for e in entries)
    print(f"benchmark suite: {stats['boards']} boards ({wait} need a wait) in {stats['seconds']:.1f} s "
          f"with {args.workers} workers; slowest board {stats['slowest_board']} took "
          f"{stats['slowest_seconds'] * 1000:.0f} ms to label")
    sample = cells("benchmark")[::9]
    t0 = time.perf_counter()
    for cell in sample:
        build_cell(cell)
    one = (time.perf_counter() - t0) * len(cells("benchmark")) / len(sample)
    print(f"one worker (estimated from {len(sample)} of {len(cells('benchmark'))} cells): {one:.1f} s; "
          f"speed-up {one / stats['seconds']:.2f}x")
    print(f"target: under 120 s -> {'met' if stats['seconds'] < 120 else 'NOT met'}")


if __name__ == "__main__":
    main()
