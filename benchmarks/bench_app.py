"""How fast the web lab draws: a replay figure on the server, and the proposal page's first paint in a browser.

Run: `python benchmarks/bench_app.py [--repeats 20] [--paints 5] [--action-repeats 5] [--load stage|spin|none]
[--stage-steps 2000] [--wait 600] [--only replay paint actions]`.

1. Replay figure, server side: a labelled 10x10 board with 5 agents and a 40-step plan (the solver's plan padded
   with waits, one agent detoured into an event). Times `figures.replay_figure` (every step as a Plotly frame)
   and `figures.board_figure` at one step (what the page redraws per slider step), best of the repeats,
   against building the same replay as validated `go.Figure` frames (Plotly's default path) in the same run.
   Target: replay <= 100 ms.
2. Proposal page, first paint: the lab served on 127.0.0.1 over a seeded temporary database, opened at
   `/?proposal=ID` in headless Chromium, timed from navigation to the diff table's first row and the
   proposal's status on screen, median of the paints, against a one-line Gradio page in the same browser.
   Target: <= 2 s. Needs `playwright` (PyPI) and Debian's `chromium`.
3. The page's actions, idle and with a stage training beside the page, side by side in one run: what the server computes
   for opening a run (the bar above the tabs and the tab shown), opening a proposal (with its boards), the first visit
   to Stage review, a failure row to its replay, one Play step and a whole Play to the end of a 10x10 replay (its
   slowest step), the live edit check (one cell typed) and a decision (reject and ask again); median of the repeats,
   first idle, then while a real `envlab worker` (as `envlab serve` starts it, at its default lower CPU priority) trains
   stage 1 of a run of the tiny policy with GRPO (`--load stage`, tests/stage_beside.py), or while CPU spinners at that
   priority keep every core busy (`--load spin`). Under `--load stage` the loaded column is measured only once the stage
   has logged its first GRPO step, and kept only if it is still training after the last measurement (the header says
   which steps it logged meanwhile); otherwise the column stays empty, says why, and the run exits 1. The ratio
   loaded/idle is the figure; target: each action <= 1.5 s under load (a Play step <= 0.6 s, the replay's pace). The
   browser's side of the same actions: benchmarks/bench_page.py.

Exits 1 when a target is missed.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runs from a checkout without an install

import argparse  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import gradio as gr  # noqa: E402
import numpy as np  # noqa: E402
import plotly.graph_objects as go  # noqa: E402

from envsim.generator import random_board  # noqa: E402
from envsim.instance import Instance  # noqa: E402
from envsim.scoring import Outcome, score  # noqa: E402
from envsim.solver import Unsolved, label  # noqa: E402
from lab.pages import figures  # noqa: E402
from lab.pages import web as app  # noqa: E402
from lab.pages.episode import PLAY_S  # noqa: E402
from storage.db import make_engine  # noqa: E402
from tests.servers import free_port  # noqa: E402
from tests.stage_beside import STEPS as STAGE_STEPS  # noqa: E402

REPLAY_TARGET_S = 0.100
PAINT_TARGET_S = 2.0
ACTION_TARGET_S = 1.5
STEPS = 40
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--disable-sync"]


def episode(seed: int = 0, steps: int = STEPS) -> tuple[Instance, Outcome]:
    """A labelled 10x10 board with 5 agents and a `steps`-step plan: the solver's, padded with waits (or cut),
    with agent 4 sent the wrong way at the end so that the replay has events to draw."""
    rng = np.random.default_rng(seed)
    while True:
        board = random_board(10, 15, 5, rng)
        labelled = label(board) if board is not None else None
        if labelled is not None and not isinstance(labelled, Unsolved):
            break
    plan = [(list(p) + ["WAIT"] * steps)[:steps] for p in labelled.reference_plan]
    plan[4][-6:] = ["UP"] * min(6, steps)
    return labelled, score(labelled, [tuple(p) for p in plan])


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


def bench_paint(paints: int) -> float | None:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("proposal page first paint: skipped (pip install playwright; apt-get install chromium)")
        return None
    from tests.seeded import seed_lab

    with tempfile.TemporaryDirectory() as folder:
        engine = make_engine(str(Path(folder) / "lab.db"))
        ids = seed_lab(engine)
        demo = app.build_demo(engine)
        with gr.Blocks() as plain:
            gr.Markdown("ready", elem_id="ready")
        port, plain_port = free_port(), free_port()
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


@dataclass
class Action:
    """A page action to time: `fn` once per repeat (with `timed`, `fn` returns its own figure in seconds), then
    `after`, untimed (what makes the next repeat possible); `target`: the most it may take with a stage training."""

    fn: Callable[[], Any]
    after: Callable[[], Any] | None = None
    timed: bool = False
    target: float = ACTION_TARGET_S


def _actions(engine, ids: dict[str, int]) -> dict[str, Action]:
    """Each page action as the server computes it, on the tabs `app.build_demo` builds."""
    from lab.pages import episode as episode_page
    from lab.pages import proposal, review, runs, train
    from lab.pages.common import Page
    from tests.seeded import propose

    with gr.Blocks():
        run_pick, worker, quiet = gr.Dropdown(), gr.HTML(), gr.HTML(visible=False)
        with gr.Tabs() as tabs:
            page = Page(engine, run_pick, tabs, worker, quiet)
            with gr.Tab("review"):
                review_tab = review.build(page)
            with gr.Tab("episode"):
                episode_tab = episode_page.build(page)
            with gr.Tab("proposal"):
                proposal_tab = proposal.build(page)
            with gr.Tab("train"):
                train_tab = train.build(page)
    view = episode_tab.show(ids["clash"], True)[episode_tab.view]
    instance, outcome = episode()
    big = {"instance": instance.model_dump(mode="json"), "outcome": outcome.to_dict()}
    history = ids["history"]
    waits = [ids["second"]]  # the history run's proposal that waits for a decision

    def open_run() -> Any:  # the bar above the tabs and the tab shown (Train, as in tests/page_walk.py)
        return (runs.run_choices(engine), runs.runs_table(engine), app.worker_badge(engine),
                app.waiting_banner(engine), train_tab.show(history))

    def play_to_the_end() -> float:
        """Every Play tick from t = 0 to the last step; the slowest tick is the figure (each must come before the
        next, PLAY_S later, for the replay to keep its pace)."""
        slowest = 0.0
        for t in range(STEPS + 1):
            t0 = time.perf_counter()
            episode_tab.tick(big, None, t, True)  # no clock: a tick shows the next step
            slowest = max(slowest, time.perf_counter() - t0)
        return slowest

    def decide() -> Any:
        said = proposal.decide_proposal(engine, waits[0], "reject", "bench", "timed")
        assert said.startswith("✓"), said
        return proposal_tab.after_decision(history, waits[0])

    def next_proposal() -> None:  # untimed: the heuristic engineer's next proposal, for the next decision
        waits[0] = propose(engine, history)

    def edit_check() -> Any:
        shown = proposal.proposal_view(engine, waits[0])
        typed = [list(row) for row in shown.edit]
        typed[0][2] = 0.2  # a hole ratio typed in the first size's row
        return proposal_tab.checker(waits[0], typed, shown.agents, shown.instances)

    return {"open a run (the tab shown)": Action(open_run),
            "open a proposal (with its boards)": Action(lambda: (proposal_tab.show(ids["second"]),
                                                                 proposal_tab.show_preview(ids["second"]))),
            "first visit to Stage review": Action(lambda: review_tab.plots(  # its plots, in the answer after
                review_tab.show(history, None)[review_tab.due])),
            "a failure row to its replay": Action(lambda: episode_tab.show(ids["clash"], True)),
            "one Play step, 10x10 board, 5 agents": Action(lambda: episode_tab.tick(big, None, STEPS // 2, True)),
            f"Play to the end, 10x10 ({STEPS} steps): slowest": Action(play_to_the_end, timed=True,
                                                                        target=PLAY_S),
            "one Play step, a stored episode": Action(lambda: episode_tab.tick(view, None, 0, True)),
            "the live edit check (one cell typed)": Action(edit_check),
            "a decision (reject and ask again)": Action(decide, after=next_proposal)}


def _median(action: Action, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        figure = action.fn()
        times.append(figure if action.timed else time.perf_counter() - t0)
        if action.after is not None:
            action.after()
    return statistics.median(times)


def store_big_episode(engine, run_id: int, steps: int = STEPS) -> int:
    """`episode(steps=steps)` stored as a validation episode of the run's stage 1, as a stage job stores one; its
    id."""
    from storage.db import session
    from storage.models import Episode

    instance, outcome = episode(steps=steps)
    with session(engine) as s:
        row = Episode(run_id=run_id, stage_index=1, split="validation", instance_id=instance.id,
                      instance=instance.model_dump(mode="json"), size=instance.size, num_agents=instance.num_agents,
                      completion="(the solver's plan, agent 4 sent up at the end)", outcome=outcome.to_dict(),
                      valid=outcome.valid, optimal=outcome.optimal,
                      failure=None if outcome.failure is None else outcome.failure.value)
        s.add(row)
        s.commit()
        return row.id


def _spin_load() -> tuple[list[Any], Callable[[], bool]]:
    """A CPU spinner per core at the worker's default lower priority."""
    import os

    from lab.jobs.worker import NICE

    spinners = [subprocess.Popen([sys.executable, "-c", f"import os; os.nice({NICE})\nwhile True: pass"])
                for _ in range(os.cpu_count() or 2)]
    return spinners, lambda: all(p.poll() is None for p in spinners)


def _stop(procs: list[Any]) -> None:
    for p in procs:
        p.kill()
        p.wait()


def bench_actions(repeats: int, load: str, wait_s: float = 600,
                  steps: int = STAGE_STEPS) -> dict[str, tuple[float, float | None, float]]:
    """Each action's median idle and under `load` ("stage", "spin" or "none"), in one run. Under "stage" the
    loaded column is kept only when the stage logged a GRPO step before the first measurement and is still
    training after the last one (else it says what the stage was doing, and the column stays empty)."""
    from tests import stage_beside
    from tests.seeded import seed_lab

    with tempfile.TemporaryDirectory() as folder:
        db = str(Path(folder) / "lab.db")
        engine = make_engine(db)
        ids = seed_lab(engine)
        actions = _actions(engine, ids)
        for action in actions.values():  # warm: imports, caches
            _median(action, 1)
        idle = {name: _median(action, repeats) for name, action in actions.items()}
        loaded: dict[str, float | None] = dict.fromkeys(actions)
        still = "-"
        try:
            if load == "stage":
                measured, still = stage_beside.measured_beside(
                    engine, db, ids, steps, wait_s,
                    lambda: {name: _median(action, repeats) for name, action in actions.items()})
                loaded = measured or loaded
            elif load == "spin":
                procs, busy = _spin_load()
                try:
                    before = busy()
                    loaded = {name: _median(action, repeats) for name, action in actions.items()}
                    still = f"{'yes' if before else 'NO'} at the start, {'yes' if busy() else 'NO'} at the end"
                finally:
                    _stop(procs)
        finally:
            engine.dispose()
    print(f"page actions, server side, median of {repeats} (load: {load}; training while measured: {still}):")
    print(f"  {'action':44s} {'idle':>9s} {'loaded':>9s} {'ratio':>6s}  target loaded")
    for name, action in actions.items():
        a, b = idle[name], loaded[name]
        print(f"  {name:44s} {a * 1000:7.0f}ms " + (f"{b * 1000:7.0f}ms {b / a:5.1f}x" if b is not None else
                                                      f"{'-':>9s} {'-':>6s}") + f"  <= {action.target} s")
    print(f"  target: each action <= {ACTION_TARGET_S} s with a stage training beside the page (a Play step <= "
          f"{PLAY_S} s, the pace of the replay); ratio = loaded / idle, measured in this run")
    return {name: (idle[name], loaded[name], action.target) for name, action in actions.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--paints", type=int, default=5)
    parser.add_argument("--action-repeats", type=int, default=5)
    parser.add_argument("--load", choices=["stage", "spin", "none"], default="stage",
                        help="what runs beside the page for the loaded column (default: a real stage training)")
    parser.add_argument("--stage-steps", type=int, default=STAGE_STEPS,
                        help="GRPO steps the stage beside the page is asked for (it must outlast the measurements)")
    parser.add_argument("--wait", type=float, default=600,
                        help="seconds to wait for the stage's first GRPO step before measuring")
    parser.add_argument("--only", choices=["replay", "paint", "actions"], nargs="+",
                        default=["replay", "paint", "actions"])
    args = parser.parse_args(argv)
    missed = False
    if "replay" in args.only:
        missed |= bench_replay(args.repeats) > REPLAY_TARGET_S
    if "paint" in args.only:
        paint = bench_paint(args.paints)
        missed |= paint is not None and paint > PAINT_TARGET_S
    if "actions" in args.only:
        timed = bench_actions(args.action_repeats, args.load, args.wait, args.stage_steps)
        if args.load != "none":  # a load that could not be measured is a miss too: no figure to show
            missed |= any(b is None or b > target for _, b, target in timed.values())
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
