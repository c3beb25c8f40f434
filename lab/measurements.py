"""Measurements for a proposal: the config in force, the proposed one and the person's edit, each probed on the
run's latest checkpoint (`training.probe`), side by side per map size, before anyone decides (the Measure panel,
`lab.pages.measure`).

Measuring samples thousands of answers, so it runs as a `probe` job on the worker (`queue_measure`); the panel
reads the job's row (`measure_view`). A checkpoint that is not on this machine (the shipped example run has none)
is said in one line, and the stage-0 policy can be measured instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from sqlmodel import select

from envsim.config import ConfigError, EnvConfig
from lab.loop import needs_gpu
from lab.proposals import project_edit
from storage.db import checkpoint_of, session, stage_at
from storage.models import ACTIVE_JOB, Job, JobStatus, Priority, Probe, Proposal, Run
from storage.payloads import ProbePayload
from storage.queue import AlreadyQueued, enqueue
from training.probe import ProbeResult, probe_size, result_of

IN_FORCE, PROPOSED, EDIT = "in force", "proposed", "your edit"


@dataclass(frozen=True)
class MeasureView:
    """What the panel shows for a probe job: a status line, the share done, the table, the probe keys shown."""

    status: str
    done: float = 0.0
    headers: list[str] = field(default_factory=list)
    rows: list[list[Any]] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    running: bool = False


def measure_configs(engine: Engine, proposal_id: int, edited: dict[str, Any] | None = None) -> dict[str, EnvConfig]:
    """The configs to measure, by label: the one in force, the proposed one (when the proposal has one) and the
    person's edit (validated strictly against the config in force, as a decision is; when it differs from the
    proposal). Raises ConfigError naming the field of an invalid edit, LookupError for no such proposal."""
    with session(engine) as s:
        proposal = s.get(Proposal, proposal_id)
        if proposal is None:
            raise LookupError(f"no proposal {proposal_id}")
        stage = stage_at(s, proposal.run_id, proposal.after_stage)
    in_force = stage.config
    configs = {IN_FORCE: in_force}
    if proposal.projected_config is not None:
        configs[PROPOSED] = proposal.projected_config
    if edited is not None:  # as a decision projects it (an edit of the table keeps the random share)
        mine = project_edit(edited, in_force, configs.get(PROPOSED, in_force)).config
        if mine not in configs.values():
            configs[EDIT] = mine
    return configs


def checkpoint_of_proposal(engine: Engine, proposal_id: int, stage0: bool = False) -> tuple[str, str, str] | str:
    """(name as the stage row gives it, path to load, what it is) of the policy a proposal's configs are measured
    on: the run's latest checkpoint, the stage the proposal follows; with `stage0`, the run's starting policy.
    A string instead says why there is none here."""
    with session(engine) as s:
        proposal = s.get(Proposal, proposal_id)
        run = s.get(Run, proposal.run_id)
        index = 0 if stage0 else proposal.after_stage
        stage = stage_at(s, run.id, index)
    if index == 0:  # the run's policy as given: the folder stage 0's row records is the evaluating machine's
        return run.policy, run.policy, "the stage-0 policy"
    path = checkpoint_of(engine, stage)
    if path is None or not Path(path).is_dir():
        return (f"Stage {index}'s checkpoint is not on this machine ({path or 'none recorded'}), so its policy "
                "cannot be measured; measure the stage-0 policy instead?")
    return stage.checkpoint, path, f"stage {index}'s checkpoint"


def queue_measure(engine: Engine, proposal_id: int | None, edited: dict[str, Any] | None = None,
                  stage0: bool = False, temperature: float = 1.0) -> tuple[int | None, str]:
    """Queue a `probe` job for the proposal's configs; (job id, message), or (None, one line saying why not).
    Nothing is stored when the edit is invalid, the checkpoint is absent, or a measurement runs already."""
    if proposal_id is None:
        return None, "No proposal is open."
    try:
        configs = measure_configs(engine, int(proposal_id), edited)
    except (ConfigError, LookupError) as err:
        return None, f"✗ Not measured: {err}"
    found = checkpoint_of_proposal(engine, int(proposal_id), stage0)
    if isinstance(found, str):
        return None, found
    name, path, what = found
    with session(engine) as s:
        proposal = s.get(Proposal, int(proposal_id))
        run = s.get(Run, proposal.run_id)
        if run.settings.overrides.temperature is not None:
            temperature = run.settings.overrides.temperature
        size = probe_size(run.settings)
        payload = ProbePayload(run_id=run.id, proposal_id=proposal.id, checkpoint=name, policy_path=path,
                               configs=configs, seed=run.seed, **size, temperature=temperature)
        try:
            job = enqueue(s, payload.kind, payload.stored(), run_id=run.id, target=proposal.after_stage,
                          needs_gpu=needs_gpu(run), priority=Priority.INTERACTIVE)  # a person waits on it
        except AlreadyQueued as err:
            return err.job.id, f"A measurement of this run's stage is under way already (job {err.job.id})."
    return job.id, f"Measuring {', '.join(configs)} on {what} (job {job.id}): {size['boards']} boards per size, " \
                   f"{size['answers']} sampled answers each."


def side_by_side(results: dict[str, ProbeResult]) -> tuple[list[str], list[list[Any]]]:
    """Per size, each measured config's valid share p, learnability and verdict; a last row of signal shares."""
    headers = ["size", *results]
    sizes = sorted({s for r in results.values() for s in r.sizes})
    rows = [[f"{s}x{s}", *(_cell(r.sizes.get(s)) for r in results.values())] for s in sizes]
    rows.append(["boards with signal", *(f"{r.signal_share:.0%}" for r in results.values())])
    return headers, rows


def _cell(m: Any) -> str:
    return "-" if m is None else f"p {m.p:.0%}, learnability {m.learnability:.3f}: {m.band}"


def measure_view(engine: Engine, job_id: int | None) -> MeasureView:
    """The panel's view of a probe job: its progress while it runs, the side-by-side table once it is done."""
    if job_id is None:
        return MeasureView("")
    with session(engine) as s:
        job = s.get(Job, int(job_id))
        if job is None:
            return MeasureView(f"There is no job {job_id}.")
        if job.status in ACTIVE_JOB:
            done = job.step / job.total if job.total else 0.0
            each = (job.result or {}).get("progress") or {}
            last = job.log_tail.strip().splitlines()[-1] if job.log_tail.strip() else "waiting for the worker"
            per = "; ".join(f"**{label}**: {text}" for label, text in each.items()) if each else last
            return MeasureView(f"Measuring (job {job.id}, {job.status}): {per}", done, running=True)
        if job.status != JobStatus.DONE:
            return MeasureView(f"✗ The measurement {job.status}: {job.error or 'no result'}")
        keys = (job.result or {}).get("probes", {})
        rows = {p.key: p for p in s.exec(select(Probe).where(Probe.key.in_(list(keys.values()))))}
    results = {label: result_of(rows[key]) for label, key in keys.items() if key in rows}
    headers, table_rows = side_by_side(results)
    first = next(iter(results.values()), None)
    how = f" ({first.sizes[min(first.sizes)].boards} boards per size x {first.sizes[min(first.sizes)].answers} " \
          "answers, sampled as training does)" if first else ""
    return MeasureView(f"Measured{how}: too hard = most boards have no valid answer, too easy = most have only "
                       "valid ones; both teach GRPO nothing.", 1.0, headers, table_rows, list(keys.values()))
