"""The Leaderboard tab: the paper's benchmark tables for chosen checkpoints side by side, and the button that
queues a stage's benchmark evaluation.

Only here does the page show the paper's "mean over map sizes" (the unweighted mean of the per-size rates,
`envsim.suite.report`); everywhere else a stage's rate is pooled over its episodes (docs/results.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gradio as gr
from sqlalchemy import Engine

from lab.experiments import benchmark_choices
from lab.loop import LoopError, queue_benchmark
from lab.pages.common import Page, table
from lab.runs import benchmark_report


def checkpoint_choices(engine: Engine) -> list[tuple[str, str]]:
    """Every (run, stage) with episodes on the benchmark, as `run_id:stage_index` keys; runs of an experiment
    grouped by it (`exp NAME / ARM / seed K`)."""
    return benchmark_choices(engine)


def leaderboard(engine: Engine, keys: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any], str]:
    """The paper's tables for each chosen checkpoint, side by side: valid / optimal per (agents, size) with
    the mean over sizes, and per (agents, wait subset)."""
    reports = {key: benchmark_report(engine, *map(int, key.split(":"))) for key in keys}
    if not reports:
        note = ("No checkpoint is chosen, or none has been evaluated on the benchmark yet: pick a run and stage "
                "below and queue a benchmark evaluation (3,150 boards).")
        return table(["agents", "size"], []), table(["agents", "wait subset"], []), note
    cell = "{:.1%} / {:.1%}".format
    keys = list(reports)
    rows_size = sorted({k for r in reports.values() for k in r.by_size})
    by_size = [[a, f"{n}x{n}", *(cell(*reports[k].by_size[(a, n)][:2]) if (a, n) in reports[k].by_size else "-"
                                 for k in keys)] for a, n in rows_size]
    for a in sorted({a for a, _ in rows_size}):
        by_size.append([a, "mean", *(cell(*reports[k].mean_over_sizes[a]) if a in reports[k].mean_over_sizes
                                     else "-" for k in keys)])
    rows_subset = sorted({k for r in reports.values() for k in r.by_subset})
    by_subset = [[a, "unknown" if w < 0 else f"{w:.2f}", *(cell(*reports[k].by_subset[(a, w)][:2])
                                                          if (a, w) in reports[k].by_subset else "-" for k in keys)]
                 for a, w in rows_subset]
    labels = {v: lbl for lbl, v in checkpoint_choices(engine)}
    columns = [labels.get(k, k) for k in keys]
    note = "Each cell: valid rate / optimal rate."
    if any(w < 0 for _, w in rows_subset):
        note += " Wait subset “unknown”: those episodes were stored before episodes kept their subset."
    return table(["agents", "size", *columns], by_size), table(["agents", "wait subset", *columns], by_subset), note


def benchmark_stage(engine: Engine, run_id: int | None, stage_index: Any) -> str:
    if run_id is None or stage_index in (None, ""):
        return "Pick a run and one of its evaluated stages first."
    try:
        job = queue_benchmark(engine, int(run_id), int(stage_index))
    except LoopError as err:
        return f"✗ {err}"
    return f"Queued benchmark job {job.id} for run #{run_id}, stage {stage_index}: the worker evaluates 3,150 boards."


@dataclass(eq=False)
class LeaderboardTab:
    engine: Engine
    pick: gr.Dropdown
    note: gr.Markdown
    by_size: gr.Dataframe
    by_subset: gr.Dataframe

    def choices(self) -> dict[Any, Any]:
        return {self.pick: gr.update(choices=checkpoint_choices(self.engine))}

    def show(self, keys: list[str] | None) -> dict[Any, Any]:
        by_size, by_subset, note = leaderboard(self.engine, keys or [])
        shown = bool(by_size["data"])
        return {self.by_size: gr.update(value=by_size, visible=shown),
                self.by_subset: gr.update(value=by_subset, visible=shown), self.note: note}


def build(page: Page) -> LeaderboardTab:
    pick = gr.Dropdown(label="Checkpoints evaluated on the benchmark", choices=[], multiselect=True, elem_id="lb-pick")
    note = gr.Markdown()
    by_size = gr.Dataframe(label="Valid / optimal rate by agents × map size (and the mean over sizes, as in the "
                                 "paper)", interactive=False, visible=False)
    by_subset = gr.Dataframe(label="Valid / optimal rate by agents × wait subset", interactive=False, visible=False)
    gr.Markdown("**Evaluate a checkpoint**: a stage of the open run on the 3,150 benchmark boards "
                "(agents 3-5, sizes up to 10x10), as a job for the worker.")
    with gr.Row():
        stage = gr.Number(label="Stage", value=None, precision=0, scale=0, min_width=120)
        queue = gr.Button("Queue the benchmark evaluation", scale=0, min_width=260)
        message = gr.Markdown()
    tab = LeaderboardTab(page.engine, pick, note, by_size, by_subset)
    pick.change(tab.show, pick, [by_size, by_subset, note])

    def queue_clicked(run_id: int | None, stage_index: Any) -> dict[Any, Any]:
        return {message: benchmark_stage(page.engine, run_id, stage_index)}

    queue.click(queue_clicked, [page.run_pick, stage], message)
    return tab
