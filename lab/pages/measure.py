"""The Measure panel of the Proposal tab: the config in force, the proposed one and the person's edit probed on
the run's latest checkpoint, side by side per map size (`lab.measurements`).

The measurement runs as a `probe` job on the worker; the panel polls the job's row with a timer of its own (a
progress bar meanwhile) and the rest of the page stays usable. The keys of the probes shown are kept in `seen`,
which the decision stores, and the proposal the panel speaks of in `owner`. Where the checkpoint is absent, one
line says so and a button measures the stage-0 policy instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr
from sqlalchemy import Engine

from lab.measurements import measure_view, queue_measure
from lab.pages.common import Page, config_from_table, no_progress, table

POLL_S = 1.0


def progress_html(done: float) -> str:
    return f'<progress value="{done:.3f}" max="1" style="width:100%"></progress>'


@dataclass(eq=False)
class MeasurePanel:
    """The panel's widgets. `seen` holds the keys of the probes shown for the open proposal (for the decision);
    `owner` is the proposal the panel's content is for."""

    engine: Engine
    button: gr.Button
    stage0: gr.Button
    status: gr.Markdown
    bar: gr.HTML
    table: gr.Dataframe
    job: gr.State
    seen: gr.State
    owner: gr.State
    timer: gr.Timer

    def start(self, proposal_id, rows, agents, instances, stage0: bool = False):
        edited = config_from_table(rows or [], agents, instances) if rows else None
        job_id, message = queue_measure(self.engine, proposal_id, edited, stage0=stage0)
        absent = job_id is None and message.endswith("instead?")
        return {self.owner: proposal_id, self.job: job_id, self.status: message, self.stage0: gr.update(visible=absent),
                self.timer: gr.Timer(active=job_id is not None),
                self.bar: progress_html(0.0) if job_id is not None else ""}  # a bar only while something measures

    def poll(self, job_id):
        v = measure_view(self.engine, job_id)
        out = {self.bar: progress_html(v.done) if v.running or v.rows else "", self.timer: gr.Timer(active=v.running)}
        if v.running:
            return out | {self.status: v.status}
        return out | {self.status: v.status, self.seen: v.keys,
                      self.table: gr.update(value=table(v.headers, v.rows), visible=bool(v.rows))}

    def clear(self, drawn, owner):
        """Another proposal is open: nothing measured for it has been seen yet. The browser can send one change of
        the proposal drawn more than once (two or three per page load were seen, one after a measurement had
        started): a change to the proposal the panel already speaks of changes nothing."""
        if drawn == owner:
            return {self.owner: owner}
        return {self.owner: drawn, self.job: None, self.seen: None, self.status: "", self.bar: "",
                self.table: gr.update(value=table([], []), visible=False),
                self.stage0: gr.update(visible=False), self.timer: gr.Timer(active=False)}


def build(page: Page, drawn: gr.State, edit: gr.Dataframe, agents: gr.Dataframe,
          instances: gr.Number) -> MeasurePanel:
    """The panel, wired to the tab's proposal drawn (`drawn`) and edit table."""
    with gr.Accordion("Measure on the policy", open=False):
        gr.Markdown("Probe the config in force, the proposed one and your edit on the run's latest checkpoint: "
                    "per size, the share of valid answers p and the learnability (the mean over boards of "
                    "p_b(1-p_b), what GRPO can learn from). It runs on the worker; the page stays usable.")
        with gr.Row():
            button = gr.Button("Measure", elem_id="measure")
            stage0 = gr.Button("Measure the stage-0 policy instead", visible=False, elem_id="measure-stage0")
        status = gr.Markdown(elem_id="measure-status")
        bar = gr.HTML()
        shown = gr.Dataframe(interactive=False, wrap=True, elem_id="measure-table", visible=False)
    panel = MeasurePanel(page.engine, button, stage0, status, bar, shown, gr.State(None), gr.State(None),
                         gr.State(None), gr.Timer(POLL_S, active=False))
    started = [panel.owner, panel.job, panel.status, panel.stage0, panel.timer, panel.bar]
    button.click(panel.start, [drawn, edit, agents, instances], started)
    stage0.click(lambda p, r, a, i: panel.start(p, r, a, i, stage0=True), [drawn, edit, agents, instances], started)
    panel.timer.tick(panel.poll, panel.job, [panel.bar, panel.timer, panel.status, panel.table, panel.seen],
                     **no_progress(page))  # no timer text flashing in the status line
    drawn.change(panel.clear, [drawn, panel.owner], [panel.owner, panel.job, panel.seen, panel.status, panel.bar,
                                                    panel.table, panel.stage0, panel.timer])
    return panel
