"""The envlab web lab: review, replay and steer runs in the browser.

`envlab serve` (or `python app.py` in a checkout, which calls `main` here) opens the lab on the embedded defaults:
the SQLite file `runs/envlab.db` (or `--db` / `$ENVLAB_DB`), one worker process beside the page, the `tiny` policy.
The page only shows what `lab` reads and calls `lab` to act: it queues jobs and a worker trains (docs/loop.md).
Per-user state (the open episode, the playground's board) lives in `gr.State`; everything else is in the database,
which the page polls with `gr.Timer`.

This module assembles the page: the bar above the tabs (the open run, the worker's badge), the tabs from
`lab/pages/` (one module each, with its view functions and its widgets), and the events that cross tabs.

A lab that starts on an empty database imports the shipped example run before its page is built (`lab.study.example`:
a real 3-stage run with a decision of each kind; `envlab serve` has it imported while the page imports its
libraries, `example_apart`), so every tab has something to show on the first visit, and the shipped study beside
the page from when it serves; a start stopped during that import is finished by the next one. `--no-example`
keeps a new lab empty, on that start and every later one, and a database that holds a run already is left as it
is.

A worker is started beside the page unless `--no-worker` is given or one is visibly at work: a running job
whose heartbeat is fresh, once the jobs a dead worker of this host left running are handed back to the queue
(`take_back_orphans`: the lab before this start was killed), so the badge is true from the page's first second.
An idle worker writes nothing (a worker has no row of its own), so a lab whose
worker idles on another machine gets a second one here; that is harmless, as claims are exclusive. Beside it a
light lane starts too (`envlab worker --kinds probe`): a Measure job runs while the worker trains a long stage.
Each is started again when it dies (`lab.jobs.worker.KeptWorker`), said on the command line; one that keeps
dying is left down with a line saying that nothing here runs its jobs.
Workers lower their CPU priority (`--nice`) and leave the page a core (`lab.jobs.worker.beside_page_env`: torch
threads on every core but one), so the page stays quick while a stage trains.
"""

from __future__ import annotations

import contextlib
import faulthandler
import html
import inspect
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from starlette.middleware import Middleware
from tqdm import tqdm

from lab.archive import ArchiveError, Limits
from lab.cli.serve import AUTH_SETTING, EXAMPLE_PID, address, arguments, logins, port_free, taken_message
from lab.jobs.worker import (
    KeptWorker,
    WorkerState,
    beside_page_env,
    hand_back_orphans,
    start_worker,
    worker_busy,
    worker_status,
)
from lab.pages import compare, episode, leaderboard, playground, proposal, review, runs, train
from lab.pages.auth import Guard, allowed_hosts
from lab.pages.common import VIEW, Page, no_progress
from lab.pages.tempfiles import FILES_AGE_S, SWEEP_S, QuotaGate, private_temp
from lab.runs import LabVersion, Waiting, lab_version, run_list, run_of_episode, run_of_proposal, waiting_proposals
from lab.study.example import IMPORTING, ensure_example, import_studies, said_in, shipped_choice, studies_missing
from storage.db import DatabaseUnusable, keep_private, open_database, runs_root

ASSETS = Path(__file__).resolve().parents[2] / "assets"
POLL_S = 2.0


@dataclass(frozen=True)
class TabSpec:
    """One tab of the page: `id` (what links, the tab shown and `Tabs.of` name it by), its label, what it is for
    (its words in the page's introduction), its module's `build(page)` (the tab's object: its widgets, its view
    functions, and `outputs` for a tab a run fills), and, for a tab a run fills, `draw(tab, run_id, proposal_id,
    stage_index) -> {component: value}`: such a tab is drawn for the open run when it is shown (`LAZY`), the others
    when opened or by their own widgets. A new tab is one entry of `TABS`; events that cross tabs are wired below."""

    id: str
    label: str
    purpose: str
    build: Callable[[Page], Any]
    draw: Callable[[Any, int | None, int | None, int | None], dict[Any, Any]] | None = None


TABS = (
    TabSpec("runs", "Runs", "create or open a run", runs.build),
    TabSpec("review", "Stage review", "what the policy gets right and wrong", review.build,
            lambda tab, run_id, proposal_id, stage_index: tab.show(run_id, stage_index)),
    TabSpec("episode", "Episode", "replay one answer", episode.build),
    TabSpec("proposal", "Proposal", "accept, edit or reject the engineer's next config", proposal.build,
            lambda tab, run_id, proposal_id, stage_index: tab.show_all(run_id, proposal_id)),
    TabSpec("train", "Train", "the worker's progress", train.build,
            lambda tab, run_id, proposal_id, stage_index: tab.show(run_id)),
    TabSpec("playground", "Playground", "try boards and plans", playground.build),
    TabSpec("leaderboard", "Leaderboard", "benchmark tables", leaderboard.build),
    TabSpec("compare", "Compare", "an experiment's engineers side by side", compare.build),
)
LAZY = tuple(spec.id for spec in TABS if spec.draw is not None)  # the tabs a run fills: drawn when shown

INTRO = ("# envlab\nAn LLM policy trains in stages on MAPF-FrozenLake; after each stage an *environment engineer* "
         "proposes the next stage's environment and you review it. "
         + " · ".join(f"**{spec.label}** → {spec.purpose}" for spec in TABS) + ".")


NO_WORKER = "No worker was started with this lab (--no-worker): queued jobs wait for `envlab worker`."
LANES = (("--kinds", "probe"),)  # the light lanes beside the worker: Measure jobs never wait behind a long stage




def worker_badge(engine: Engine, own_worker: bool = True, kept: KeptWorker | None = None) -> str:
    """The worker's badge above the tabs; a lab started without a worker does not call an empty queue idle. `kept`:
    the worker `envlab serve` started (`lab.jobs.worker.worker_status`): while it starts, jobs waiting for it (after a
    restart the handed-back job was queued long ago) do not say that no worker runs; once it kept dying and was left
    down, the badge says so, in the line the command line printed."""
    state, text = worker_status(engine, kept and kept.started, kept and kept.down)
    if state == WorkerState.IDLE and not own_worker:
        text = NO_WORKER
    return f'<div class="worker {state}"><span class="dot"></span>{html.escape(text)}</div>'.replace(
        "`envlab worker`", "<code>envlab worker</code>")


def waiting_banner(engine: Engine, waiting: Sequence[Waiting] | None = None) -> str:
    """Every proposal that waits for a decision, each a link that opens it: shown above the tabs, so a new
    one is seen from any tab. `waiting`: those proposals as read already (None: read now)."""
    items = [f'<a href="?proposal={w.proposal_id}">Proposal #{w.proposal_id}</a> waits for your decision '
             f'(run #{w.run_id} {html.escape(w.run_name)}, for stage {w.for_stage}'
             + ("; the engineer\'s answer failed: edit it or reject it" if w.failed else "") + ")"
             for w in (waiting_proposals(engine) if waiting is None else waiting)]
    return "" if not items else '<div class="waiting-bar"><b>Waiting for you:</b> ' + " · ".join(items) + "</div>"


def linked(engine: Engine, params: dict[str, str]) -> dict[str, Any]:
    """What a link opens (`?episode=ID`, `?proposal=ID`, `?run=ID`): the run, the tab, the episode and the
    proposal; the newest run when the link names none."""
    run_id, tab, episode_id, proposal_id = None, None, None, None
    if params.get("proposal", "").isdigit():
        proposal_id = int(params["proposal"])
        run_id, tab = run_of_proposal(engine, proposal_id), "proposal"
    if params.get("run", "").isdigit():
        run_id = int(params["run"])
    if params.get("episode", "").isdigit():
        episode_id, tab = int(params["episode"]), "episode"
        run_id = run_of_episode(engine, episode_id) or run_id
    if run_id is None:  # the newest run of this lab's own, before the runs of experiments
        rows = sorted(run_list(engine), key=lambda row: row.run.experiment_id is not None)
        run_id = rows[0].run.id if rows else None
    return {"run": run_id, "tab": tab, "episode": episode_id, "proposal": proposal_id}


def build_demo(engine: Engine, own_worker: bool = True, kept: KeptWorker | None = None) -> gr.Blocks:
    """The lab's page on `engine` (migrated already); launch it with `launch`. Without `own_worker` (`--no-worker`)
    the badge says that no worker was started rather than "idle"; `kept`: the worker `envlab serve` started, for the
    badge while it starts and once it is left down (`worker_badge`)."""
    # Uploads, and the copies of exports the page offers for download, are deleted after FILES_AGE_S.
    with gr.Blocks(title="envlab", delete_cache=(SWEEP_S, FILES_AGE_S)) as demo:
        gr.Markdown(INTRO, elem_id="intro")
        with gr.Row(equal_height=True):
            run_pick = gr.Dropdown(label="Open run", choices=[], value=None, scale=3, elem_id="run-pick")
            refresh = gr.Button("↻ Refresh", scale=0, min_width=100)
            worker = gr.HTML(elem_id="worker-status")
        quiet = gr.HTML(visible=False)
        waiting = gr.HTML(elem_id="waiting")
        seen = gr.State(None)  # the `LabVersion` this browser last drew
        # The tab shown, held by the browser (set there as a tab is clicked, before any answer), and the run each of
        # the tabs a run fills was last drawn for (`LAZY`): a run opens in the tab shown, the others when opened.
        showing = gr.Textbox("runs", visible=False)
        drawn = gr.State({})
        poll = gr.Timer(POLL_S, active=False)  # started by the page's first answer (`on_load`)
        items, built = {}, {}
        with gr.Tabs(elem_id="tabs") as tab_bar:
            page = Page(engine, run_pick, tab_bar, worker, quiet, own_worker, kept)
            for spec in TABS:
                with gr.Tab(spec.label, id=spec.id) as items[spec.id]:
                    built[spec.id] = spec.build(page)
        tabs = Tabs(page, refresh, poll, waiting, Shown(seen, showing, drawn, items), built)
        _wire(tabs, demo)
    return demo


@dataclass(frozen=True)
class Shown:
    """What the browser has drawn: `seen` (the `LabVersion` and the run last drawn), `showing` (the tab shown) and
    `drawn` (the run each tab of `LAZY` was last drawn for)."""

    seen: gr.State
    showing: gr.Textbox
    drawn: gr.State
    items: dict[str, gr.Tab]


@dataclass(frozen=True)
class Tabs:
    """The page as the events that cross tabs read it: the bar above the tabs (`page`: the run picked, the tabs,
    the worker's badge; `refresh`, `waiting`), the poll, what the browser has drawn (`shown`) and each tab's object
    (`of`, by the tab's id: its widgets and view functions; the tabs those events name are also attributes). Its
    methods draw a run across the tabs, for those events to answer with."""

    page: Page
    refresh: gr.Button
    poll: gr.Timer
    waiting: gr.HTML
    shown: Shown
    of: dict[str, Any]

    @property
    def runs(self) -> runs.RunsTab:
        return self.of["runs"]

    @property
    def review(self) -> review.ReviewTab:
        return self.of["review"]

    @property
    def episode(self) -> episode.EpisodeTab:
        return self.of["episode"]

    @property
    def proposal(self) -> proposal.ProposalTab:
        return self.of["proposal"]

    @property
    def train(self) -> train.TrainTab:
        return self.of["train"]

    @property
    def playground(self) -> playground.PlaygroundTab:
        return self.of["playground"]

    @property
    def leaderboard(self) -> leaderboard.LeaderboardTab:
        return self.of["leaderboard"]

    @property
    def compare(self) -> compare.CompareTab:
        return self.of["compare"]

    def run_filled(self) -> list[Any]:
        """The outputs of the tabs a run fills (`LAZY`)."""
        return [output for tab in LAZY for output in self.of[tab].outputs]

    def top_outputs(self) -> list[Any]:
        """What `top` draws: the bar above the tabs and the runs table."""
        return [self.page.run_pick, self.runs.table, self.page.worker, self.waiting]

    def run_outputs(self) -> list[Any]:
        """What `open_run` draws: the bar above the tabs, the tabs a run fills, and what the browser has drawn."""
        return [*self.top_outputs(), *self.run_filled(), self.shown.seen, self.shown.drawn]

    def top(self, run_id: int | None, select: bool = True) -> dict[Any, Any]:
        """The bar above the tabs and the runs table. With `select` the dropdown's choices and value are set
        together (to `run_id`); without, only its choices, which only grow, so the value the browser holds
        stays among them (the poll's way: it must not undo a run opened meanwhile)."""
        engine = self.page.engine
        ordered, waiting = runs.ordered_runs(engine), waiting_proposals(engine)  # read once for all three
        choices = runs.run_choices(engine, ordered)
        ids = [choice[1] for choice in choices]
        pick = gr.update(choices=choices, value=run_id if run_id in ids else None) if select else \
            gr.update(choices=choices)
        return {self.page.run_pick: pick, self.runs.table: runs.runs_table(engine, ordered, waiting),
                self.page.worker: worker_badge(engine, self.page.own_worker, self.page.kept),
                self.waiting: waiting_banner(engine, waiting)}

    def draw(self, tab: str, run_id: int | None, proposal_id: int | None = None,
             stage_index: int | None = None) -> dict[Any, Any]:
        """Tab `tab` drawn for run `run_id` (nothing for a tab a run does not fill)."""
        spec = next((spec for spec in TABS if spec.id == tab and spec.draw is not None), None)
        return {} if spec is None else spec.draw(self.of[tab], run_id, proposal_id, stage_index)

    def open_run(self, run_id: int | None, tab: str, proposal_id: int | None = None, stage_index: int | None = None,
                 select: bool = True) -> dict[Any, Any]:
        """Run `run_id` open: the bar above the tabs, and the tab shown (`tab`; Proposal at `proposal_id`, else
        the one that waits, else the newest; Stage review at `stage_index`, else the latest); the other tabs of
        `LAZY` are marked as drawn for no run, so each is drawn when opened. Marked drawn for the poll."""
        drawn = {tab: run_id} if tab in LAZY else {}
        return self.top(run_id, select) | self.draw(tab, run_id, proposal_id, stage_index) | {
            self.shown.drawn: drawn, self.shown.seen: (lab_version(self.page.engine), run_id)}


def _wire(tabs: Tabs, demo: gr.Blocks) -> None:
    """The events that cross tabs: the run picked above them, links, the poll, a new run, a decision.

    A run opens in one answer (`Tabs.open_run`), never in a chain of events another event (the poll) can slip
    between: the bar above the tabs and the tab shown are drawn for it, and each other tab of `LAZY` when it is next
    opened (`opened`), so the browser lays out one tab, not three. Events read what a tab has drawn from its
    `gr.State` (`shown`), never a dropdown's value, whose choices may be changing on the server while the browser
    sends it."""
    _wire_first_visits(tabs)
    _wire_lazy_tabs(tabs)
    # A poll answer read for the run open before lands after a run is opened: the next poll sees that `seen` is of
    # another run and redraws the tab shown (cancelling the poll instead would mark its outputs "Error"). The events
    # that draw a run's tabs answer one at a time (`VIEW`), so that answer is drawn before the run opened, not after.
    _wire_poll(tabs)
    _wire_run_pick(tabs)
    _wire_new_runs(tabs)
    _wire_review_and_decisions(tabs)
    _wire_load(tabs, demo)


def _wire_first_visits(tabs: Tabs) -> None:
    """The tabs a run does not fill, drawn when first opened, not as the page loads beside everything else; and
    the tab shown, noted as each tab is opened."""
    compare_tab, leaderboard_tab, playground_tab = tabs.compare, tabs.leaderboard, tabs.playground
    items = tabs.shown.items
    items["compare"].select(compare_tab.refresh, [compare_tab.pick, compare_tab.rate], compare_tab.outputs, **VIEW)
    items["leaderboard"].select(leaderboard_tab.opened, [leaderboard_tab.pick, tabs.page.run_pick],
                                [leaderboard_tab.pick, *leaderboard_tab.outputs])
    items["playground"].select(playground_tab.first_visit, [playground_tab.view, playground_tab.board_text],
                               playground_tab.outputs)
    episode_tab = tabs.episode

    def first_episode(view: dict | None, drawn_for: tuple[LabVersion, int | None] | None,
                      request: gr.Request) -> dict[Any, Any]:
        """The Episode tab opened: the open run's first failure when no episode is open; the run a link names
        when the tab is opened before the page's first answer came."""
        if drawn_for is not None:
            run_id = drawn_for[1]
        else:
            run_id = linked(tabs.page.engine, dict(request.query_params) if request is not None else {})["run"]
        return episode_tab.first_visit(view, run_id)

    items["episode"].select(first_episode, [episode_tab.view, tabs.shown.seen],
                            [episode_tab.episode_id, episode_tab.opened_here, *episode_tab.outputs]) \
        .then(episode_tab.extras_if_opened, [episode_tab.opened_here, *episode_tab.follows],
              episode_tab.extra_outputs, **no_progress(tabs.page))
    for tab_id, item in items.items():  # in the browser only, at once: an answer drawn later cannot reorder it
        item.select(None, None, tabs.shown.showing, js=f"() => {tab_id!r}")


def _wire_lazy_tabs(tabs: Tabs) -> None:
    """Each tab of `LAZY` drawn for the open run when it is opened (`opened`: one event, which draws nothing when
    the tab is drawn for that run already)."""
    seen, drawn = tabs.shown.seen, tabs.shown.drawn

    def opener(tab: str) -> Callable[..., dict[Any, Any]]:
        def opened(drawn_for: tuple[LabVersion, int | None] | None, has: dict[str, Any]) -> dict[Any, Any]:
            """Tab `tab` opened: drawn for the open run unless it is already."""
            run_id = drawn_for[1] if drawn_for is not None else None
            if tab in has and has[tab] == run_id:
                return {drawn: has}  # (an empty dict would be read as one value)
            return tabs.draw(tab, run_id) | {drawn: {**has, tab: run_id}}
        return opened

    for tab in LAZY:
        tabs.shown.items[tab].select(opener(tab), [seen, drawn], [*tabs.of[tab].outputs, drawn],
                                     **no_progress(tabs.page), **VIEW)


def _wire_poll(tabs: Tabs) -> Any:
    """The poll (its event, returned): one cheap read of what changed (`lab_version`); only the parts of the page
    that depend on it are redrawn (of the tabs a run fills, those drawn for the open run), and a newly stored
    proposal is selected. `seen` is (the version drawn, the run it was drawn for): a run other than the open one
    (the poll's answer crossed a run being opened) redraws the tab shown, the others when opened; so does a tab shown
    that is drawn for no run or another. The Compare tab, shown, is redrawn when a run or a stage or the shipped study's
    import changed since it was drawn (its own `drawn_at`: it may have been drawn before the page's first answer)."""
    page, seen, drawn = tabs.page, tabs.shown.seen, tabs.shown.drawn
    engine = page.engine

    def follow(run_id: int | None, tab: str, proposal_id: int | None, stage_index: int | None,
               drawn_for: tuple[LabVersion, int | None] | None, has: dict[str, Any], experiment_id: int | None,
               rate: str | None, compare_drawn_at: tuple | None) -> dict[Any, Any]:
        now = lab_version(engine)
        out: dict[Any, Any] = {page.worker: worker_badge(engine, page.own_worker, page.kept),
                               seen: (now, run_id)}
        if tab == "compare" and tabs.compare.stale(compare_drawn_at, now):
            # a study under way, watched: its stages as they end; the shipped study's import, as its runs come in
            out |= tabs.compare.show(experiment_id, rate) if experiment_id is not None else tabs.compare.refresh()
        if drawn_for is None or drawn_for[1] != run_id:
            return out | tabs.top(run_id, select=False) | tabs.draw(tab, run_id) | {
                drawn: {tab: run_id} if tab in LAZY else {}}
        if tab in LAZY and has.get(tab) != run_id:
            # the tab shown is not drawn for the open run: it was opened as the page loaded, and its event reached
            # the server before the page's first answer, which then marked nothing drawn. Drawn now.
            out |= tabs.draw(tab, run_id) | {drawn: {**has, tab: run_id}}
        drawn_ = drawn_for[0]
        here = {t for t in LAZY if t in has and has[t] == run_id}
        if "train" in here and (now.jobs != drawn_.jobs or now.runs != drawn_.runs):
            out |= tabs.train.show(run_id)
        if (now.runs, now.proposals, now.stages) != (drawn_.runs, drawn_.proposals, drawn_.stages):
            out |= tabs.top(run_id, select=False)
            if "proposal" in here:
                out |= tabs.proposal.follow(run_id, proposal_id, jump=now.proposals[0] != drawn_.proposals[0])
        if "review" in here and now.stages != drawn_.stages:
            out |= tabs.review.show(run_id, stage_index)
        return out

    return tabs.poll.tick(
        follow, [page.run_pick, tabs.shown.showing, tabs.proposal.shown, tabs.review.shown, seen, drawn,
                 tabs.compare.pick, tabs.compare.rate, tabs.compare.drawn_at],
        [seen, drawn, *tabs.top_outputs(), *tabs.train.outputs, *tabs.proposal.outputs, *tabs.review.outputs,
         *tabs.compare.outputs],
        **no_progress(page), **VIEW)


def _wire_run_pick(tabs: Tabs) -> None:
    """A run opened from the bar above the tabs: picked in the dropdown, or drawn again by Refresh."""
    run_pick, showing, everywhere = tabs.page.run_pick, tabs.shown.showing, tabs.run_outputs()

    def reopen(run_id: int | None, tab: str, proposal_id: int | None, stage_index: int | None) -> dict[Any, Any]:
        return tabs.open_run(run_id, tab, proposal_id, stage_index)

    # Progress shows on the bar above the tabs only: a status tracker on each of the ~40 outputs costs the browser
    # more than the answer does, and flashes Gradio's timer text in every status line.
    tabs.refresh.click(reopen, [run_pick, showing, tabs.proposal.shown, tabs.review.shown], everywhere,
                       show_progress_on=run_pick, **VIEW) \
        .then(tabs.leaderboard.choices, None, tabs.leaderboard.pick)

    def picked(run_id: int | None, tab: str) -> dict[Any, Any]:
        """A run picked in the dropdown: the tab shown follows (the others when opened); the dropdown itself is
        left as the person set it, so an answer that lands after a later pick cannot set it back."""
        return tabs.open_run(run_id, tab, select=False)

    # `select`, as `input` fires twice per pick (Gradio 6). `always_last`: a pick made while the previous one is
    # answered runs after it (the default, `once`, drops it, and the tabs would stay on the run picked before).
    run_pick.select(picked, [run_pick, showing], everywhere, show_progress_on=run_pick, trigger_mode="always_last",
                    **VIEW)


def _wire_new_runs(tabs: Tabs) -> None:
    """A run created or imported on the Runs tab, opened at once."""
    engine, runs_tab, showing, everywhere = tabs.page.engine, tabs.runs, tabs.shown.showing, tabs.run_outputs()

    def create(*form: Any) -> dict[Any, Any]:
        message, run_id = runs.create_run_from_form(engine, *form)
        if run_id is None:
            return {runs_tab.message: message}
        return tabs.open_run(run_id, "train") | {runs_tab.message: message, tabs.page.tabs: gr.Tabs(selected="train"),
                                                 showing: "train", tabs.train.message: message}

    runs_tab.create.click(create, runs_tab.form, [runs_tab.message, *everywhere, tabs.page.tabs, showing,
                                                  tabs.train.message], show_progress_on=runs_tab.message, **VIEW)

    def imported(path: str | None, tab: str) -> dict[Any, Any]:
        message, run_id = runs.import_file(engine, path, uploaded=True)
        done = {runs_tab.import_message: message, runs_tab.upload: None}  # ready for the next file
        return done if run_id is None else tabs.open_run(run_id, tab) | done

    runs_tab.upload.upload(imported, [runs_tab.upload, showing],
                           [runs_tab.import_message, runs_tab.upload, *everywhere],
                           show_progress_on=runs_tab.import_message, **VIEW)


def _wire_review_and_decisions(tabs: Tabs) -> None:
    """A failure row clicked on Stage review opens its episode; a decision on a proposal redraws what it changed."""
    page, episode_tab, showing = tabs.page, tabs.episode, tabs.shown.showing

    def open_from_gallery(ghost: bool, evt: gr.SelectData) -> dict[Any, Any]:
        """A failure row clicked: its episode drawn and the Episode tab shown, in one answer."""
        episode_id = evt.row_value[0]
        return {episode_tab.episode_id: episode_id, page.tabs: gr.Tabs(selected="episode"), showing: "episode"} | \
            episode_tab.show(episode_id, ghost)

    tabs.review.gallery.select(open_from_gallery, episode_tab.ghost,
                               [episode_tab.episode_id, page.tabs, showing, *episode_tab.outputs],
                               show_progress_on=tabs.review.gallery) \
        .then(episode_tab.extras, episode_tab.follows, episode_tab.extra_outputs, **no_progress(page))

    def after_decision(run_id: int | None, has: dict[str, Any]) -> dict[Any, Any]:
        """The bar above the tabs, and the Train tab where it is drawn for this run (else it is when opened)."""
        return (tabs.train.show(run_id) if has.get("train", False) == run_id else {}) | tabs.top(run_id, select=False)

    for decided in tabs.proposal.decided:
        decided.then(after_decision, [page.run_pick, tabs.shown.drawn], [*tabs.train.outputs, *tabs.top_outputs()],
                     **no_progress(page))


def _wire_load(tabs: Tabs, demo: gr.Blocks) -> None:
    """The page's first answer: the run, tab, episode and proposal a link names (`linked`), and the poll started."""
    page, episode_tab, showing = tabs.page, tabs.episode, tabs.shown.showing

    def on_load(request: gr.Request) -> dict[Any, Any]:
        link = linked(page.engine, dict(request.query_params) if request is not None else {})
        tab = link["tab"] or "runs"
        # Everything a link opens goes out with the first answer: a link to a proposal or an episode paints in one
        # round trip.
        episode_view = {} if link["episode"] is None else episode_tab.show(link["episode"], True)
        # The poll starts with this answer: one started before would read the page as it was before it (no run
        # open) and draw that over it. The note box starts empty and this answer leaves it alone: a note typed
        # while the page loads is the person's, for the proposal drawn around it.
        first = tabs.open_run(link["run"], tab, link["proposal"])
        first.pop(tabs.proposal.note, None)
        # Without a link to an episode the Episode tab is left alone: it may have opened the run's first failure
        # already (`first_visit`), the person having opened it before this answer came.
        opened = {} if link["episode"] is None else {episode_tab.episode_id: link["episode"]}
        return first | episode_view | opened | {tabs.poll: gr.Timer(active=True)} | (
            # a tab the person opened before this answer came is left as it is (and drawn: `opened`)
            {page.tabs: gr.Tabs(selected=tab), showing: tab} if link["tab"] else {})

    def load_extras(episode_id: Any, view: dict | None, gif_width: Any, ghost: bool,
                    request: gr.Request) -> dict[Any, Any]:
        """`extras` for the episode a link opened; nothing without one."""
        params = dict(request.query_params) if request is not None else {}
        return episode_tab.extras_if_opened(params.get("episode", "").isdigit(), episode_id, view, gif_width, ghost)

    demo.load(on_load, None, [*tabs.run_outputs(), tabs.poll, page.tabs, showing, episode_tab.episode_id,
                              *episode_tab.outputs], show_progress_on=page.run_pick, **VIEW) \
        .then(load_extras, episode_tab.follows, episode_tab.extra_outputs, **no_progress(page))


# ---------------------------------------------------------------- the command


def plotly_warmup() -> str:
    """A script for the page's head that loads Gradio's Plotly bundle (4.6 MB of JavaScript, which Gradio imports
    only when the first plot is drawn) as soon as the page is idle after its load, so the first board or chart a
    person opens is drawn without waiting for it. The same module URL as Gradio's own import, so it is evaluated
    once; empty when this Gradio ships no such bundle."""
    bundles = sorted((Path(gr.__file__).parent / "templates" / "frontend" / "assets").glob("PlotlyPlot-*.js"))
    if len(bundles) != 1:
        return ""
    return ('<script type="module">(window.requestIdleCallback || setTimeout)'
            f'(() => import("./assets/{bundles[0].name}").catch(() => null));</script>')


def close_api_docs(demo: gr.Blocks) -> None:
    """Under a login, say nothing of the page's endpoints to someone who has not logged in: Gradio embeds the
    public endpoints' schema in `/` (login page included), so every endpoint is made "undocumented" (still
    callable by the page itself, after its login; hidden from that schema and `/gradio_api/info`)."""
    for fn in demo.fns.values():
        if fn.api_visibility == "public":
            fn.api_visibility = "undocumented"


def launch(demo: gr.Blocks, host: str = "127.0.0.1", port: int | None = None,
           auth: list[tuple[str, str]] | None = None, block: bool = True, allowed: Sequence[str] = (),
           forwarded_allow_ips: str = "", served: Callable[[], object] | None = None) -> None:
    """Serve the page; with `block`, say where in one line and serve until interrupted. Raises OSError when
    the port is taken. `served`: called once the page answers (`envlab serve` starts its workers and the shipped
    study's import then, so they do not slow its first answer on a machine of few cores).

    Uploads are capped at `Limits.upload` (Gradio's `max_file_size`, per file; docs/archive.md), and how many are
    kept at once and their bytes together by `lab.pages.tempfiles.QuotaGate`, before Gradio writes any; FastAPI's
    own `/openapi.json` is off (Gradio's routes, no lab data, but answered without a login); under `auth` the
    endpoints' schema is not shown either (`close_api_docs`), failed logins are throttled and every request
    that can change something needs the login (`lab.pages.auth.Guard`). The guard answers only to the lab's host names
    (`allowed` adds to them) and the lab's own page, in front of every other layer of the app (Gradio's CORS layer
    would otherwise answer another site's preflight first); `X-Forwarded-For` is believed only from the proxies in
    `forwarded_allow_ips` (uvicorn's setting; none by default)."""
    if auth:
        close_api_docs(demo)
    os.environ["FORWARDED_ALLOW_IPS"] = forwarded_allow_ips  # read by the uvicorn Gradio starts
    # Gradio asks the page of itself once before it returns and gives up after one 3 s wait: on a loaded machine
    # (a stage training beside it) the lab would refuse to start. The lab serves its own page; skip the asking.
    unasked = {"_frontend": False} if "_frontend" in inspect.signature(demo.launch).parameters else {}
    demo.launch(**unasked, server_name=host, server_port=port, auth=auth, prevent_thread_lock=True, quiet=True,
                css_paths=[ASSETS / "lab.css"], head=plotly_warmup(), theme=gr.themes.Soft(), footer_links=[],
                ssr_mode=False, run_history=False, show_error=True, max_file_size=Limits.from_env().upload,
                app_kwargs={"openapi_url": None, "middleware": [Middleware(Guard, hosts=allowed_hosts(host, allowed)),
                                                                 Middleware(QuotaGate)]})
    guard_first(demo.server_app)
    if served is not None:
        served()
    if block:
        print(f"envlab: serving on http://{host}:{demo.server_port}", flush=True)
        threading.Thread(target=warm, name="envlab-warm", daemon=True).start()
        demo.block_thread()


def warm() -> None:
    """What the page leaves out of its start and needs later, imported once it serves: scipy, for the Compare tab's
    intervals and tests (`lab.study.comparison`), a fifth of the page's import time (docs/worker.md)."""
    import scipy.optimize  # noqa: F401
    import scipy.stats  # noqa: F401


def guard_first(server: Any) -> None:
    """Put the guard in front of the layers Gradio adds to its app (compression, CORS), and build the app's stack
    again: Starlette builds it at the first request, which may already have come."""
    guard = next(m for m in server.user_middleware if m.cls is Guard)
    server.user_middleware.remove(guard)
    server.user_middleware.insert(0, guard)
    server.middleware_stack = server.build_middleware_stack()


def example_apart() -> bool:
    """Whether the process `envlab serve` forked to bring the example run in while the page imported its libraries
    (`lab.cli.serve.example_beside`, its id in `EXAMPLE_PID`) did so; waited for first. False without one."""
    pid = os.environ.pop(EXAMPLE_PID, "")
    if not pid.isdigit():
        return False
    try:
        _, status = os.waitpid(int(pid), 0)
    except ChildProcessError:  # not this process's child
        return False
    return os.waitstatus_to_exitcode(status) == 0


def add_example(engine: Engine, beside: bool = False, stop: threading.Event | None = None,
                started: bool = True, example_in: bool = False) -> threading.Thread | None:
    """The shipped example run (unless `example_in`: brought in already, `example_apart`), then the shipped study,
    into a lab that takes them (`lab.study.example`: a new lab does, and keeps that choice) where they are not in
    yet; a file that cannot be imported is said in one line, and the lab starts without it. With `beside`, the study
    (88 runs, most of a first start's time) is imported in a thread from when the page serves, with a line on the
    command line; an experiment shows on the Compare tab once all its runs are in (`import_studies`), and `stop`
    set stops the import after the run it is at (the next start goes on from there). Returns that thread, not yet
    started where `started` is false."""
    try:
        run_id = None if example_in else ensure_example(engine)
    except ArchiveError as err:
        print(f"the example run was not imported: {err}", file=sys.stderr)
        return None
    if run_id is not None:
        print(said_in(run_id), file=sys.stderr)
    if not studies_missing(engine):
        return None
    if not beside:
        add_studies(engine)
        return None
    thread = threading.Thread(target=add_studies, args=(engine, stop), name="envlab-study-import", daemon=True)
    if started:
        thread.start()
    return thread


class _Stopped(Exception):
    """The lab is stopping: the import of the shipped study stops after the run it is at."""


def add_studies(engine: Engine, stop: threading.Event | None = None) -> None:
    """The shipped study's experiments that are not in yet, run by run with "importing the shipped studies: k of n
    runs" on the command line (gone once done), then one line saying where they are; `stop` set stops it between
    two runs, saying how far it came. Where the output is not a terminal (a log file) the count is a line of its own
    at the start and at each tenth of the runs, which a file keeps, instead of a bar redrawn in place."""
    bar: tqdm | None = None
    tenths = -1  # the last tenth said in a line (no terminal)

    def step(done: int, total: int) -> None:
        nonlocal bar, tenths
        if not sys.stderr.isatty():
            if 10 * done // max(1, total) > tenths:
                tenths = 10 * done // max(1, total)
                print(IMPORTING.format(done=done, total=total), file=sys.stderr, flush=True)
        elif bar is None:
            bar = tqdm(total=total, initial=done, file=sys.stderr, leave=False,
                       bar_format=IMPORTING.format(done="{n}", total="{total}"))
        if bar is not None:
            bar.update(done - bar.n)
        if stop is not None and stop.is_set():
            raise _Stopped(f"the import of the shipped studies stopped at {done} of {total} runs: the next start "
                           "imports the rest")

    try:
        said = f"the shipped study's {len(import_studies(engine, progress=step))} experiment(s) are on the Compare tab"
    except _Stopped as stopped:
        said = str(stopped)
    except (ArchiveError, OSError, SQLAlchemyError) as err:
        said = f"the shipped study was not imported: {err}"
    finally:
        if bar is not None:
            bar.close()
    print(said, file=sys.stderr)


STOP_IMPORT_S = 30.0  # how long a stopping lab waits for the import of the run it is at


def take_back_orphans(engine: Engine) -> None:
    """The jobs a worker of this host left running when it died (the lab before this start was killed, and its
    workers with it) handed back to the queue as the lab starts, before the page serves and before it asks whether
    a worker is at work, each said in one line. Their heartbeats, seconds old, would read as a busy worker: the badge
    said "Worker busy" for a job nobody ran until the heartbeat went stale, and no worker was started for it."""
    for job in hand_back_orphans(engine):
        at = f" at step {job.step} of {job.total}" if job.total else ""
        print(f"job {job.id} ({job.kind}) was left running{at} by a worker that is gone from this host: handed back "
              "to the queue, where a worker takes it up again", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments().parse_args(argv)
    host, port = address(args.host, args.port)
    taken = taken_message(port)
    if not port_free(host, port):  # before the worker starts and the page is built
        print(taken, file=sys.stderr)
        return 2
    keep_private()  # the database, run folders and exports the page makes are this user's alone
    auth = logins(args)
    os.environ.pop(AUTH_SETTING, None)  # read: the workers the page starts need no passwords
    if host not in ("127.0.0.1", "localhost") and not auth:
        print(f"warning: serving on {host} without a login (--auth-file): anyone who can reach it can decide "
              "proposals", file=sys.stderr)
    try:
        engine = open_database(args.db)
    except DatabaseUnusable as err:
        print(f"envlab serve: {err}", file=sys.stderr)
        return 2
    try:  # Gradio's uploads and downloads: under the runs root, this user's alone, not the shared /tmp/gradio
        private_temp(runs_root(engine))
    except OSError as err:
        print(f"envlab serve: {err}", file=sys.stderr)
        return 2
    take_back_orphans(engine)
    stop, kept = threading.Event(), None
    if args.no_example:
        shipped_choice(engine, take=False)  # a new lab stays empty, on this start and the next ones
        study = None
    else:  # the shipped study is imported beside the page, from when it serves
        study = add_example(engine, beside=True, stop=stop, started=False, example_in=example_apart())
    # the workers start once the page serves (each imports the training stack: on two cores, started beside the page's
    # own imports they made its first answer seconds later), and each is started again when it dies
    workers: list[KeptWorker] = []
    if args.no_worker:
        print("not starting a worker (--no-worker): queued jobs wait for `envlab worker`", file=sys.stderr)
    elif worker_busy(engine):
        print("a worker is already at work on this database: not starting another", file=sys.stderr)
    else:
        kept = KeptWorker(lambda: start_worker(args.db, env=beside_page_env(), die_with_parent=True, own_group=True),
                          later=True)
        workers.append(kept)
    if not args.no_worker:
        workers += [KeptWorker(lambda lane=lane: start_worker(args.db, options=lane, env=beside_page_env(),
                                                              die_with_parent=True, own_group=True),
                               name="the lab's probe lane", later=True)
                    for lane in LANES]  # a probe job runs here while the worker trains a stage

    def served() -> None:
        for worker in workers:
            worker.start()
        if study is not None:
            study.start()
    # SIGTERM ends the page like Ctrl-C does, so the atexit hook stops the workers it started, each with one SIGTERM
    # (they are in process groups of their own: a Ctrl+C reaches the page only), and each hands its job back.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    with contextlib.suppress(OSError, ValueError):  # io.UnsupportedOperation: a stderr that is no file (a capture)
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID`: every thread's stack, on stderr
    try:
        launch(build_demo(engine, own_worker=not args.no_worker, kept=kept), host, port, auth,
               allowed=args.allowed_hosts.split(","), forwarded_allow_ips=args.forwarded_allow_ips, served=served)
    except KeyboardInterrupt:  # Ctrl+C before the page serves: one line; its workers are stopped as above (atexit)
        print("envlab serve: stopped", file=sys.stderr)
        return 0
    except OSError:
        if port_free(host, port):
            raise
        print(taken, file=sys.stderr)  # taken between the check and the launch
        return 2
    finally:  # the page ended (Ctrl+C, SIGTERM): the study's import stops after its run, whole; the next start goes on
        if study is not None and study.ident is not None:  # started: the page served
            stop.set()
            study.join(STOP_IMPORT_S)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
