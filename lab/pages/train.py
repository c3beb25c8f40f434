"""The Train tab: the worker's progress on the open run, its jobs and log, and the buttons that move the run
(queue what comes next, resume, cancel, switch the engineer). The page never trains: it queues jobs."""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from typing import Any

import gradio as gr
from sqlalchemy import Engine

from lab.engineers import ENGINEERS
from lab.jobs.worker import ago
from lab.loop import LoopError, advance, cancel, resume, switch_engineer
from lab.pages import figures
from lab.pages.common import BAD_ROW, Page, cannot_draw, table
from lab.results import StageSummary
from lab.runs import RunProgress, run_progress
from lab.study.slurm import SlurmJob, cancel_slurm_of
from lab.text import as_text
from storage.models import ACTIVE_JOB, Job, JobKind, JobStatus, RunStatus, Stage, StageStatus
from training import trackers

CANCEL, CONFIRM = "Cancel this run", "Confirm cancel"  # the cancel button, before and after its first click
JOB_HEADERS = ["job", "kind", "for", "status", "progress", "heartbeat", "error", "slurm job"]


def train_view(engine: Engine, run_id: int | None) -> dict[str, Any]:
    """The run's jobs as the worker last wrote them: progress of the active one, its log tail, results."""
    try:
        progress = None if run_id is None else run_progress(engine, run_id)
        if progress is None:
            return dict(status="No run is open.", progress="", jobs=table(JOB_HEADERS, []), log="", results="",
                        training=figures.empty_figure("no run is open"), run_status=None)
        return _train_view(progress) | {"run_status": progress.run.status}
    except BAD_ROW as err:
        return dict(status=cannot_draw("The Train tab", run_id, err), progress="", jobs=table(JOB_HEADERS, []),
                    log="", results="", training=figures.empty_figure("cannot draw this run's training"),
                    run_status=None)


# Which button is the one to press, by the run's stored status (`primary`), and which can do nothing (disabled):
# after a restart, a failed or cancelled run is resumed, not moved along; a run that waits is decided on the
# Proposal tab; a done run has nothing left.
BUTTONS: dict[RunStatus | None, tuple[str | None, frozenset[str]]] = {
    RunStatus.ACTIVE: ("queue", frozenset({"resume"})),
    RunStatus.WAITING: (None, frozenset({"queue", "resume"})),
    RunStatus.FAILED: ("resume", frozenset({"queue"})),
    RunStatus.CANCELLED: ("resume", frozenset({"queue"})),
    RunStatus.DONE: (None, frozenset({"queue", "resume", "cancel"})),
    None: (None, frozenset({"queue", "resume", "cancel"})),
}


def button_states(status: RunStatus | None) -> dict[str, dict[str, Any]]:
    """Each run button's variant and whether it can be pressed, for a run in `status` (None: no run open)."""
    primary, disabled = BUTTONS[status]
    return {name: {"variant": "stop" if name == "cancel" else "primary" if name == primary else "secondary",
                   "interactive": name not in disabled} for name in ("queue", "resume", "cancel")}


def _train_view(progress: RunProgress) -> dict[str, Any]:
    jobs = progress.jobs
    rows = [[j.id, j.kind, _job_target(j), j.status, f"{j.step}/{j.total}" if j.total else str(j.step),
             ago(j.heartbeat_at) if j.heartbeat_at and j.status == JobStatus.RUNNING else "", j.error or "",
             _slurm_cell(j)] for j in reversed(jobs)]
    shown = next((j for j in jobs if j.status in ACTIVE_JOB), None) or (jobs[-1] if jobs else None)
    log, trace = fold_traceback(shown.log_tail if shown else "")
    return dict(status=_run_status(progress), progress=_progress_bar(shown, trace), jobs=table(JOB_HEADERS, rows),
                log=log, results=_results(progress.latest), training=_training(progress))


def _training(progress: RunProgress) -> Any:
    """The curves of the last stage that trained (the one training now, step by step), titled with its index."""
    if progress.training is None:
        return figures.empty_figure("no stage has trained yet (stage 0 is evaluated, not trained)")
    index, logs = progress.training
    fig = figures.training_figure(logs)
    fig.update_layout(title=dict(text=f"stage {index}" + (f"; {fig.layout.title.text}" if fig.layout.title.text
                                                          else ""), x=0.01, xanchor="left"))
    return fig


TRACEBACK_STARTS = ("Traceback (most recent call last):", '  File "')


def fold_traceback(log: str) -> tuple[str, str]:
    """A job's log without the traceback its failure appended (from its first `Traceback` or `File` line on),
    and that traceback: the page says a failure in one line and folds the traceback away."""
    lines = log.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(TRACEBACK_STARTS)), None)
    if start is None:
        return log, ""
    kept = lines[:start] + ["(the traceback is folded under the job's error above)"]
    return "\n".join(kept), "\n".join(lines[start:])


def job_phase(job: Job) -> str:
    """What the job is doing now, in its own words: its last log line (a stage counts the boards it makes, then
    its training steps; the bar's steps restart with each phase, so the phase is said beside them)."""
    lines = [line for line in (job.log_tail or "").splitlines() if line.strip()]
    return lines[-1].strip()[:120] if lines else ""


def _progress_bar(job: Job | None, trace: str = "") -> str:
    if job is None:
        return "<p>No jobs for this run yet.</p>"
    total = job.total or 0
    label = f"{job.kind} job {job.id} ({_job_target(job)}): {job.status}"
    label += f", step {job.step} of {total}" if total else ""
    phase = job_phase(job)
    label += f" ({phase})" if phase and job.status == JobStatus.RUNNING else ""
    share = 1.0 if job.status == JobStatus.DONE else (job.step / total if total else 0.0)
    error = f'<div class="error">{html.escape(job.error)}</div>' if job.error else ""
    if trace:
        error += f'<details class="traceback"><summary>Traceback</summary><pre>{html.escape(trace)}</pre></details>'
    return (f'<div class="lab-progress {job.status}"><div>{html.escape(label)}</div>'
            f'<div class="bar" id="job-progress" data-step="{job.step}" data-total="{total}" '
            f'data-status="{job.status}"><span style="width: {share:.0%}"></span></div>{error}</div>')


def _run_status(progress: RunProgress) -> str:
    """The run in one Markdown paragraph; its name and its status reason (which quotes names and errors) as text."""
    run, stages = progress.run, progress.stages
    trained = sum(stage.status == StageStatus.DONE for stage in stages[1:])
    reason = as_text(run.status_reason)
    waiting = {RunStatus.WAITING: " **A proposal waits for your decision in the Proposal tab.**",
               RunStatus.FAILED: f" **{reason}**. Fix the cause, then *Resume* (retry), or switch "
                                 "the engineer below.",
               RunStatus.CANCELLED: f" {reason}. *Resume* picks it up again."}.get(run.status, "")
    return (f"Run #{run.id} **{as_text(run.name)}** is **{run.status}**: {trained} of {run.settings.stages} "
            f"training stages done; stages: "
            + ", ".join(f"{stage.index} {stage_word(stage, progress.jobs)}" for stage in stages) + "."
            + _shared(progress) + waiting + _trackio(progress))


def stage_word(stage: Stage, jobs: list[Job]) -> str:
    """A stage's status as the page says it: a stage whose last job a person cancelled is stored as queued or failed
    (the stage table knows no cancel) but shown as cancelled, until *Resume* queues it again."""
    last = next((j for j in reversed(jobs) if j.kind == JobKind.STAGE and j.target == stage.index), None)
    if stage.status != StageStatus.DONE and last is not None and last.status == JobStatus.CANCELLED:
        return JobStatus.CANCELLED
    return stage.status


def _trackio(progress: RunProgress) -> str:
    """Where the run's curves are in Trackio, when it reports to Trackio: one tracker run for all its stages."""
    if progress.trackio is None:
        return ""
    return f"\n\nCurves in Trackio, run *{as_text(trackers.run_name(progress.run))}*: `{progress.trackio}`"


def _shared(progress: RunProgress) -> str:
    """Which evaluations of the run were copied from another run's equal one, and from which (stage 0 of runs
    that start from one checkpoint is evaluated once)."""
    by_source: dict[tuple[int, int | None, int | None], list[str]] = {}
    for e in progress.shared:
        by_source.setdefault((e.stage_index, e.source_run_id, e.source_stage_index), []).append(str(e.split))
    return "".join(f" Stage {stage}'s {' and '.join(splits)} episodes were reused from run #{run}'s stage {source} "
                   "(the same policy, boards and decoding: evaluated once, not generated again)."
                   for (stage, run, source), splits in by_source.items())


def _results(summary: StageSummary | None) -> str:
    """The last evaluated stage's validation results per map size."""
    if summary is None:
        return ""
    lines = [f"**Stage {summary.stage_index} results** (validation):", "", "| size | valid | optimal | episodes |",
             "|---|---|---|---|"]
    lines += [f"| {size}x{size} | {t.valid_rate:.0%} | {t.optimal_rate:.0%} | {t.episodes} |"
              for size, t in summary.by_size.items() if t.episodes]
    return "\n".join(lines)


def _slurm_cell(job: Job) -> str:
    """The Slurm array task that ran the job, its node, state and log ("" for a job no Slurm job ran)."""
    slurm = SlurmJob.of(job)
    return "" if slurm is None else f"{slurm.key} on {slurm.node} ({slurm.state}); log {slurm.log}"


def _job_target(job: Job) -> str:
    if job.target is None:
        return json.dumps(job.payload)
    return f"proposal after stage {job.target}" if job.kind == JobKind.PROPOSE else f"stage {job.target}"


def advance_run(engine: Engine, run_id: int | None) -> str:
    if run_id is None:
        return "No run is open."
    try:
        return f"Run #{run_id}: {advance(engine, run_id).text}."
    except LoopError as err:
        return f"✗ {err}"


def resume_run(engine: Engine, run_id: int | None) -> str:
    if run_id is None:
        return "No run is open."
    requeued = resume(engine, run_id)
    if not requeued:
        return f"Run #{run_id}: nothing had failed; now {advance(engine, run_id).text}."
    return f"Run #{run_id}: queued job(s) {', '.join(map(str, requeued))} again (a stage resumes from its checkpoint)."


def cancel_run_jobs(engine: Engine, run_id: int | None) -> str:
    if run_id is None:
        return "No run is open."
    active = cancel(engine, run_id)
    if not active:
        return f"Run #{run_id} is cancelled; no job of it was queued or running. *Resume* picks it up again."
    slurm = cancel_slurm_of(engine, active)
    return f"Run #{run_id} is cancelled. Cancel requested for job(s) " + ", ".join(map(str, active)) + \
        ": a queued job stops at once, a running one when its worker next reports. " + \
        (f"Slurm job(s) {', '.join(slurm)} cancelled (scancel). " if slurm else "") + \
        "*Resume* picks the run up again."


def switch_run_engineer(engine: Engine, run_id: int | None, engineer: str, backend: str) -> str:
    if run_id is None:
        return "No run is open."
    try:
        requeued = switch_engineer(engine, run_id, engineer, (backend or "").strip())
    except LoopError as err:
        return f"✗ {err}"
    return f"Run #{run_id} now asks the `{engineer}` engineer; resumed ({len(requeued)} job(s) queued again). " \
        f"Now: {advance(engine, run_id).text}."


@dataclass(eq=False)
class TrainTab:
    engine: Engine
    status: gr.Markdown
    message: gr.Markdown
    progress: gr.HTML
    results: gr.Markdown
    log: gr.Textbox
    jobs: gr.Dataframe
    training: gr.Plot
    buttons: dict[str, gr.Button]
    armed: gr.State  # the run whose cancel was clicked once and waits for its confirmation (None: none)

    @property
    def outputs(self) -> list[Any]:
        return [self.status, self.progress, self.jobs, self.log, self.results, self.training, *self.buttons.values()]

    def show(self, run_id: int | None) -> dict[Any, Any]:
        t = train_view(self.engine, run_id)
        return {self.status: t["status"], self.progress: t["progress"], self.jobs: t["jobs"], self.log: t["log"],
                self.results: t["results"], self.training: t["training"]} | {
            self.buttons[name]: gr.update(**state) for name, state in button_states(t["run_status"]).items()}

    def cancel(self, run_id: int | None, armed: int | None) -> dict[Any, Any]:
        """Cancel in two clicks: the first asks (the button turns into *Confirm cancel*), the second on the same run
        cancels it."""
        if run_id is None or armed != run_id:
            return {self.message: "No run is open." if run_id is None else
                    f"Cancel run #{run_id}? Its queued and running jobs stop. Click *Confirm cancel* to stop it.",
                    self.buttons["cancel"]: gr.update(value=CONFIRM if run_id is not None else CANCEL),
                    self.armed: run_id}
        return {self.message: cancel_run_jobs(self.engine, run_id), self.buttons["cancel"]: gr.update(value=CANCEL),
                self.armed: None}

    def says(self, action: Any):
        """A button's callback: `action(engine, run_id, *more)`'s message in the tab's message line."""
        def run(run_id: int | None, *more: Any) -> dict[Any, Any]:
            return {self.message: action(self.engine, run_id, *more)}
        return run


def build(page: Page) -> TrainTab:
    status = gr.Markdown(elem_id="train-status")
    with gr.Row():
        queue_next = gr.Button("Queue what comes next", variant="primary", elem_id="queue-next")
        resume_button = gr.Button("Resume (retry what failed)", elem_id="resume")
        cancel_button = gr.Button(CANCEL, variant="stop", elem_id="cancel")
    with gr.Row():
        switch_to = gr.Dropdown(list(ENGINEERS), value="heuristic", label="Switch the engineer to",
                                elem_id="switch-engineer", scale=1)
        switch_backend = gr.Textbox(label="Backend (llm only)", placeholder="hf:policy", scale=1)
        switch_button = gr.Button("Switch engineer and resume", elem_id="switch", scale=1)
    gr.Markdown("_Queue what comes next_ moves the run one step along the loop: it queues the next "
                "stage or asks the engineer for a proposal (nothing, while a proposal waits for you). "
                "The worker runs what is queued; this page never trains.")
    message = gr.Markdown(elem_id="train-msg")
    progress = gr.HTML(elem_id="progress")
    results = gr.Markdown(elem_id="stage-results")
    log = gr.Textbox(label="Log of the job above (last lines)", lines=10, interactive=False, elem_id="log-tail",
                     autoscroll=True, placeholder="(no log lines yet)")
    training = gr.Plot(label="Training curves of the last stage trained", elem_id="train-curves")
    jobs = gr.Dataframe(label="Jobs of this run (newest first)", interactive=False)
    tab = TrainTab(page.engine, status, message, progress, results, log, jobs, training,
                   {"queue": queue_next, "resume": resume_button, "cancel": cancel_button}, gr.State(None))
    for button, action, inputs in ((queue_next, advance_run, []), (resume_button, resume_run, []),
                                   (switch_button, switch_run_engineer, [switch_to, switch_backend])):
        button.click(tab.says(action), [page.run_pick, *inputs], message).then(tab.show, page.run_pick, tab.outputs)
    cancel_button.click(tab.cancel, [page.run_pick, tab.armed], [message, cancel_button, tab.armed]) \
        .then(tab.show, page.run_pick, tab.outputs)
    return tab
