"""How fast the page answers in a browser, idle and with a real stage training beside it, side by side in one run.

Run: `python benchmarks/bench_page.py [--repeats 3] [--play-steps 40] [--stage-steps 2000] [--wait 600]
[--only NAME...]`.

The lab is served on 127.0.0.1 over a temporary SQLite database seeded by `tests.seeded.seed_lab` (plus a stored
10x10 episode of 5 agents and a finished experiment of two arms and two seeds, `tests.recorded`), and opened in
headless Chromium (Debian's `chromium`, driven by Playwright). Each action the page is judged by
(tests/page_walk.py) is timed from its click to the page showing its result: opening a run, opening a proposal, the
first visit to Stage review, a failure row to its replay, Play to the end of the 10x10 episode (the time beyond the
replay's own pace, `--play-steps` x 0.6 s), a decision (reject and ask again), the live edit check and the Compare
tab's first drawing of the experiment. Median of the repeats, first idle, then while a real `envlab worker` at its
default lower CPU priority trains stage 1 of a run of the tiny policy with GRPO (tests/stage_beside.py); that column
is measured once the stage has logged its first GRPO step and kept only if it still trains after the last action,
else it stays empty and says why. The ratio loaded/idle is the figure; targets with the stage training: each action
<= 1 s, Compare (a whole experiment's figures drawn) <= 1.5 s (`target`). Error boxes the page showed meanwhile are
counted (there should be none).

Exits 1 when a target is missed, the loaded column could not be measured, or the page showed an error; 0 with a
note when Playwright or Chromium is missing.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # runs from a checkout without an install
sys.path.insert(0, str(ROOT / "benchmarks"))

import argparse  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402

from bench_app import STEPS, store_big_episode  # noqa: E402

from lab.pages import web as app  # noqa: E402
from storage.db import make_engine  # noqa: E402
from tests import stage_beside  # noqa: E402
from tests.page_walk import ERRORS_SEEN, Walk  # noqa: E402
from tests.servers import CHROMIUM_ARGS, chromium_path, free_port  # noqa: E402
from tests.servers import chromium_missing as missing  # noqa: E402

Figures = dict[str, tuple[float, float | None]]
TARGET_S, COMPARE_TARGET_S = 1.0, 1.5  # an action's, and the Compare tab's drawing of a whole experiment's
ARMS, SEEDS = 2, 2  # the experiment the Compare tab draws (`tests.recorded.scripted_experiment`: fixed, heuristic)


def _medians(actions: dict[str, Callable[[], float]], repeats: int) -> dict[str, float]:
    return {name: statistics.median(fn() for _ in range(repeats)) for name, fn in actions.items()}


def bench(repeats: int, play_steps: int = STEPS, stage_steps: int = stage_beside.STEPS,
          wait_s: float = 600, warm: bool = True, only: Sequence[str] = (),
          beside: Callable[[Walk], object] | None = None) -> tuple[Figures, str, list[str]]:
    """Each action's median idle and with the stage training; what the stage did meanwhile; the errors the
    page showed. `warm`: every action once first, untimed (the server's imports and caches, the browser's);
    `only`: the actions whose name starts with one of these (all when empty); `beside`: more to do in the page
    after the loaded measurements, while the stage still trains (the tests' walk through every tab), its errors
    counted with the others."""

    from playwright.sync_api import sync_playwright

    from tests.recorded import scripted_experiment
    from tests.seeded import seed_lab

    with tempfile.TemporaryDirectory() as folder:
        db = str(Path(folder) / "lab.db")
        engine = make_engine(db)
        ids = seed_lab(engine)
        ids["big"] = store_big_episode(engine, ids["history"], play_steps)
        ids["experiment"] = scripted_experiment(engine, name="compare", seeds=SEEDS, stages=1).id
        ids["arms"], ids["experiment_runs"] = ARMS, ARMS * SEEDS
        demo = app.build_demo(engine)
        port = free_port()
        app.launch(demo, port=port, block=False)
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
                context = browser.new_context(viewport={"width": 1400, "height": 1000})
                page = context.new_page()
                page.add_init_script(f"({ERRORS_SEEN})()")
                errors: list[str] = []

                def seen() -> None:  # the errors of the page before it is left
                    errors.extend(page.evaluate("window.__errors || []"))

                walk = Walk(page, f"http://127.0.0.1:{port}/", engine, ids, leaving=seen)
                timed = {name: fn for name, fn in walk.actions(play_steps).items()
                         if not only or name.startswith(tuple(only))}
                if warm:
                    _medians(timed, 1)
                idle = _medians(timed, repeats)
                loaded: dict[str, float | None] = dict.fromkeys(timed)
                def loaded_run() -> dict[str, float]:
                    figures = _medians(timed, repeats)
                    if beside is not None:
                        beside(walk)
                    return figures

                measured, still = stage_beside.measured_beside(engine, db, ids, stage_steps, wait_s, loaded_run)
                loaded = dict(measured) if measured else loaded
                seen()
                browser.close()
        finally:
            demo.close()
            engine.dispose()
    return {name: (idle[name], loaded[name]) for name in timed}, still, errors


def target(action: str) -> float:
    """The most seconds `action` may take with a stage training beside the page."""
    return COMPARE_TARGET_S if action.startswith("Compare") else TARGET_S


def report(figures: Figures, still: str, errors: list[str], repeats: int) -> None:
    print(f"page actions in the browser, click to result, median of {repeats} (a stage training beside the page: "
          f"{still}):")
    print(f"  {'action':52s} {'idle':>9s} {'loaded':>9s} {'ratio':>6s} {'target':>7s}")
    for name, (a, b) in figures.items():
        ratio = f"{b / a:5.1f}x" if b is not None and a > 0 else f"{'-':>6s}"
        print(f"  {name:52s} {a * 1000:7.0f}ms " + (f"{b * 1000:7.0f}ms {ratio}" if b is not None else
                                                      f"{'-':>9s} {'-':>6s}") + f" {target(name) * 1000:5.0f}ms")
    print(f"  target: each action <= {TARGET_S:g} s, Compare <= {COMPARE_TARGET_S:g} s, with a stage training beside "
          "the page; ratio = loaded / idle, measured in this run")
    print(f"  error boxes the page showed: {len(errors)}" + "".join(f"\n    {e}" for e in errors[:10]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--play-steps", type=int, default=STEPS, help="steps of the 10x10 episode played to its end")
    parser.add_argument("--stage-steps", type=int, default=stage_beside.STEPS,
                        help="GRPO steps the stage beside the page is asked for (it must outlast the measurements)")
    parser.add_argument("--wait", type=float, default=600,
                        help="seconds to wait for the stage's first GRPO step before measuring")
    parser.add_argument("--only", nargs="+", default=[], metavar="NAME",
                        help="time only the actions whose name starts with one of these (e.g. 'open a run')")
    args = parser.parse_args(argv)
    if reason := missing():
        print(f"page actions in the browser: skipped ({reason})")
        return 0
    figures, still, errors = bench(args.repeats, args.play_steps, args.stage_steps, args.wait, only=args.only)
    report(figures, still, errors, args.repeats)
    missed = errors or any(b is None or b > target(name) for name, (_, b) in figures.items())
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
