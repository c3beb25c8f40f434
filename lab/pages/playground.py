"""The Playground tab: make or paste a board, type a plan, and watch the rules score it step by step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr
import numpy as np
from sqlalchemy import Engine

from envsim.generator import random_board, round_half_up
from envsim.instance import Instance
from envsim.parser import format_plan
from envsim.rules import MAX_SIZE, MIN_SIZE
from envsim.scoring import score_answer
from envsim.solver import Unsolved, label
from lab.pages import figures
from lab.pages.common import Page, draw, no_progress, verdict, view_end
from lab.pages.episode import episode_view
from lab.settings import SEED

# The longest board text read: the largest legal board (32x32, 8 agents) is about 1.2 kB written out, so this leaves
# room for any spacing, while a 4000x4000 board pasted took 15 s to be parsed and then refused.
BOARD_TEXT_LIMIT = 64 * 1024
FIRST_BOARD = "A.b\n.H.\nB.a"  # the board the tab opens on (the size knob starts at its size)
# The longest plan scored: 8 agents on the largest board need a few kB, while a 9 MiB plan pasted took 20 s of CPU and
# kept 435 MiB in the page.
PLAN_TEXT_LIMIT = 64 * 1024


def make_board(size: Any, agents: Any, hole_ratio: Any, seed: Any) -> tuple[dict | None, str, str]:
    """A random labelled board from knobs: (view, its picture, message). The seed takes a run's bounds
    (`lab.settings.SEED`: numpy's generator refuses a negative one, and a fraction would be rounded unsaid)."""
    try:
        chosen = SEED.check(seed)
    except ValueError as err:
        return None, "", f"✗ Seed: {err}."
    size, agents = int(size), int(agents)
    rng = np.random.default_rng(chosen)
    board = random_board(size, round_half_up(float(hole_ratio) * size * size), agents, rng)
    if board is None:
        return None, "", f"✗ A {size}x{size} board with hole ratio {hole_ratio} has no room for {agents} agents' " \
                         "starts and goals in one ice region: lower the hole ratio or the agents."
    return _labelled(board)


def read_board(text: str) -> tuple[dict | None, str, str]:
    """A pasted board (`Instance.from_str`: a picture with A/a letters or the canonical text form); a text longer
    than `BOARD_TEXT_LIMIT` is refused before it is read."""
    if len(text) > BOARD_TEXT_LIMIT:
        return None, "", (f"✗ This text is {len(text):,} characters long; a board is read from at most "
                          f"{BOARD_TEXT_LIMIT:,} (a {MAX_SIZE}x{MAX_SIZE} board is about 1,200).")
    try:
        board = Instance.from_str(text)
    except ValueError as err:
        return None, text, f"✗ Cannot read this board: {err}"
    return _labelled(board)


def _labelled(board: Instance) -> tuple[dict, str, str]:
    labelled = label(board)
    if isinstance(labelled, Unsolved):
        message = "No plan solves this board (or the solver gave up): scoring works, but there is no ghost."
        labelled = board
    else:
        message = (f"Optimal makespan {labelled.opt_makespan}, optimal sum of costs {labelled.opt_soc}"
                   f"{', needs a wait' if labelled.needs_wait else ''}. Type a plan below.")
    return {"instance": labelled.model_dump(mode="json"), "outcome": None}, labelled.picture(), message


def play_plan(view: dict | None, text: str) -> tuple[dict | None, str, int]:
    """Score a typed plan on the playground's board: (view with the outcome, verdict, last step). A text longer than
    `PLAN_TEXT_LIMIT` is refused before it is read."""
    if not view:
        return view, "Make or paste a board first.", 0
    if len(text) > PLAN_TEXT_LIMIT:
        return {**view, "outcome": None}, (f"✗ This plan is {len(text):,} characters long; a plan is read from at "
                                           f"most {PLAN_TEXT_LIMIT:,}."), 0
    instance = Instance.model_validate(view["instance"])
    if not text.strip():
        return {**view, "outcome": None}, "Type a plan, one line per agent: `Agent 0: RIGHT DOWN WAIT`.", 0
    outcome = score_answer(instance, text)
    return {**view, "outcome": outcome.to_dict()}, verdict(instance, outcome), figures.last_step(outcome)


def solver_plan(view: dict | None) -> str | None:
    """The solver's plan for the board as an answer, or None when there is none."""
    plan = view["instance"].get("reference_plan") if view else None
    return format_plan(plan) if plan else None


KNOB_SIZES = 10  # the largest size the knob offers to make; a board read or loaded may be larger (MAX_SIZE)


def size_knob(size: int) -> dict[str, Any]:
    """The size knob at the size of the board shown, its range stretched to a board larger than it offers."""
    return gr.update(value=size, maximum=max(KNOB_SIZES, size))


@dataclass(eq=False)
class PlaygroundTab:
    engine: Engine
    view: gr.State
    board_text: gr.Textbox
    message: gr.Markdown
    plan: gr.Textbox
    verdict: gr.Markdown
    board: gr.Plot
    step: gr.Slider
    events: gr.Markdown
    size: gr.Slider  # the size knob: it says the size of the board shown, however that board came

    @property
    def outputs(self) -> list[Any]:
        """What a new board fills."""
        return [self.view, self.board_text, self.message, self.plan, self.verdict, self.board, self.step, self.events,
                self.size]

    def drawn(self, view: dict | None, t: int | None = None) -> dict[Any, Any]:
        """The board at step `t` (default: the end of the plan), the slider, and the events then."""
        end = view_end(view)
        t = end if t is None else t
        fig, events = draw(view, t, True)
        return {self.board: fig, self.step: gr.update(maximum=max(end, 1), value=t), self.events: events}

    def new_board(self, made: tuple[dict | None, str, str], shown: dict | None = None) -> dict[Any, Any]:
        """A board made or read; one that could not be is said, and the board shown (and the text typed) stay.
        The same board as the one `shown` keeps its plan and verdict: clicking Read board twice, or before the
        first read came back, never wipes a plan typed (or the solver's) for it."""
        view, picture, message = made
        if view is None:
            return {self.message: message}
        if shown is not None and shown.get("instance") == view["instance"]:
            return {self.board_text: picture or gr.update(), self.message: message}
        return {self.view: view, self.board_text: picture or gr.update(), self.message: message, self.plan: "",
                self.verdict: "", self.size: size_knob(view["instance"]["size"])} | self.drawn(view)

    def make(self, size: Any, agents: Any, holes: Any, seed: Any, shown: dict | None = None) -> dict[Any, Any]:
        return self.new_board(make_board(size, agents, holes, seed), shown)

    def read(self, text: str, shown: dict | None = None) -> dict[Any, Any]:
        return self.new_board(read_board(text), shown)

    def first_visit(self, view: dict | None, text: str) -> dict[Any, Any]:
        """The tab opened: the board in the box read, the first time only (a board being worked on stays)."""
        return self.read(text) if view is None else {}

    def score(self, view: dict | None, text: str) -> dict[Any, Any]:
        view, message, _ = play_plan(view, text)
        return {self.view: view, self.verdict: message} | self.drawn(view)

    def at_step(self, view: dict | None, t: Any) -> dict[Any, Any]:
        fig, events = draw(view, t, True)
        return {self.board: fig, self.events: events}

    def use_solver(self, view: dict | None) -> dict[Any, Any]:
        plan = solver_plan(view)
        if plan is None:
            return {self.message: "This board has no solver plan (make or read a board first)."}
        return {self.plan: plan}

    def load_episode(self, episode_id: Any) -> dict[Any, Any]:
        v = episode_view(self.engine, episode_id)
        if v["error"]:
            return {self.message: v["error"]}
        instance = Instance.model_validate(v["view"]["instance"])
        return {self.view: {"instance": v["view"]["instance"], "outcome": None}, self.board_text: instance.picture(),
                self.size: size_knob(instance.size),
                self.message: f"Episode {episode_id} loaded: its answer is in the plan box; edit it and watch the "
                              "verdict.", self.plan: v["answer"]}


def build(page: Page) -> PlaygroundTab:
    view = gr.State(None)
    with gr.Row():
        with gr.Column(scale=2):
            gr.Markdown("**Make a board from knobs**")
            with gr.Row():
                size = gr.Slider(MIN_SIZE, KNOB_SIZES, value=len(FIRST_BOARD.splitlines()), step=1, label="Size")
                agents = gr.Slider(1, 7, value=2, step=1, label="Agents")
            with gr.Row():
                holes = gr.Slider(0, 0.5, value=0.2, step=0.05, label="Hole ratio")
                seed = gr.Number(label="Seed", value=0)  # no `precision=0`: 1.5 is refused, not rounded
            make = gr.Button("Make board")
            gr.Markdown("**…or paste one**: `.` ice, `H` hole, `A`/`a` agent 0's start/goal, `B`/`b` …")
            board_text = gr.Textbox(label="Board", lines=6, value=FIRST_BOARD, elem_id="pg-board",
                                    max_length=BOARD_TEXT_LIMIT)
            read = gr.Button("Read board")
            message = gr.Markdown()
            plan = gr.Textbox(label="Plan (one line per agent)", lines=4, elem_id="pg-plan",
                              placeholder="Agent 0: RIGHT DOWN\nAgent 1: UP WAIT RIGHT", max_length=PLAN_TEXT_LIMIT)
            with gr.Row():
                solver = gr.Button("Use the solver's plan")
                episode = gr.Number(label="Episode", value=None, min_width=100)
                load = gr.Button("Load episode")
        with gr.Column(scale=3):
            verdict_md = gr.Markdown(elem_id="pg-verdict")
            board = gr.Plot(show_label=False, elem_id="pg-board-plot")
            step = gr.Slider(0, 1, value=0, step=1, label="Time step t")
            events = gr.Markdown()
    tab = PlaygroundTab(page.engine, view, board_text, message, plan, verdict_md, board, step, events, size)
    make.click(tab.make, [size, agents, holes, seed, view], tab.outputs)
    read.click(tab.read, [board_text, view], tab.outputs)
    plan.change(tab.score, [view, plan], [view, verdict_md, board, step, events], trigger_mode="always_last",
                **no_progress(page))
    step.input(tab.at_step, [view, step], [board, events], trigger_mode="always_last", **no_progress(page))
    solver.click(tab.use_solver, view, [plan, message])
    load.click(tab.load_episode, episode, [view, board_text, message, plan, size])
    return tab
