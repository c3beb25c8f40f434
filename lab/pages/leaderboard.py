"""The Leaderboard tab: the paper's own results as reference, the mean over map sizes of the shipped tiny
policy and of chosen checkpoints, the paper's benchmark tables for those checkpoints side by side, and the button
that queues a stage's benchmark evaluation.

Only here does the page show the paper's "mean over map sizes" (the unweighted mean of the per-size rates,
`envsim.suite.report`); everywhere else a stage's rate is pooled over its episodes (docs/results.md). The paper's
rows (`lab.study.reference`) sit in a table of their own, labelled with their source, never among this lab's rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gradio as gr
from sqlalchemy import Engine

from envsim.suite import Report
from lab.loop import LoopError, queue_benchmark
from lab.pages.common import Page, table
from lab.runs import benchmark_report
from lab.settings import Count
from lab.study.experiments import benchmark_choices
from lab.study.reference import ReferenceRow, paper_rows, percent, tiny_row
from storage.settings import MAX_STAGES

PAPER = "arXiv 2606.17682"
STAGE_INDEX = Count(0, MAX_STAGES.high, "a run trains at most that many stages after stage 0")


def checkpoint_choices(engine: Engine) -> list[tuple[str, str]]:
    """Every (run, stage) with episodes on the benchmark, as `run_id:stage_index` keys; runs of an experiment
    grouped by it (`exp NAME / ARM / seed K`)."""
    return benchmark_choices(engine)


def opening_checkpoint(offered: Sequence[tuple[str, str]], run_id: int | None) -> list[str]:
    """The checkpoint the panel opens on when none is chosen: the open run's last stage evaluated on the benchmark,
    else the last checkpoint offered; none when none is."""
    keys = [key for _, key in offered]
    return ([key for key in keys if key.split(":")[0] == str(run_id)] or keys)[-1:]


def _means_table(first: str, rows: Sequence[ReferenceRow]) -> dict[str, Any]:
    """One row per result, one column per number of agents: "valid % / optimal %" of the mean over sizes."""
    agents = sorted({a for row in rows for a in row.mean_over_sizes})
    data = [[row.name, *("{:.2f} / {:.2f}".format(*row.mean_over_sizes[a]) if a in row.mean_over_sizes else "-"
                         for a in agents)] for row in rows]
    return table([first, *(f"{a} agents" for a in agents)], data)


def reference() -> tuple[dict[str, Any], str]:
    """The paper's rows (mean over map sizes) and where they come from."""
    rows = paper_rows()
    source = rows[0].source if rows else ""
    return _means_table(f"paper ({PAPER})", [ReferenceRow(f"paper: {r.name}", r.source, r.mean_over_sizes)
                                               for r in rows]), f"Source: {source}."


def local_means(reports: dict[str, Report], labels: dict[str, str]) -> tuple[dict[str, Any], str]:
    """This lab's rows (mean over map sizes): the shipped tiny policy's result, then each chosen checkpoint; the
    note says where the tiny policy's comes from and which boards each row was scored on (`boards_note`)."""
    tiny = tiny_row()
    rows = [tiny] if tiny else []
    rows += [ReferenceRow(labels.get(key, key), "", {a: (percent(v), percent(o)) for a, (v, o) in
                                                      r.mean_over_sizes.items()}, r.boards)
             for key, r in reports.items()]
    note = f"Tiny policy: {tiny.source}" if tiny else "The tiny policy's result is missing " \
        "(assets/leaderboard/tiny.json; `python benchmarks/tiny_benchmark.py` writes it)."
    return _means_table("this lab", rows), "\n\n".join([note, *boards_note(rows)])


def boards_note(rows: Sequence[ReferenceRow]) -> list[str]:
    """Which boards the rows were scored on, one line per hash (`envsim.suite.boards_hash`: the hash
    `envlab bench-suite` prints for the boards it writes), rows scored on the same boards together."""
    by_hash: dict[str, list[str]] = {}
    for row in rows:
        by_hash.setdefault(row.boards, []).append(row.name)
    return [f"Boards sha256 `{boards}`: {', '.join(names)}." if boards else
            f"Boards not hashed (scored before results kept the hash): {', '.join(names)}."
            for boards, names in by_hash.items()]


def checkpoint_tables(reports: dict[str, Report], labels: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any],
                                                                                  str]:
    """The paper's tables for each chosen checkpoint, side by side: valid / optimal per (agents, size) with
    the mean over sizes, and per (agents, wait subset)."""
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
    columns = [labels.get(k, k) for k in keys]
    note = "Each cell: valid rate / optimal rate."
    if any(w < 0 for _, w in rows_subset):
        note += " Wait subset “unknown”: those episodes were stored before episodes kept their subset."
    return table(["agents", "size", *columns], by_size), table(["agents", "wait subset", *columns], by_subset), note


def leaderboard(engine: Engine, keys: Sequence[str]) -> dict[str, Any]:
    """Everything the tab shows for the chosen checkpoints `keys`: `reference` (the paper's rows) and its
    `source`, `local` (the tiny policy and each checkpoint, mean over sizes) and its `local_note`, and the
    checkpoints' full tables `by_size` and `by_subset` with their `note`."""
    reports = {key: benchmark_report(engine, *map(int, key.split(":"))) for key in keys}
    labels = {v: lbl for lbl, v in checkpoint_choices(engine)}
    ref, source = reference()
    local, local_note = local_means(reports, labels)
    by_size, by_subset, note = checkpoint_tables(reports, labels)
    return {"reference": ref, "source": source, "local": local, "local_note": local_note, "by_size": by_size,
            "by_subset": by_subset, "note": note}


def benchmark_stage(engine: Engine, run_id: int | None, stage_index: Any) -> str:
    if run_id is None or stage_index in (None, ""):
        return "Pick a run and one of its evaluated stages first."
    try:
        stage_index = STAGE_INDEX.check(stage_index)
    except ValueError as err:
        return f"✗ Stage: {err}."
    try:
        job = queue_benchmark(engine, int(run_id), stage_index)
    except LoopError as err:
        return f"✗ Not queued: {err}."
    return f"Queued benchmark job {job.id} for run #{run_id}, stage {stage_index}: the worker evaluates 3,150 boards."


@dataclass(eq=False)
class LeaderboardTab:
    engine: Engine
    pick: gr.Dropdown
    note: gr.Markdown
    by_size: gr.Dataframe
    by_subset: gr.Dataframe
    reference: gr.Dataframe
    source: gr.Markdown
    local: gr.Dataframe
    local_note: gr.Markdown

    @property
    def outputs(self) -> list[Any]:
        return [self.reference, self.source, self.local, self.local_note, self.by_size, self.by_subset, self.note]

    def choices(self) -> dict[Any, Any]:
        return {self.pick: gr.update(choices=checkpoint_choices(self.engine))}

    def opened(self, keys: list[str] | None, run_id: int | None = None) -> dict[Any, Any]:
        """The tab opened: the checkpoints offered, and the tables of those chosen; with none chosen, of the one
        `opening_checkpoint` picks, so the panel never opens empty while checkpoints are listed."""
        offered = checkpoint_choices(self.engine)
        keys = keys or opening_checkpoint(offered, run_id)
        return {self.pick: gr.update(choices=offered, value=keys)} | self.show(keys)

    def show(self, keys: list[str] | None) -> dict[Any, Any]:
        v = leaderboard(self.engine, keys or [])
        shown = bool(v["by_size"]["data"])
        return {self.reference: v["reference"], self.source: v["source"], self.local: v["local"],
                self.local_note: v["local_note"], self.by_size: gr.update(value=v["by_size"], visible=shown),
                self.by_subset: gr.update(value=v["by_subset"], visible=shown), self.note: v["note"]}


def build(page: Page) -> LeaderboardTab:
    gr.Markdown("Mean over map sizes on the 3,150-board benchmark (agents 3-5, sizes up to 10x10), as the paper "
                "reports it. Each cell: valid % / optimal %.")
    reference_df = gr.Dataframe(label=f"Reference (paper, {PAPER}): not run in this lab", interactive=False,
                                elem_id="lb-reference")
    source = gr.Markdown(elem_id="lb-source")
    local = gr.Dataframe(label="This lab: the shipped tiny policy and the checkpoints chosen below",
                         interactive=False, elem_id="lb-local")
    local_note = gr.Markdown(elem_id="lb-local-note")
    pick = gr.Dropdown(label="Checkpoints evaluated on the benchmark", choices=[], multiselect=True, elem_id="lb-pick")
    note = gr.Markdown()
    by_size = gr.Dataframe(label="Valid / optimal rate by agents × map size (and the mean over sizes, as in the "
                                 "paper)", interactive=False, visible=False)
    by_subset = gr.Dataframe(label="Valid / optimal rate by agents × wait subset", interactive=False, visible=False)
    gr.Markdown("**Evaluate a checkpoint**: a stage of the open run on the 3,150 benchmark boards "
                "(agents 3-5, sizes up to 10x10), as a job for the worker.")
    with gr.Row():
        stage = gr.Number(label="Stage", value=None, scale=0, min_width=120)
        queue = gr.Button("Queue the benchmark evaluation", scale=0, min_width=260)
        message = gr.Markdown()
    tab = LeaderboardTab(page.engine, pick, note, by_size, by_subset, reference_df, source, local, local_note)
    pick.change(tab.show, pick, tab.outputs)

    def queue_clicked(run_id: int | None, stage_index: Any) -> dict[Any, Any]:
        return {message: benchmark_stage(page.engine, run_id, stage_index)}

    queue.click(queue_clicked, [page.run_pick, stage], message)
    return tab
