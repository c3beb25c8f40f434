"""The Episode tab: replay one answer step by step, beside the same board at every stage of its run."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr
from sqlalchemy import Engine

from envsim.instance import Instance
from envsim.scoring import Outcome
from envsim.suite import Split
from lab.pages import figures
from lab.pages.common import Page, draw, no_progress, table, verdict, view_end
from lab.pages.tempfiles import FILES_AGE_S, REPLAYS, sweep
from lab.replay import GIF_WIDTHS, replay_gif
from lab.results import outcome_of
from lab.runs import episode_across_stages, first_failure
from lab.settings import Count

PLAY_S = 0.6  # seconds per step while a replay plays
EPISODE_ID = Count(1, 2**63 - 1, "an id is a 64-bit integer in the database", "ids start at 1")


def play_clock(start: int, now: float | None = None) -> dict[str, float]:
    """A replay's clock, kept while it plays: the step it started from (`from`) at the time `since`
    (`time.monotonic`), and the step last shown (`shown`)."""
    return {"from": start, "since": time.monotonic() if now is None else now, "shown": start}


def next_step(clock: dict[str, float] | None, t: int, end: int, now: float | None = None) -> tuple[int, dict]:
    """The step a tick of the playing replay shows, and the clock after it. Steps follow the clock, not the
    ticks: a tick that came late (a busy machine, a slow redraw) shows the step due by then, so a replay keeps its
    pace of one step per PLAY_S and ends on time; every tick moves it on one step at least. A step moved by hand
    while it plays (`t` is not the step last shown) restarts the clock from there."""
    now = time.monotonic() if now is None else now
    if not clock or clock.get("shown") != t:
        clock = play_clock(t, now - PLAY_S)  # one step due now, from where the replay was moved to
    due = int(clock["from"] + round((now - clock["since"]) / PLAY_S))
    step = min(max(due, t + 1), end)
    return step, clock | {"shown": step}


def episode_view(engine: Engine, episode_id: Any, strip: bool = True) -> dict[str, Any]:
    """One episode for the viewer: the board's state (for `gr.State`), a header, the answer and (with `strip`) the
    "same board across stages" strip; `error` says why nothing could be shown."""
    if episode_id in (None, ""):
        return {"error": "Type an episode number, or click a failed episode in the Stage review tab."}
    try:
        episode_id = EPISODE_ID.check(episode_id)
    except ValueError as err:
        return {"error": f"✗ Episode: {err}."}
    found = episode_across_stages(engine, episode_id)
    if found is None:
        return {"error": f"There is no episode {episode_id}."}
    ep, same = found
    instance = Instance.model_validate(ep.instance)
    outcome = outcome_of(ep, instance)
    header = (f"**Episode {ep.id}**: run #{ep.run_id}, stage {ep.stage_index}, {ep.split} board `{ep.instance_id}` "
              f"({instance.size}x{instance.size}, {instance.num_agents} agents, optimal makespan "
              f"{instance.opt_makespan if instance.opt_makespan is not None else '?'}).  \n"
              f"{verdict(instance, outcome)} [Link to this episode](?episode={ep.id})")
    panels, strip_rows = [], []
    if strip and ep.split == Split.VALIDATION and len(same) > 1:
        for other in same:
            o = outcome if other.id == ep.id else outcome_of(other, instance)
            tag = "valid" if o.valid else str(o.failure)
            panels.append((instance, o, f"stage {other.stage_index}: {tag}"))
            strip_rows.append([other.stage_index, other.id, tag, o.message, other.completion[:300]])
    return {"error": None, "view": {"instance": instance.model_dump(mode="json"), "outcome": outcome.to_dict()},
            "header": header, "answer": ep.completion, "end": figures.last_step(outcome),
            "strip": figures.boards_figure(panels, columns=min(len(panels), 5)) if panels else None,
            "strip_table": table(["stage", "episode", "outcome", "message", "answer"], strip_rows)}


def _replay(view: dict[str, Any] | None, suffix: str, write: Callable[[Instance, Outcome, Path], Any]) -> str | None:
    """The open episode written by `write` to a fresh `replay-<board id><suffix>`, made when the episode opens so
    that one click downloads it; None without an episode."""
    if not view or not view.get("outcome"):
        return None
    instance = Instance.model_validate(view["instance"])
    sweep(REPLAYS, FILES_AGE_S)  # every opened episode writes one: those past their download go
    path = Path(tempfile.mkdtemp(prefix=REPLAYS)) / f"replay-{instance.id}{suffix}"
    write(instance, Outcome.from_dict(view["outcome"]), path)
    return str(path)


def replay_title(instance: Instance, outcome: Outcome) -> str:
    verdict = "valid" if outcome.valid else (outcome.failure.value if outcome.failure else "")
    return (f"envlab replay: board {instance.id}, {instance.size}x{instance.size}, {instance.num_agents} agents "
            f"({verdict})")


def replay_file(view: dict[str, Any] | None) -> str | None:
    """The open episode as a standalone animated HTML file (Plotly's own play button and slider), titled."""
    return _replay(view, ".html", lambda i, o, path: figures.write_replay_html(
        figures.replay_figure(i, o), str(path), replay_title(i, o)))


def gif_file(view: dict[str, Any] | None, width_px: Any = GIF_WIDTHS[0], ghost: bool = False) -> str | None:
    """The open episode as an animated GIF about `width_px` wide (`lab.replay`: one frame per step, for
    slides), with the solver's plan as rings where `ghost` (the board's ghost box) asks for it."""
    width = int(width_px or GIF_WIDTHS[0])
    return _replay(view, ".gif", lambda i, o, path: replay_gif(i, o, path, width_px=width, ghost=bool(ghost)))


def gif_button(view: dict[str, Any] | None, width_px: Any = None, ghost: bool = False) -> dict[str, Any]:
    """The GIF button with its file, saying the width it holds (a width picked later shows until its file is
    made, so the button never offers one file under another's name)."""
    width = int(width_px or GIF_WIDTHS[0])
    return gr.update(value=gif_file(view, width, ghost), interactive=view is not None,
                     label=f"Download GIF ({width} px)")


@dataclass(eq=False)
class EpisodeTab:
    engine: Engine
    episode_id: gr.Number
    header: gr.Markdown
    view: gr.State  # {"instance", "outcome"} of the open episode
    board: gr.Plot
    step: gr.Slider
    play: gr.Button
    ghost: gr.Checkbox
    events: gr.Markdown
    answer: gr.Textbox
    strip_note: gr.Markdown
    strip: gr.Plot
    strip_table: gr.Dataframe
    playing: gr.State
    ticker: gr.Timer
    gif: gr.DownloadButton
    html: gr.DownloadButton
    gif_width: gr.Dropdown
    opened_here: gr.State  # whether the tab's first visit opened an episode (`first_visit`)

    @property
    def opens(self) -> list[Any]:
        """What `show` reads: the episode's number and the ghost box."""
        return [self.episode_id, self.ghost]

    @property
    def follows(self) -> list[Any]:
        """What `extras` reads."""
        return [self.episode_id, self.view, self.gif_width, self.ghost]

    @property
    def extra_outputs(self) -> list[Any]:
        """What `extras` fills."""
        return [self.gif, self.html, self.strip_note, self.strip, self.strip_table]

    @property
    def outputs(self) -> list[Any]:
        return [self.view, self.header, self.answer, self.step, self.board, self.events, self.strip_note, self.strip,
                self.strip_table, self.playing, self.ticker, self.play, self.gif, self.html]

    def show(self, episode_id: Any, ghost: bool) -> dict[Any, Any]:
        """An episode opened: its replay at t = 0. The same board across stages and the two files (the GIF, the
        HTML replay) follow in a second answer (`extras`), so the board is drawn first."""
        v = episode_view(self.engine, episode_id, strip=False)
        stopped = {self.playing: None, self.ticker: gr.Timer(active=False), self.play: "▶ Play"}
        if v["error"]:
            return {self.view: None, self.header: v["error"], self.answer: "", self.step: gr.update(maximum=1, value=0),
                    self.gif: gr.update(value=None, interactive=False),
                    self.html: gr.update(value=None, interactive=False),
                    # the header says why once; the empty board only says there is none
                    self.board: figures.empty_figure("no episode open"), self.events: "", self.strip_note: "",
                    self.strip: gr.update(visible=False), self.strip_table: gr.update(visible=False)} | stopped
        fig, events = draw(v["view"], 0, ghost)
        return {self.view: v["view"], self.header: v["header"], self.answer: v["answer"],
                self.gif: gr.update(value=None, interactive=False), self.html: gr.update(value=None, interactive=False),
                self.step: gr.update(maximum=max(v["end"], 1), value=0), self.board: fig, self.events: events,
                self.strip_note: "", self.strip: gr.update(visible=False),
                self.strip_table: gr.update(visible=False)} | stopped

    def first_visit(self, view: dict | None, run_id: int | None) -> dict[Any, Any]:
        """The tab opened with no episode open: run `run_id`'s first failed episode (`first_failure`), said so
        above it. An episode already open stays."""
        first = None if view is not None or run_id is None else first_failure(self.engine, run_id)
        if first is None:
            return {self.episode_id: gr.skip(), self.opened_here: False}
        shown = self.show(first.id, True)
        what = "first failed episode" if first.failure is not None else "first episode (none failed)"
        shown[self.header] = (f"_Run #{run_id}'s {what} at stage {first.stage_index}; open another from Stage "
                              f"review's failures, or type its number._\n\n{shown[self.header]}")
        return shown | {self.episode_id: first.id, self.opened_here: True}

    def extras_if_opened(self, opened: bool, episode_id: Any, view: dict | None, gif_width: Any = None,
                         ghost: bool = False) -> dict[Any, Any]:
        """`extras` after `first_visit` opened an episode; nothing when it left the one open."""
        return self.extras(episode_id, view, gif_width, ghost) if opened else \
            {output: gr.skip() for output in self.extra_outputs}

    def extras(self, episode_id: Any, view: dict | None, gif_width: Any = None, ghost: bool = False) -> dict[Any, Any]:
        """What follows an opened episode's board (`show`), in the answer after it: the same board across stages,
        and its files (`files`)."""
        v = episode_view(self.engine, episode_id) if view else {"error": "no episode"}
        if v["error"]:
            return self.files(None)
        has_strip = v["strip"] is not None
        strip_note = "### Same board across stages" if has_strip else "_This board was evaluated at one stage only._"
        return self.files(view, gif_width, ghost) | {
            self.strip_note: strip_note, self.strip: gr.update(value=v["strip"], visible=has_strip),
            self.strip_table: gr.update(value=v["strip_table"], visible=has_strip)}

    def files(self, view: dict | None, gif_width: Any = None, ghost: bool = False) -> dict[Any, Any]:
        """The open episode's files: its GIF at the width chosen (the first offered when none is) and its HTML
        replay; each button clickable once its file is made."""
        return {self.gif: gif_button(view, gif_width, ghost),
                self.html: gr.update(value=replay_file(view), interactive=view is not None)}

    def redraw(self, view: dict | None, t: Any, ghost: bool) -> dict[Any, Any]:
        fig, events = draw(view, t, ghost)
        return {self.board: fig, self.events: events}

    def toggle_play(self, view: dict | None, clock: dict | None, t: Any) -> dict[Any, Any]:
        """Play (from the start when the replay is at its end) or pause; `clock` is the replay's while it plays."""
        if not view:
            return {self.playing: None, self.ticker: gr.Timer(active=False), self.play: "▶ Play", self.step: t}
        end = view_end(view)
        starting = not clock
        t = 0 if starting and int(t or 0) >= end else int(t or 0)
        return {self.playing: play_clock(t) if starting else None, self.ticker: gr.Timer(active=starting),
                self.play: "❚❚ Pause" if starting else "▶ Play", self.step: t}

    def tick(self, view: dict | None, clock: dict | None, t: Any, ghost: bool) -> dict[Any, Any]:
        end = view_end(view)
        t, clock = next_step(clock, int(t or 0), end)
        going = t < end
        return self.redraw(view, t, ghost) | {self.step: t, self.playing: clock if going else None,
                self.ticker: gr.Timer(active=going), self.play: "❚❚ Pause" if going else "▶ Play"}


DISABLE_GIF = """() => { const el = document.getElementById('replay-gif');
    const button = el && (el.tagName === 'BUTTON' ? el : el.querySelector('button'));
    if (button) button.disabled = true; }"""


def build(page: Page) -> EpisodeTab:
    with gr.Row():
        episode_id = gr.Number(label="Episode", value=None, scale=0, min_width=140, elem_id="episode-id")
        open_episode = gr.Button("Open", scale=0, min_width=90)
        header = gr.Markdown("Open an episode from the failure gallery, or type its number.",
                             elem_id="episode-header")
    view = gr.State(None)
    with gr.Row():
        with gr.Column(scale=3):
            board = gr.Plot(show_label=False, elem_id="replay")
            step = gr.Slider(0, 1, value=0, step=1, label="Time step t", elem_id="replay-step")
            with gr.Row():
                play = gr.Button("▶ Play", scale=0, min_width=110, elem_id="replay-play")
                ghost = gr.Checkbox(label="Show the solver's optimal plan as a ghost", value=True)
                html = gr.DownloadButton("Save animated replay (HTML)", scale=0, interactive=False,
                                         elem_id="replay-html")
                gif_width = gr.Dropdown(list(GIF_WIDTHS), value=GIF_WIDTHS[0], label="GIF width (px)", scale=0,
                                        min_width=120, elem_id="gif-width")
                gif = gr.DownloadButton("Download GIF", scale=0, interactive=False, elem_id="replay-gif")
            events = gr.Markdown(elem_id="replay-events")
        with gr.Column(scale=2):
            answer = gr.Textbox(label="The policy's raw answer", lines=18, interactive=False, elem_id="raw-answer")
    strip_note = gr.Markdown()
    strip = gr.Plot(show_label=False, visible=False)
    strip_table = gr.Dataframe(label="Its answer at each stage", interactive=False, visible=False, wrap=True,
                               column_widths=["60px", "80px", "150px", "35%", "40%"], elem_id="strip-table")
    tab = EpisodeTab(page.engine, episode_id, header, view, board, step, play, ghost, events, answer, strip_note,
                     strip, strip_table, gr.State(None), gr.Timer(PLAY_S, active=False), gif, html, gif_width,
                     gr.State(False))
    gr.on([open_episode.click, episode_id.submit], tab.show, tab.opens, tab.outputs) \
        .then(tab.extras, tab.follows, tab.extra_outputs, **no_progress(page))
    gr.on([step.input, ghost.input], tab.redraw, [view, step, ghost], [board, events], trigger_mode="always_last",
          **no_progress(page))
    # A new width or ghost: the button is disabled at once, in the browser before any round trip (a click right
    # after the pick would otherwise still download the old file), and by the server outside the queue; then it holds
    # the new file.
    gr.on([gif_width.select, ghost.input], lambda: gr.update(interactive=False), None, gif, queue=False,
          trigger_mode="always_last", js=DISABLE_GIF).then(
        lambda v, w, g: {gif: gif_button(v, w, g)}, [view, gif_width, ghost], gif, trigger_mode="always_last")
    play.click(tab.toggle_play, [view, tab.playing, step], [tab.playing, tab.ticker, play, step])
    tab.ticker.tick(tab.tick, [view, tab.playing, step, ghost], [step, board, events, tab.playing, tab.ticker, play],
                    **no_progress(page))
    return tab
