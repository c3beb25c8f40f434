"""How fast the web lab draws: a replay figure on the server, and the proposal page's first paint in a browser.

Run: `python benchmarks/bench_app.py [--repeats 20] [--paints 5]`.

1. Replay figure, server side: a labelled 10x10 board with 5 agents and a 40-step plan (the solver's plan padded
   with waits, one agent detoured into an event). Times `figures.replay_figure` (every step as a Plotly frame)
   and `figures.board_figure` at one step (what the page redraws per slider step), best of the repeats,
   against building the same replay as validated `go.Figure` frames (Plotly's default path) in the same run.
   Target: replay <= 100 ms.
2. Proposal page, first paint: the lab served on 127.0.0.1 over a seeded temporary database, opened at
   `/?proposal=ID` in headless Chromium, timed from navigation to the diff table's first row and the
   proposal's status on screen, median of the paints, against a one-line Gradio page in the same browser.
   Target: <= 2 s. Needs `playwright` (PyPI) and Debian's `chromium`.

Exits 1 when a target is missed.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runs from a checkout without an install

import argparse  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import gradio as gr  # noqa: E402
import numpy as np  # noqa: E402
import plotly.graph_objects as go  # noqa: E402

import app  # noqa: E402
from envsim.generator import random_board  # noqa: E402
from envsim.instance import Instance  # noqa: E402
from envsim.scoring import Outcome, score  # noqa: E402
from envsim.solver import Unsolved, label  # noqa: E402
from lab.pages import figures  # noqa: E402
from storage.db import make_engine  # noqa: E402

REPLAY_TARGET_S = 0.100
PAINT_TARGET_S = 2.0
STEPS = 40
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--disable-sync"]


def episode(seed: int = 0) -> tuple[Instance, Outcome]:
    """A labelled 10x10 board with 5 agents and a 40-step plan: the solver's, padded with waits, with agent 4
    sent the wrong way at the end so that the replay has events to draw."""
    rng = np.random.default_rng(seed)
    while True:
        board = random_board(10, 15, 5, rng)
        labelled = label(board) if board is not None else None
        if labelled is not None and not isinstance(labelled, Unsolved):
            break
    plan = [list(p) + ["WAIT"] * (STEPS - len(p)) for p in labelled.reference_plan]
    plan[4][-6:] = ["UP"] * 6
    return labelled, score(labelled, [tuple(p[:STEPS]) for p in plan])


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def bench_replay(repeats: int) -> float:
    instance, outcome = episode()
    assert len(outcome.positions) == STEPS + 1
    replay = best(lambda: figures.replay_figure(instance, outcome), repeats)
    step = best(lambda: figures.board_figure(instance, outcome, STEPS // 2), repeats)
    validated = best(lambda: go.Figure(figures.replay_figure(instance, outcome)), max(3, repeats // 5))
    print(f"replay figure, 10x10, 5 agents, {STEPS} steps ({len(outcome.events)} events):")
    print(f"  replay_figure (every step a frame): {replay * 1000:7.1f} ms   target <= {REPLAY_TARGET_S * 1000:.0f} ms")
    print(f"  board_figure (one step, per slider move): {step * 1000:7.1f} ms")
    print(f"  baseline, the same frames as validated go.Figure: {validated * 1000:7.1f} ms "
          f"({validated / replay:.0f}x the replay)")
    return replay


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_paint(paints: int) -> float | None:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("proposal page first paint: skipped (pip install playwright; apt-get install chromium)")
        return None
    from tests.test_app import seed_lab

    with tempfile.TemporaryDirectory() as folder:
        engine = make_engine(str(Path(folder) / "lab.db"))
        ids = seed_lab(engine)
        demo = app.build_demo(engine)
        with gr.Blocks() as plain:
            gr.Markdown("ready", elem_id="ready")
        port, plain_port = _free_port(), _free_port()
        app.launch(demo, port=port, block=False)
        plain.launch(server_port=plain_port, prevent_thread_lock=True, quiet=True, ssr_mode=False)
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)

                def paint(url: str, ready: list[str]) -> float:
                    page = browser.new_page(viewport={"width": 1400, "height": 1000})
                    t0 = time.perf_counter()
                    page.goto(url)
                    for selector in ready:
                        page.locator(selector).first.wait_for(timeout=30_000)
                    seconds = time.perf_counter() - t0
                    page.close()
                    return seconds

                lab_ready = ['#diff [data-testid="cell-0-1"]', "#proposal-status :text('Waiting for a decision')"]
                paint(f"http://127.0.0.1:{port}/?proposal={ids['pending']}", lab_ready)  # warm the server up
                paint(f"http://127.0.0.1:{plain_port}/", ["#ready :text('ready')"])
                lab = statistics.median(paint(f"http://127.0.0.1:{port}/?proposal={ids['pending']}", lab_ready)
                                        for _ in range(paints))
                base = statistics.median(paint(f"http://127.0.0.1:{plain_port}/", ["#ready :text('ready')"])
                                         for _ in range(paints))
                browser.close()
        finally:
            demo.close()
            plain.close()
            engine.dispose()
    print(f"proposal page first paint (median of {paints}): {lab:.2f} s   target <= {PAINT_TARGET_S:.0f} s")
    print(f"  baseline, a one-line Gradio page: {base:.2f} s ({lab / base:.1f}x)")
    return lab


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--paints", type=int, default=5)
    args = parser.parse_args()
    replay = bench_replay(args.repeats)
    paint = bench_paint(args.paints)
    missed = replay > REPLAY_TARGET_S or (paint is not None and paint > PAINT_TARGET_S)
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
