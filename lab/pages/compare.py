"""The Compare tab: an experiment's arms side by side (docs/experiments.md). The curves over stages (per arm the mean
over seeds, its 95% t interval as a band and one dot per seed), every pair of arms' difference at the last stage
paired by seed (t interval, sd, what this many seeds detect, every seed's), the last stage per map size (arms x
sizes, mean and interval), what every arm was given (equal compute), and a link to every run (`?run=ID`).

Every number comes from one `lab.study.comparison.Comparison`, the one `envlab experiment report` prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr
from sqlalchemy import Engine

from lab.pages.common import Page, table
from lab.pages.figures import empty_figure
from lab.study.comparison import (
    Comparison,
    Rate,
    comparison,
    compute_statement,
    curves_figure,
    difference_table_rows,
    size_rows,
)
from lab.study.experiments import experiment_choices
from lab.study.slurm import SLURM_HEADERS, slurm_rows
from lab.text import as_text


def compare_view(engine: Engine, experiment_id: int | None, rate: str = Rate.VALID) -> dict[str, Any]:
    """What the tab shows of an experiment: figure, summary, the paired differences, the per-size table and the
    run links."""
    if experiment_id is None:
        return dict(figure=empty_figure("no experiment in this lab yet"), summary=EMPTY,
                    differences=table(["difference"], []), sizes=table(["map size"], []), links="")
    compared = comparison(engine, int(experiment_id))
    rate = Rate(rate or Rate.VALID)
    headers, rows = size_rows(compared, rate)
    return dict(figure=curves_figure(compared, (rate,)), summary=_summary(compared),
                differences=table(*difference_table_rows(compared, rate)), sizes=table(*by_size(headers, rows)),
                links=run_links(compared) + slurm_jobs(engine, compared))


EMPTY = ("No experiment in this lab yet: `envlab experiment new --name N --arms fixed,random,heuristic --seeds 3 "
         "--stages 3` makes one (docs/experiments.md). The shipped study (docs/results/README.md) is a database "
         "of its own: `gunzip -k docs/results/study-6seed/study.db.gz && envlab serve --db "
         "docs/results/study-6seed/study.db` opens it here.")


def by_size(headers: list[str], rows: list[list[str]]) -> tuple[list[str], list[list[str]]]:
    """`size_rows` turned a quarter: one row per map size (and "all"), one column per arm, so every size of the
    run's set is in view however many there are."""
    arms = [row[0] for row in rows]
    return ["map size", *arms], [[size, *(row[i] for row in rows)] for i, size in enumerate(headers[1:], start=1)]


def _summary(compared: Comparison) -> str:
    done = sum(r.status == "done" for r in compared.runs.values())
    return (f"**{as_text(compared.experiment.name)}**: {done} of {len(compared.runs)} runs done. "
            f"{compute_statement(compared)} Each "
            "point: the mean over seeds, with its 95% Student-t interval over seeds as a band and every seed as a "
            f"dot. Below it, stage {compared.stages}: every pair of arms' difference paired by seed, with its t "
            "interval (n - 1 degrees of freedom) and the smallest difference this many seeds detect with 80% power; "
            f"`envlab experiment report {compared.experiment.id}` prints every number, every stage, and the area under "
            "each curve.")


def run_links(compared: Comparison) -> str:
    """One link per run (`?run=ID` opens it in the lab), arm by arm."""
    lines = []
    for arm in compared.arms:
        links = [f"[seed {seed}](?run={run.id}) ({run.status})" for seed in compared.seeds
                 if (run := compared.runs.get((arm, seed))) is not None]
        lines.append(f"- **{as_text(arm)}**: " + ", ".join(links))
    return "Runs:\n\n" + "\n".join(lines)


def slurm_jobs(engine: Engine, compared: Comparison) -> str:
    """For each stage that ran on Slurm: the array task, its node, its state and its log ("" when none did)."""
    rows = [r for r in slurm_rows(engine, [run.id for run in compared.runs.values()]) if r[6]]
    if not rows:
        return ""
    lines = ["", "", "Slurm jobs, stage by stage:", "", "| " + " | ".join(SLURM_HEADERS) + " |",
             "|" + "---|" * len(SLURM_HEADERS)]
    lines += ["| " + " | ".join(as_text(str(v)) for v in row) + " |" for row in rows]
    return "\n".join(lines)


@dataclass(eq=False)
class CompareTab:
    engine: Engine
    pick: gr.Dropdown
    rate: gr.Radio
    summary: gr.Markdown
    figure: gr.Plot
    differences: gr.Dataframe
    sizes: gr.Dataframe
    links: gr.Markdown

    @property
    def outputs(self) -> list[Any]:
        return [self.pick, self.summary, self.figure, self.differences, self.sizes, self.links]

    def show(self, experiment_id: int | None, rate: str | None = None) -> dict[Any, Any]:
        v = compare_view(self.engine, experiment_id, rate or Rate.VALID)
        return {self.summary: v["summary"], self.figure: v["figure"], self.differences: v["differences"],
                self.sizes: v["sizes"], self.links: v["links"]}

    def refresh(self, experiment_id: int | None = None, rate: str | None = None) -> dict[Any, Any]:
        """The experiments as they are now, the chosen one (else the newest) drawn."""
        choices = experiment_choices(self.engine)
        ids = [i for _, i in choices]
        chosen = experiment_id if experiment_id in ids else (ids[0] if ids else None)
        return {self.pick: gr.update(choices=choices, value=chosen)} | self.show(chosen, rate)


def build(page: Page) -> CompareTab:
    with gr.Row():
        pick = gr.Dropdown(label="Experiment", choices=[], value=None, scale=3, elem_id="compare-pick")
        rate = gr.Radio([r.value for r in Rate], value=Rate.VALID.value, label="Rate", scale=1, elem_id="compare-rate")
        refresh = gr.Button("↻ Refresh", scale=0, min_width=100, elem_id="compare-refresh")
    summary = gr.Markdown(elem_id="compare-summary")
    figure = gr.Plot(elem_id="compare-curves", show_label=False)
    differences = gr.Dataframe(label="Last stage: every pair of arms, paired by seed (valid or optimal rate, points)",
                               interactive=False, elem_id="compare-differences", wrap=True)
    sizes = gr.Dataframe(label="Last stage by map size: mean over seeds [95% interval], one column per arm",
                         interactive=False, elem_id="compare-sizes", wrap=True)
    links = gr.Markdown(elem_id="compare-runs")
    tab = CompareTab(page.engine, pick, rate, summary, figure, differences, sizes, links)
    pick.select(tab.show, [pick, rate], tab.outputs[1:], trigger_mode="always_last")
    rate.input(tab.show, [pick, rate], tab.outputs[1:], trigger_mode="always_last")
    refresh.click(tab.refresh, [pick, rate], tab.outputs)
    return tab
