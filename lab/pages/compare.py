"""The Compare tab: an experiment's arms side by side (docs/experiments.md). What the study shows in one sentence
(`finding`: the primary metric at the last stage), the curves over stages (per arm the mean over seeds, its 95% t
interval as a band and one dot per seed), each arm minus the baseline at the last stage, Holm-adjusted, for the
primary metric and then the other rate, every pair of arms' difference at the last stage paired by seed (t
interval, sd, what this many seeds detect, every seed's), the last stage per map size (arms x sizes, mean and
interval; then per agent count where the validation boards have several), what every arm was given (equal compute)
and what it spent (GRPO steps and rollouts, probe answers, validation and dev answers, its jobs' wall time, its
answers per run against the cheapest arm's), where its report is, and a link to every run (`?run=ID`).

Every number comes from one `lab.study.comparison.Comparison`, the one `envlab experiment report` prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr
from sqlalchemy import Engine

from lab.pages.common import VIEW, Page, table
from lab.pages.figures import empty_figure
from lab.runs import LabVersion, lab_version
from lab.study.comparison import (
    Comparison,
    Rate,
    agents_rows,
    comparison,
    compute_rows,
    compute_statement,
    curves_figure,
    difference_table_rows,
    finding,
    holm_header,
    holm_rows,
    size_rows,
)
from lab.study.example import import_line
from lab.study.experiments import experiment_choices, experiment_progress, log_dir, time_left
from lab.study.slurm import SLURM_HEADERS, slurm_rows
from lab.text import as_text


def compare_view(engine: Engine, experiment_id: int | None, rate: str | None = None) -> dict[str, Any]:
    """What the tab shows of an experiment: summary (the finding first), figure, the comparisons with the baseline
    (`primary`, `secondary`: a table and its label each, the primary metric's first), the paired differences, the
    per-size table, what every arm spent (`compute`) and the run links. `rate` (default the primary metric) is the
    figure's, the pairs' and the sizes'; `rate` in the answer is the one shown."""
    if experiment_id is None:
        return dict(rate=Rate.VALID, figure=empty_figure("no experiment in this lab yet"), summary=EMPTY,
                    primary=table(["difference"], []), primary_label=BASELINE_LABEL,
                    secondary=table(["difference"], []), secondary_label=BASELINE_LABEL,
                    differences=table(["difference"], []), sizes=table(["map size"], []), sizes_label=SIZES_LABEL,
                    compute=table(["arm"], []), links="")
    compared = comparison(engine, int(experiment_id))
    rate = Rate(rate) if rate else compared.rates[0]
    (primary, primary_label), (secondary, secondary_label) = (baseline_table(compared, r) for r in compared.rates)
    return dict(rate=rate, figure=curves_figure(compared, (rate,)), summary=_summary(engine, compared),
                primary=primary, primary_label=primary_label, secondary=secondary, secondary_label=secondary_label,
                differences=table(*difference_table_rows(compared, rate)), **sizes_table(compared, rate),
                compute=table(*compute_rows(compared)), links=run_links(compared) + slurm_jobs(engine, compared))


BASELINE_LABEL = "Last stage: each arm minus the baseline, paired by seed (points), Holm-adjusted"
SIZES_LABEL = "Last stage by map size: mean over seeds [95% interval], one column per arm"


def sizes_table(compared: Comparison, rate: Rate) -> dict[str, Any]:
    """The last stage per map size (`by_size`), then, where the validation boards have several agent counts, per
    count (`N agents`, each over every size): the table (`sizes`) and its label (`sizes_label`)."""
    headers, rows = by_size(*size_rows(compared, rate))
    if len(compared.agents) < 2:
        return dict(sizes=table(headers, rows), sizes_label=SIZES_LABEL)
    return dict(sizes=table(headers, rows + by_size(*agents_rows(compared, rate))[1]),
                sizes_label="Last stage by map size, then by agent count (each over every size): mean over seeds "
                            "[95% interval], one column per arm")


def baseline_table(compared: Comparison, rate: Rate) -> tuple[dict[str, Any], str]:
    """The last stage's comparisons with the baseline for `rate`: the table and its label, which names the rate,
    whether it is the primary metric, and the Holm family."""
    k = compared.stages
    primary = " (the primary metric)" if rate == compared.rates[0] else ""
    return table(*holm_rows(compared, rate, [k])), (
        f"{rate.capitalize()} rate{primary}, stage {k}: each arm minus {compared.baseline}, paired by seed (points); "
        f"{holm_header(compared, rate, [k], name=str)}. ★: the interval excludes zero")


EMPTY = ("No experiment in this lab yet: `envlab experiment new --name N --arms fixed,random,heuristic --seeds 3 "
         "--stages 3` makes one (docs/experiments.md). The lab's study (docs/results/README.md) is a database "
         "of its own: `gunzip -k docs/results/second-pass/study.db.gz && envlab serve --db "
         "docs/results/second-pass/study.db` opens it here.")


def by_size(headers: list[str], rows: list[list[str]]) -> tuple[list[str], list[list[str]]]:
    """`size_rows` turned a quarter: one row per map size (and "all"), one column per arm, so every size of the
    run's set is in view however many there are."""
    arms = [row[0] for row in rows]
    return ["map size", *arms], [[size, *(row[i] for row in rows)] for i, size in enumerate(headers[1:], start=1)]


def _summary(engine: Engine, compared: Comparison) -> str:
    """The run count, what the study shows (`finding`), where its report is, then what the tab shows."""
    done = sum(r.status == "done" for r in compared.runs.values())
    base, k = as_text(compared.baseline), compared.stages
    left = "" if compared.ended else time_left(engine, experiment_progress(engine, compared.experiment.id))
    return (f"**{as_text(compared.experiment.name)}**: {done} of {len(compared.runs)} runs done"
            f"{compared.progress_text()}{f'; {left}' if left else ''}.\n\n"
            f"{finding(compared)}\n\n{report_file(engine, compared)}\n\n{compute_statement(compared)} Each "
            "point: the mean over seeds, with its 95% Student-t interval over seeds as a band and every seed as a "
            f"dot. Below it, stage {k}: each arm minus {base} paired by seed, the {compared.rates[0]} rate (the "
            f"primary metric) first, {holm_header(compared, compared.rates[0], [k])}: the interval at the "
            "level of its Holm step (★ where it excludes zero), the raw p and the Holm p; then every pair of arms' "
            "difference paired by seed, with its own 95% t interval (n - 1 degrees of freedom) and the smallest "
            "difference this many seeds detect with 80% power. Differences are in points. Last, what every arm "
            f"spent{'' if compared.ended else ' so far'}, summed over its runs (the mean per run): GRPO steps and "
            "rollouts, probe answers, validation and dev answers, its jobs' wall time, and its answers per run "
            "against the cheapest arm's.")


def report_file(engine: Engine, compared: Comparison) -> str:
    """Where `envlab experiment report` wrote the experiment's report by default, or that it has not yet."""
    folder = log_dir(engine, compared.experiment) / "report"
    command = f"`envlab experiment report {compared.experiment.id}`"
    if (folder / "report.md").is_file():
        return (f"Report: {as_text(str(folder / 'report.md'))} (with runs.csv, summary.csv, differences.csv and "
                f"curves.png beside it), written by {command}, which prints every number, every stage, and the area "
                "under each curve.")
    return (f"No report written yet: {command} prints every number, every stage, and the area under each curve, "
            f"and writes report.md, the CSV files and curves.png to {as_text(str(folder))}.")


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
    primary: gr.Dataframe
    secondary: gr.Dataframe
    differences: gr.Dataframe
    sizes: gr.Dataframe
    compute: gr.Dataframe
    links: gr.Markdown
    drawn_at: gr.State  # (the runs, the stages) of the `LabVersion` and the import line, as the tab was last drawn

    @property
    def outputs(self) -> list[Any]:
        return [self.pick, self.rate, self.summary, self.figure, self.primary, self.secondary, self.differences,
                self.sizes, self.compute, self.links, self.drawn_at]

    def stale(self, drawn_at: tuple | None, now: LabVersion) -> bool:
        """Whether a run, a stage or the shipped study's import changed since the tab was drawn (the page's poll
        redraws it)."""
        return drawn_at is not None and tuple(drawn_at) != (now.runs, now.stages, import_line(self.engine))

    def show(self, experiment_id: int | None, rate: str | None = None) -> dict[Any, Any]:
        """The experiment drawn for `rate` (None: its primary metric, which the Rate radio then shows)."""
        at = lab_version(self.engine)  # read first: a stage that ends while this draws is redrawn by the next poll
        importing = import_line(self.engine)
        v = compare_view(self.engine, experiment_id, rate)
        return {self.drawn_at: (at.runs, at.stages, importing), self.rate: v["rate"].value,
                self.summary: f"{importing}\n\n{v['summary']}" if importing else v["summary"],
                self.figure: v["figure"],
                self.primary: gr.update(value=v["primary"], label=v["primary_label"]),
                self.secondary: gr.update(value=v["secondary"], label=v["secondary_label"]),
                self.differences: v["differences"], self.sizes: gr.update(value=v["sizes"], label=v["sizes_label"]),
                self.compute: v["compute"],
                self.links: v["links"]}

    def refresh(self, experiment_id: int | None = None, rate: str | None = None) -> dict[Any, Any]:
        """The experiments as they are now, the chosen one (else the newest) drawn; for the rate shown while it
        stays the one drawn, else for the newly drawn one's primary metric."""
        choices = experiment_choices(self.engine)
        ids = [i for _, i in choices]
        chosen = experiment_id if experiment_id in ids else (ids[0] if ids else None)
        return {self.pick: gr.update(choices=choices, value=chosen)} | self.show(
            chosen, rate if chosen == experiment_id else None)


def build(page: Page) -> CompareTab:
    with gr.Row():
        pick = gr.Dropdown(label="Experiment", choices=[], value=None, scale=3, elem_id="compare-pick")
        rate = gr.Radio([r.value for r in Rate], value=Rate.VALID.value, label="Rate", scale=1, elem_id="compare-rate")
        refresh = gr.Button("↻ Refresh", scale=0, min_width=100, elem_id="compare-refresh")
    summary = gr.Markdown(elem_id="compare-summary")
    figure = gr.Plot(elem_id="compare-curves", show_label=False)
    primary = gr.Dataframe(label=BASELINE_LABEL, interactive=False, elem_id="compare-primary", wrap=True)
    secondary = gr.Dataframe(label=BASELINE_LABEL, interactive=False, elem_id="compare-secondary", wrap=True)
    differences = gr.Dataframe(label="Last stage: every pair of arms, paired by seed (the rate chosen above, points; "
                                     "each pair's own 95% interval, not adjusted for the number of pairs)",
                               interactive=False, elem_id="compare-differences", wrap=True)
    sizes = gr.Dataframe(label=SIZES_LABEL, interactive=False, elem_id="compare-sizes", wrap=True)
    compute = gr.Dataframe(label="Compute per arm: each cell the sum over the arm's runs (the mean per run)",
                           interactive=False, elem_id="compare-compute", wrap=True)
    links = gr.Markdown(elem_id="compare-runs")
    tab = CompareTab(page.engine, pick, rate, summary, figure, primary, secondary, differences, sizes, compute, links,
                     gr.State(None))
    # In the queue the poll answers in (`VIEW`): the poll redraws the experiment picked as its stages end, and an
    # answer it computed for the experiment picked before lands before the new pick's, not after it.
    # a new pick: its primary metric
    pick.select(tab.show, [pick], tab.outputs[1:], trigger_mode="always_last", **VIEW)
    rate.input(tab.show, [pick, rate], tab.outputs[1:], trigger_mode="always_last", **VIEW)
    refresh.click(tab.refresh, [pick, rate], tab.outputs, **VIEW)
    return tab
