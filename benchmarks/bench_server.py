"""What the page's server computes for the actions a person takes most, without a browser, on a lab made as a first
start makes it (the example run and the shipped studies: 89 runs): the bar above the tabs, opening a run on each tab
that shows one, the run a page load opens, and Compare drawn for each experiment. Each the median of
`--repeats` calls after one untimed call, in this process; `benchmarks/bench_page.py` times the same actions in a
browser, where the drawing is added.

    OMP_NUM_THREADS=1 python benchmarks/bench_server.py [--db PATH] [--repeats 3] [--no-studies]

Without `--db` the lab is made in a scratch folder first (`lab.study.example.ensure_example`, `import_studies`), as
`envlab serve` makes it on a new database; `--no-studies` leaves the studies out (the example alone: CI's budget).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runs from a checkout without an install

from sqlalchemy import Engine  # noqa: E402

from lab.pages import web  # noqa: E402
from lab.runs import run_list  # noqa: E402
from lab.study.example import ensure_example, import_studies  # noqa: E402
from lab.study.experiments import experiment_choices  # noqa: E402
from storage.db import make_engine, upgrade  # noqa: E402


def first_start(path: Path, studies: bool) -> Engine:
    """A lab at `path` as a first start makes it: the example run, and the shipped studies unless not `studies`."""
    engine = make_engine(str(path))
    upgrade(engine)
    ensure_example(engine)
    if studies:
        import_studies(engine)
    return engine


def actions(engine: Engine) -> dict[str, Callable[[], object]]:
    """The timed actions, by the words the table prints, on the page's own objects (`web.Tabs`)."""
    built: dict[str, web.Tabs] = {}
    wire = web._wire
    web._wire = lambda tabs, demo: (built.setdefault("tabs", tabs), wire(tabs, demo))  # the page's Tabs, as wired
    try:
        web.build_demo(engine, own_worker=False)
    finally:
        web._wire = wire
    tabs = built["tabs"]
    run_id = web.linked(engine, {})["run"]
    experiments = experiment_choices(engine)
    timed = {
        "the bar above the tabs": lambda: tabs.top(run_id, select=False),
        "open a run on Train": lambda: tabs.open_run(run_id, "train", select=False),
        "open a run on Stage review": lambda: tabs.open_run(run_id, "review", select=False),
        "open a run on Proposal": lambda: tabs.open_run(run_id, "proposal", select=False),
        "the run a page load opens": lambda: web.linked(engine, {}),
    }
    for label, experiment_id in experiments:
        timed[f"Compare drawn: {label.split(' (')[0]}"] = (lambda e=experiment_id: tabs.compare.refresh(e, None))
    return timed


def timed_ms(action: Callable[[], object], repeats: int) -> float:
    action()  # untimed: the first call reads what later ones find cached by the database
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/bench_server.py", description=__doc__.splitlines()[0])
    p.add_argument("--db", type=Path, help="a lab's SQLite file to time on (default: a first start's, made first)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-studies", action="store_true", help="the example run alone in the lab made first")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="envlab-bench-server-") as scratch:
        started = time.perf_counter()
        engine = (make_engine(str(args.db)) if args.db else
                  first_start(Path(scratch) / "lab.db", studies=not args.no_studies))
        runs = len(run_list(engine))
        print(f"lab: {runs} runs ({'made' if not args.db else 'read'} in {time.perf_counter() - started:.1f} s); "
              f"median of {args.repeats} after one untimed call")
        for name, action in actions(engine).items():
            print(f"{name:36s} {timed_ms(action, args.repeats):9,.0f} ms")
        engine.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
