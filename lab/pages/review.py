"""The Stage review tab: what the policy gets right and wrong at each stage, and the gallery of its failures.

A stage's valid and optimal rates are its pooled rates (`lab.results`, docs/results.md), in the table, the
note and the thick curves alike; the bars and the thin curves are per map size. Where the validation boards have
several agent counts, the note adds a small table of each count's rates.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import gradio as gr
from sqlalchemy import Engine

from envsim.config import AGENT_RATIO, GLOBALS, KNOBS, RANDOM_SHARE, EnvConfig, mix_text
from envsim.scoring import Tally
from lab.pages import figures
from lab.pages.common import ALL, BAD_ROW, DECIDED, VIEW, Page, cannot_draw, no_progress, table
from lab.pages.figures import POOLED_OPTIMAL, POOLED_VALID
from lab.results import StageSummary
from lab.runs import StageReview, config_timeline, failed_episodes, stage_review


def _share(t: Tally, rate: str) -> str:
    return f"{getattr(t, rate):.1%}" if t.episodes else "-"


PLOTS = ("rates", "curves", "failures", "training")


def review(engine: Engine, run_id: int | None, stage_index: int | None, plots: bool = True) -> dict[str, Any]:
    """Everything the Stage review tab shows for one stage of a run (default: the latest evaluated); without
    `plots`, its figures (`PLOTS`) are None."""
    if run_id is None:
        return _blank(engine, "No run is open: create one in the Runs tab or pick one above.")
    try:
        return _review(engine, run_id, stage_index, plots)
    except BAD_ROW as err:
        return _blank(engine, cannot_draw("The stage review", run_id, err))


def _blank(engine: Engine, note: str) -> dict[str, Any]:
    """The tab with nothing drawn but `note`."""
    empty = figures.empty_figure
    return dict(note=note, stages=[], stage=None, table=table(["stage"], []), rates=empty(note),
                curves=empty(note), failures=empty(note), training=empty(note), sizes=[], agents=[], kinds=[],
                timeline=timeline(engine, None))


def _review(engine: Engine, run_id: int, stage_index: int | None, plots: bool) -> dict[str, Any]:
    r = stage_review(engine, run_id, stage_index)
    current = r.summaries.get(r.stage_index)
    drawn = _figures(r, current) if plots else dict.fromkeys(PLOTS)
    return dict(
        note=_note(r, current), stages=[(f"stage {stage.index} ({stage.status})", stage.index) for stage in r.stages],
        stage=r.stage_index, table=_stages_table(r), sizes=sorted(current.by_size) if current else [],
        agents=sorted(current.by_agents) if current else [], kinds=r.failure_kinds, timeline=timeline(engine, run_id),
        **drawn)


def review_figures(engine: Engine, run_id: int | None, stage_index: int | None) -> dict[str, Any]:
    """The tab's four figures (`PLOTS`) for one stage of a run, and nothing else read."""
    if run_id is None:
        return {name: figures.empty_figure("No run is open: create one in the Runs tab or pick one above.")
                for name in PLOTS}
    try:
        r = stage_review(engine, run_id, stage_index)
    except BAD_ROW as err:
        return {name: figures.empty_figure(cannot_draw("The stage review", run_id, err)) for name in PLOTS}
    return _figures(r, r.summaries.get(r.stage_index))


def _figures(r: StageReview, current: StageSummary | None) -> dict[str, Any]:
    empty = figures.empty_figure
    why = "no evaluation yet" if r.stage_index is not None else _note(r, current)
    return dict(rates=figures.rates_figure(current.by_size) if current else empty(why),
                curves=figures.curves_figure(r.summaries),
                failures=figures.failure_heatmap(current.by_size) if current else empty(why),
                training=figures.training_figure(r.logs))


def _note(r: StageReview, current: StageSummary | None) -> str:
    if current is not None:
        pooled = current.pooled
        return (f"Stage {r.stage_index}: valid {_share(pooled, 'valid_rate')}, optimal "
                f"{_share(pooled, 'optimal_rate')} over {pooled.episodes} validation boards."
                + agents_table(current))
    if r.stage_index is not None:
        status = next(stage.status for stage in r.stages if stage.index == r.stage_index)
        return (f"Stage {r.stage_index} is {status} and has no evaluation yet: its results appear here when its "
                "job ends (the Train tab shows its progress).")
    return "This run has no stages yet."


def agents_table(summary: StageSummary) -> str:
    """Valid and optimal rate per agent count, as a Markdown table after a blank line; "" for boards of one
    count (the note says the pooled rates, which are that count's)."""
    if len(summary.by_agents) < 2:
        return ""
    rows = [f"| {k} | {t.episodes} | {_share(t, 'valid_rate')} | {_share(t, 'optimal_rate')} |"
            for k, t in summary.by_agents.items()]
    return "\n\n" + "\n".join(["| agents | boards | valid | optimal |", "|---:|---:|---:|---:|", *rows])


def _stages_table(r: StageReview) -> dict[str, Any]:
    rows = []
    for stage in r.stages:
        pooled = r.summaries[stage.index].pooled if stage.index in r.summaries else Tally()
        source = "initial config"
        if stage.index in r.decided:
            p, d = r.decided[stage.index]
            source = f"proposal #{p.id}, {DECIDED[d.action]} by {d.user}"
        rows.append([stage.index, stage.status, source, _share(pooled, "valid_rate"), _share(pooled, "optimal_rate"),
                     pooled.episodes])
    return table(["stage", "status", "config from", POOLED_VALID, POOLED_OPTIMAL, "episodes"], rows)


TIMELINE_NOTE = ("Each stage's config as it trained, per map size. A value that changed from the stage before says "
                 "who set it: (engineer) proposed and accepted, (person) a person's edit, (auto-apply) applied "
                 "by the run itself; a plain value carried over.")


def timeline(engine: Engine, run_id: int | None) -> dict[str, Any]:
    """The config each stage of the run trained on, per size, and who set each value that changed; the agent mix
    as text (`2=0.5, 3=0.5`); a `random_share` column where a stage drew boards broadly."""
    headers = ["stage", "config from", "size", *KNOBS, AGENT_RATIO, *GLOBALS]
    if run_id is None:
        return table(headers, [])
    steps = config_timeline(engine, run_id)
    shared = [RANDOM_SHARE] if any(step.config.random_share for step in steps) else []
    rows = []
    for step in steps:
        config = step.config
        for size in config.sizes:
            rows.append([step.stage_index, step.source, size,
                         *(_cell(step.set_by, f"{k}[{size}]", getattr(config, k)[size]) for k in KNOBS),
                         _mix_cell(step.set_by, config),
                         *(_cell(step.set_by, g, getattr(config, g)) for g in [*GLOBALS, *shared])])
    return table(headers + shared, rows)


def _cell(set_by: dict[str, Any], field: str, value: Any) -> str:
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    return f"{text} ({set_by[field]})" if field in set_by else text


def _mix_cell(set_by: dict[str, Any], config: EnvConfig) -> str:
    """The agent mix, with who set it where a share of it changed."""
    setters = [by for field, by in set_by.items() if field.startswith(f"{AGENT_RATIO}[")]
    text = mix_text(config.agent_ratio)
    return f"{text} ({setters[0]})" if setters else text


PER_PAGE = 200  # the gallery's rows per page


def _picked(value: Any) -> int | str | None:
    """A filter's value as the query takes it: None for all."""
    return None if value in (None, ALL, "") else value


def gallery(engine: Engine, run_id: int | None, stage_index: int | None, size: Any = ALL, failure: str = ALL,
            agents: Any = ALL, page: Any = 1, per_page: int = PER_PAGE) -> tuple[dict[str, Any], str, int]:
    """The failed validation episodes of a stage, filtered by map size, failure type and agent count, one page of
    `per_page` rows at a time: the table, a note that says which rows of how many, and the page shown (`page`
    brought into range)."""
    headers = ["episode", "size", "agents", "failure", "what happened"]
    if run_id is None or stage_index is None:
        return table(headers, []), "No stage to show: open a run first.", 1
    size, failure, agents = (_picked(v) for v in (size, failure, agents))
    query = dict(size=None if size is None else int(size), failure=failure,
                 agents=None if agents is None else int(agents))
    page = max(1, int(page or 1))  # a box that rounds nothing: 1.5 is page 1
    episodes, total = failed_episodes(engine, run_id, stage_index, limit=per_page, offset=(page - 1) * per_page,
                                      **query)
    pages = max(1, -(-total // per_page))
    if page > pages:  # past the last page (the filters left fewer rows): the last page
        page = pages
        episodes, _ = failed_episodes(engine, run_id, stage_index, limit=per_page, offset=(page - 1) * per_page,
                                      **query)
    rows = [[ep.id, ep.size, ep.num_agents, ep.failure, ep.outcome.get("message", "")] for ep in episodes]
    if total > per_page:
        first = (page - 1) * per_page + 1
        note = (f"{total} failed episodes: {first} to {first + len(rows) - 1} shown (page {page} of {pages}). "
                "Click a row to replay it.")
    elif rows:
        note = f"{total} failed episode(s). Click a row to replay it."
    else:
        note = "No failed episodes match these filters." if any(v is not None for v in query.values()) else \
            "No failed episodes at this stage (or it has not been evaluated yet)."
    return table(headers, rows), note, page


_DRAWN = itertools.count(1)  # each `show` its own number, so that `due` changes (and the plots follow) every time


@dataclass(eq=False)
class ReviewTab:
    engine: Engine
    stage_pick: gr.Dropdown
    note: gr.Markdown
    stages: gr.Dataframe
    timeline: gr.Dataframe
    rates: gr.Plot
    curves: gr.Plot
    failures: gr.Plot
    training: gr.Plot
    size_filter: gr.Dropdown
    failure_filter: gr.Dropdown
    agents_filter: gr.Dropdown
    page_box: gr.Number  # the gallery's page, from 1
    gallery: gr.Dataframe
    gallery_note: gr.Markdown
    shown: gr.State  # the stage drawn: what the page's poll and the filters read, never the dropdown's value in flight
    due: gr.State  # the plots to draw next: (run, stage, a number of its own), set by `show`, drawn by `plots`

    @property
    def outputs(self) -> list[Any]:
        return [self.stage_pick, self.note, self.stages, self.timeline, self.rates, self.curves, self.failures,
                self.training, self.size_filter, self.failure_filter, self.agents_filter, self.page_box, self.gallery,
                self.gallery_note, self.shown, self.due]

    @property
    def figures(self) -> list[gr.Plot]:
        return [self.rates, self.curves, self.failures, self.training]

    def show(self, run_id: int | None, stage_index: int | None = None) -> dict[Any, Any]:
        """A stage of a run (default: the latest evaluated): its tables, its note and its failure gallery, with its
        plots cleared; they follow in the answer after this one (`plots`, on `due`'s change), so the browser shows
        the gallery before it spends its time drawing four plots."""
        r = review(self.engine, run_id, stage_index, plots=False)
        rows, note, _ = gallery(self.engine, run_id, r["stage"])
        return {self.stage_pick: gr.update(choices=r["stages"], value=r["stage"]), self.note: r["note"],
                self.stages: r["table"], self.timeline: r["timeline"],
                self.size_filter: gr.update(choices=[ALL, *r["sizes"]], value=ALL),
                self.failure_filter: gr.update(choices=[ALL, *r["kinds"]], value=ALL),
                self.agents_filter: gr.update(choices=[ALL, *r["agents"]], value=ALL), self.page_box: 1,
                self.gallery: rows, self.gallery_note: note, self.shown: r["stage"],
                self.due: (run_id, r["stage"], next(_DRAWN))} | dict.fromkeys(self.figures)

    def plots(self, due: tuple[int | None, int | None, int] | None) -> dict[Any, Any]:
        """The four plots of the stage `show` drew last (`due`)."""
        if due is None:
            return {plot: gr.update() for plot in self.figures}
        drawn = review_figures(self.engine, due[0], due[1])
        return {plot: drawn[name] for plot, name in zip(self.figures, PLOTS, strict=True)}

    def filter(self, run_id: int | None, stage_index: int | None, size: Any, failure: str, agents: Any = ALL,
               page: Any = 1) -> dict[Any, Any]:
        """The gallery's page `page` under the filters (a filter picked: its first page)."""
        rows, note, page = gallery(self.engine, run_id, stage_index, size, failure, agents, page)
        return {self.gallery: rows, self.gallery_note: note, self.page_box: page}


def build(page: Page) -> ReviewTab:
    with gr.Row():
        stage_pick = gr.Dropdown(label="Stage", choices=[], value=None, scale=1, elem_id="review-stage")
        note = gr.Markdown(elem_id="review-note")
    stages = gr.Dataframe(label="Stages (rates pooled over all the stage's validation boards)", interactive=False)
    with gr.Accordion("Config timeline: the config each stage trained on, and who set each value", open=True):
        gr.Markdown(TIMELINE_NOTE)
        timeline_df = gr.Dataframe(interactive=False, elem_id="config-timeline", max_height=360)
    with gr.Row():
        rates = gr.Plot(label="Valid and optimal rate per map size")
        curves = gr.Plot(label="Across stages: pooled rates (thick), each size's valid rate (thin)")
    with gr.Row():
        failures = gr.Plot(label="Failures: map size × failure type")
        training = gr.Plot(label="Training curves")
    gr.Markdown("### Failure gallery")
    with gr.Row():
        size_filter = gr.Dropdown(label="Map size", choices=[ALL], value=ALL, scale=0, min_width=140)
        failure_filter = gr.Dropdown(label="Failure type", choices=[ALL], value=ALL, scale=0, min_width=200)
        agents_filter = gr.Dropdown(label="Agents", choices=[ALL], value=ALL, scale=0, min_width=110,
                                    elem_id="gallery-agents")
        page_box = gr.Number(label="Page", value=1, minimum=1, scale=0, min_width=90,
                             elem_id="gallery-page")
        gallery_note = gr.Markdown(elem_id="gallery-note")
    gallery_df = gr.Dataframe(interactive=False, elem_id="gallery", max_height=360, wrap=True)
    tab = ReviewTab(page.engine, stage_pick, note, stages, timeline_df, rates, curves, failures, training, size_filter,
                    failure_filter, agents_filter, page_box, gallery_df, gallery_note, gr.State(None), gr.State(None))
    stage_pick.select(tab.show, [page.run_pick, stage_pick], tab.outputs, trigger_mode="always_last", **VIEW)
    tab.due.change(tab.plots, tab.due, tab.figures, **no_progress(page), **VIEW)
    filters = [page.run_pick, tab.shown, size_filter, failure_filter, agents_filter]
    gallery_out = [gallery_df, gallery_note, page_box]
    gr.on([size_filter.select, failure_filter.select, agents_filter.select], tab.filter, filters, gallery_out,
          trigger_mode="always_last")
    gr.on([page_box.submit, page_box.input], tab.filter, [*filters, page_box], gallery_out,
          trigger_mode="always_last")
    return tab
