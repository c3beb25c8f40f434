"""The headless stage loop that the web lab and `envlab run` both drive (docs/loop.md).

State lives in the database, never here: `advance` reads a run's rows and queues the one thing that
comes next (a stage, a proposal, or nothing while a person decides), so it can be called as often as
anyone likes, from any process, and a run picks up where it stopped after a crash.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from envsim.config import Adjustment, EnvConfig, Projection
from envsim.suite import VALIDATION_PER_SIZE, Split
from lab.context import (
    DEFAULT_PRESET,
    ContextModules,
    Evidence,
    context_preset,
    evidence_split,
    load_stage_result,
    preset_of,
    require_boards,
)
from lab.engineers import ENGINEERS, EngineerAnswer, Needs, needs_of
from lab.llm import LLMError, check_server
from lab.proposals import (
    Decided,
    current_proposal,
    decide,
    decision_of,
    fill_check,
    fillable,
    self_summary,
    store_proposal,
)
from lab.text import NAME_LIMIT, TEXT_LIMIT, too_long
from storage.db import UnsafePath, checkpoint_of, lock_run, run_folder, runs_root, stage_at
from storage.db import session as open_session
from storage.decisions import record_decision
from storage.models import (
    ACTIVE_JOB,
    Action,
    Decision,
    Episode,
    Job,
    JobKind,
    JobStatus,
    Priority,
    Proposal,
    Run,
    RunStatus,
    Stage,
    StageStatus,
    utcnow,
)
from storage.payloads import BenchmarkPayload, ProposePayload, StagePayload
from storage.queue import db_now, enqueue, fail, process_alive, request_cancel, requeue, stale_after_s
from storage.settings import HeldConfigs, RunSettings, SettingsError, first_error

LOOP_KINDS = (JobKind.STAGE, JobKind.PROPOSE)  # the jobs that move a run; a benchmark job never blocks it
PROPOSE_ATTEMPTS = 3  # a propose job that raises is tried this many times, then the run fails for a person
SELF_BACKEND = "hf:policy"  # the llm engineer's backend that asks the run's own checkpoint (policy as engineer)


class LoopError(ValueError):
    """A run cannot be created or moved as asked; the message says why."""


def create_run(s: Session, *, name: str, config: EnvConfig, settings: RunSettings, policy: str = "tiny",
               engineer: str = "heuristic", engineer_backend: str = "", seed: int = 0, description: str = "",
               experiment_id: int | None = None, arm: str | None = None) -> Run:
    """Store a run, its stage 0 (the starting policy, evaluated on `config`) and queue that stage.

    The keyword arguments are who the run is (its row's columns); `settings` is everything it is asked to do
    (`storage.settings.RunSettings`, checked when it was made), stored whole. What only the training stack can
    check is checked here, before anything is stored: the engineer, the GRPO overrides (as TRL would count
    them) and the llm engineer's context (`settings.context`, else the preset `settings.context_preset`,
    default `paper-best`, resolved into its modules). `settings.dev_per_size` is the dev boards per map size each
    stage is also evaluated on: the engineers read those, never the validation boards (docs/loop.md); None only
    for a run added to an experiment made before dev boards existed (its engineers read validation, as the others).
    `experiment_id` and `arm` place the run in an experiment (lab.study.experiments). A name or a description longer
    than `lab.text`'s bounds is refused. The GRPO overrides and the memory are checked for the processes its stages
    are launched on (`settings.processes`), and only a worker of that many GPUs claims its training stages.
    """
    for field, text, limit in (("run name", name, NAME_LIMIT), ("run description", description, TEXT_LIMIT)):
        if (why := too_long(field, text, limit)) is not None:
            raise LoopError(why)
    check_policy(policy)
    check_engineer(engineer, engineer_backend, policy, settings.held_configs)
    if settings.base_url:
        try:
            check_server(settings.base_url)
        except LLMError as err:
            raise LoopError(str(err)) from None
    try:  # a config changed with model_copy (e.g. `--instances 0`) skipped validation
        config = EnvConfig.model_validate(config.model_dump())
    except ValidationError as err:
        raise LoopError(f"the initial config is not valid: {first_error(err)}") from None
    from training.settings import check_grpo, check_memory, check_packages  # torch: overrides, a policy not shipped

    try:
        check_packages(settings)
        if settings.grpo:
            check_grpo(settings, config.num_instances, policy, settings.processes or 1)
        check_memory(settings, config, policy, needs_gpu=_needs_gpu(policy, settings))
    except SettingsError as err:
        raise LoopError(str(err)) from err  # its setting, for the settings file's line (`SettingsFile.located`)
    try:
        modules = (ContextModules(**settings.context) if settings.context is not None
                   else context_preset(settings.context_preset or DEFAULT_PRESET))
    except (ValueError, TypeError) as err:
        raise LoopError(f"context: {err}") from None
    settings = settings.model_copy(update={"context": asdict(modules), "context_preset": preset_of(modules)})
    run = Run(name=name, description=description, policy=policy, engineer=engineer, engineer_backend=engineer_backend,
              settings=settings, seed=seed, status=RunStatus.ACTIVE, experiment_id=experiment_id, arm=arm)
    s.add(run)
    s.commit()
    s.refresh(run)
    s.add(Stage(run_id=run.id, index=0, config=config, status=StageStatus.QUEUED))
    s.commit()
    _enqueue(s, StagePayload(run_id=run.id, stage_index=0))
    s.commit()
    return run


def check_policy(policy: str) -> None:
    """Refuse a policy this machine cannot load (no such folder, a hub name while downloads are off), in one line
    that names it, before a run depends on it (`training.resolve.resolve_policy`: no weight is read)."""
    from training.resolve import PolicyUnavailable, resolve_policy

    try:
        resolve_policy(policy)
    except PolicyUnavailable as err:
        raise LoopError(str(err)) from None


ANY_SETTINGS = RunSettings(stages=1)  # a run that sets nothing beyond its stages


def check_engineer(engineer: str, backend: str, policy: str | None = None, held: HeldConfigs | None = None) -> None:
    """Refuse an engineer the loop cannot run, before any run depends on it.

    `hf:policy` asks the run's own checkpoint to write a config, which only a policy that reads chat prompts can
    (`training.policy.prompt_style_of`, read without loading weights): the tiny policy and any compact one
    speak in cells and actions, so they are refused here, with `policy` the run's policy spec. A held engineer
    (`static`, `schedule`) proposes the configs the run holds (`held`, read for that engineer from a file when an
    experiment's arm was made): a run without them is refused.
    """
    if engineer not in ENGINEERS:
        raise LoopError(f"unknown engineer {engineer!r}: one of {', '.join(ENGINEERS)}")
    needs = needs_of(engineer, ANY_SETTINGS)  # whatever the run's settings
    if needs.held_configs and (held is None or held.kind != engineer):
        holds = "no configs" if held is None else f"a {held.kind} arm's configs from {held.source}"
        raise LoopError(f"the {engineer} engineer proposes the configs of a file, read once when an experiment's arm "
                        f"is made (envlab experiment new --arms {engineer}:FILE); this run holds {holds}")
    language_model = needs.language_model
    if language_model and not backend:
        raise LoopError(f"the {engineer} engineer needs a backend, e.g. hf:policy, hf:gemma3-270m or openai:<model>")
    if not language_model or backend != SELF_BACKEND or policy is None:
        return
    from training.policy import prompt_style_of  # here: torch loads only for the one check that reads a policy

    if prompt_style_of(policy) == "compact":
        raise LoopError(f"the {engineer} engineer with backend {SELF_BACKEND} asks the policy itself to write the next "
                        f"config, but policy {policy!r} reads compact prompts: its vocabulary is board cells and "
                        "actions, so it cannot write a config. Use a chat policy (gemma3-270m, any causal LM) for "
                        "policy-as-engineer, or another backend (openai:<model>, hf:gemma3-270m) or engineer")


def set_auto_apply(s: Session, run_id: int, on: bool) -> Run:
    run = s.get(Run, run_id)
    run.settings = run.settings.model_copy(update={"auto_apply": on})  # a new value: the record is frozen
    s.add(run)
    s.commit()
    return run


def stages_of(s: Session, run_id: int) -> list[Stage]:
    return list(s.exec(select(Stage).where(Stage.run_id == run_id).order_by(Stage.index)))


def jobs_of(s: Session, run_id: int, statuses: Sequence[JobStatus] | None = None,
            kinds: Sequence[JobKind] | None = None) -> list[Job]:
    """A run's jobs, oldest first."""
    query = select(Job).where(Job.run_id == run_id).order_by(Job.id)
    if statuses:
        query = query.where(Job.status.in_(statuses))
    if kinds:
        query = query.where(Job.kind.in_(kinds))
    return list(s.exec(query))


def _last_job(s: Session, run_id: int, kind: JobKind, target: int) -> Job | None:
    return s.exec(select(Job).where(Job.run_id == run_id, Job.kind == kind, Job.target == target)
                  .order_by(Job.id.desc())).first()


GPU_SETTING = "ENVLAB_GPU_ABOVE"  # parameters above which a pretrained policy's jobs need a GPU worker
GPU_ABOVE = 500_000_000  # its default: Gemma 3 270M trains on a CPU, Qwen3-0.6B and larger ask for a GPU


def gpu_above() -> int:
    """`$ENVLAB_GPU_ABOVE` parameters (default 500 M): a policy larger than this needs a GPU worker."""
    return int(float(os.environ.get(GPU_SETTING) or GPU_ABOVE))


def needs_gpu(run: Run) -> bool:
    """Whether the jobs that load `run`'s policy need a worker with a GPU: a policy of more than `gpu_above()`
    parameters (read from its files or its name, `training.resolve.policy_params`), unless the run allows the
    CPU (`RunSettings.allow_cpu`)."""
    return _needs_gpu(run.policy, run.settings)


def _needs_gpu(policy: str, settings: RunSettings) -> bool:
    from training.resolve import policy_params

    if settings.allow_cpu:
        return False
    params = policy_params(policy)
    return params is not None and params > gpu_above()


def _enqueue(s: Session, payload: StagePayload | ProposePayload | BenchmarkPayload, *,
             priority: int = Priority.BACKGROUND) -> Job:
    """Queue the job `payload` asks for, of its run and about its stage, inside the caller's transaction (committed
    with the rest of its step), saying what it needs: a GPU where it loads a large policy (a proposal only when the
    policy is its own engineer), and a training stage the processes its steps were planned for (stage 0 only
    evaluates: any worker)."""
    run = s.get(Run, payload.run_id)
    loads_policy = payload.kind != JobKind.PROPOSE or (engineer_needs(run).language_model
                                                       and run.engineer_backend == SELF_BACKEND)
    trains = payload.kind == JobKind.STAGE and payload.target > 0
    return enqueue(s, payload.kind, payload.stored(), run_id=payload.run_id, target=payload.target, commit=False,
                   needs_gpu=loads_policy and needs_gpu(run), priority=priority,
                   processes=(run.settings.processes or 1) if trains else None,
                   vllm_server=trains and run.settings.overrides.vllm_server)


def _set_status(run: Run, status: RunStatus, reason: str = "") -> None:
    run.status, run.status_reason = status, reason


@dataclass(frozen=True)
class Step:
    """Where a run stands after `advance`: its status as the step left it, and one line that says what was queued,
    what it waits for, or why it stopped."""

    status: RunStatus
    text: str


def advance(engine: Engine, run_id: int) -> Step:
    """Queue what comes next for a run and return where it stands.

    One transaction under the run's lock: any number of processes may call it at once (the worker's hook,
    the page, `envlab run`), and each step is taken once.
    """
    with open_session(engine) as s:
        run = lock_run(s, run_id)
        if run is None:
            raise LoopError(f"no run {run_id}")
        return _take_step(s, run)


def _take_step(s: Session, run: Run) -> Step:
    """`_step` on a run locked by the caller, committed."""
    text = _step(s, run)
    step = Step(RunStatus(run.status), text)  # every path through `_step` leaves the run's status set
    s.add(run)
    s.commit()
    return step


def _step(s: Session, run: Run) -> str:
    if run.status in (RunStatus.DONE, RunStatus.CANCELLED):
        return str(run.status) + (f": {run.status_reason}" if run.status_reason else "")
    if run.status == RunStatus.FAILED:
        return f"failed: {run.status_reason}"
    active = jobs_of(s, run.id, ACTIVE_JOB, LOOP_KINDS)
    if active:
        _set_status(run, RunStatus.ACTIVE)
        job = active[0]
        return f"{job.status}: {job.kind} job {job.id}" + (f" ({job.step}/{job.total})" if job.total else "")
    last = stages_of(s, run.id)[-1]
    if last.status != StageStatus.DONE:
        return _stage_ended(s, run, last)
    if last.index >= run.settings.stages:
        _set_status(run, RunStatus.DONE)
        return "done"
    proposal = current_proposal(s, run.id)
    decision = decision_of(s, proposal.id) if proposal else None
    if proposal is None or (decision is not None and decision.action == Action.REJECT):
        return _ask_engineer(s, run, last.index, replaces=proposal.id if proposal else None)
    if decision is None:
        if not run.settings.auto_apply:
            _set_status(run, RunStatus.WAITING)
            return f"waiting: proposal {proposal.id} needs a decision"
        decision = _auto_decide(s, proposal, last)
    # the proposal's replayed boards go with the config it applies, a person's edit of it too (a failed proposal has
    # none): the stage reads and checks them (`training.stage.stage_args`)
    s.add(Stage(run_id=run.id, index=last.index + 1, config=decision.config, status=StageStatus.QUEUED,
                replay=proposal.replay))
    # a person decided and waits for the stage: it goes before an experiment's work
    _enqueue(s, StagePayload(run_id=run.id, stage_index=last.index + 1),
             priority=Priority.BACKGROUND if decision.action == Action.AUTO else Priority.INTERACTIVE)
    _set_status(run, RunStatus.ACTIVE)
    return f"queued stage {last.index + 1} ({decision.action} by {decision.user})"


def _stage_ended(s: Session, run: Run, stage: Stage) -> str:
    """The last stage is not done and no job works on it: queue it, or stop the run saying why."""
    job = _last_job(s, run.id, JobKind.STAGE, stage.index)
    if job is None:
        _enqueue(s, StagePayload(run_id=run.id, stage_index=stage.index))
        _set_status(run, RunStatus.ACTIVE)
        return f"queued stage {stage.index}"
    stage.status = StageStatus.FAILED
    s.add(stage)
    if job.status == JobStatus.CANCELLED:
        _set_status(run, RunStatus.CANCELLED, f"stage {stage.index} was cancelled (job {job.id})")
        return f"cancelled: {run.status_reason}"
    _set_status(run, RunStatus.FAILED, f"stage {stage.index} failed: {job.error or job.status} (job {job.id})")
    return f"failed: {run.status_reason}"


def _ask_engineer(s: Session, run: Run, after: int, replaces: int | None) -> str:
    """Queue a propose job, or retry one that raised (`PROPOSE_ATTEMPTS` in all), or fail the run.

    `replaces` is the rejected proposal a new one answers (None for the first ask after a stage), so a
    job is matched to the request it serves.
    """
    job = _last_job(s, run.id, JobKind.PROPOSE, after)
    if job is None or ProposePayload.of(job).replaces != replaces:
        # a person rejected a proposal and waits for the next: it goes before an experiment's work
        _enqueue(s, ProposePayload(run_id=run.id, after_stage=after, replaces=replaces),
                 priority=Priority.BACKGROUND if replaces is None else Priority.INTERACTIVE)
        _set_status(run, RunStatus.ACTIVE)
        if replaces is not None:
            return f"proposal {replaces} rejected: asking the engineer again"
        return f"queued a proposal after stage {after}"
    if job.status == JobStatus.CANCELLED:
        _set_status(run, RunStatus.CANCELLED, f"the proposal after stage {after} was cancelled (job {job.id})")
        return f"cancelled: {run.status_reason}"
    if job.status == JobStatus.FAILED and job.attempts < PROPOSE_ATTEMPTS:
        requeue(s, job.id, commit=False)
        _set_status(run, RunStatus.ACTIVE)
        return f"retrying the proposal after stage {after} (attempt {job.attempts + 1} of {PROPOSE_ATTEMPTS})"
    why = job.error or f"job {job.id} ended {job.status} without a proposal"
    _set_status(run, RunStatus.FAILED, f"proposal after stage {after} failed: {why}")
    return f"failed: {run.status_reason}"


def missing_checkpoint(engine: Engine, run_id: int, stage_index: int | None = None) -> str | None:
    """Why a stage of a run (every trained stage, without `stage_index`) has no checkpoint to load here, or
    None when it has: work that needs the weights is refused when asked, not when a worker gets to it."""
    with open_session(engine) as s:
        query = select(Stage).where(Stage.run_id == run_id, Stage.status == StageStatus.DONE)
        stages = list(s.exec(query.where(Stage.index == stage_index) if stage_index is not None
                             else query.where(Stage.index > 0).order_by(Stage.index)))
        run = s.get(Run, run_id)
        example = bool(run and run.settings.example)
    for stage in stages:
        if stage.index == 0:
            continue  # the run's policy as given ("tiny", a model name): the worker loads it as any run does
        where = checkpoint_of(engine, stage)
        if where is None or not Path(where).is_dir():
            why = "the example run ships without checkpoints (docs/example.md)" if example else \
                f"no checkpoint folder at {where}" if where else "no checkpoint was recorded"
            return f"stage {stage.index} of run {run_id} has no weights here: {why}"
    return None


def queue_benchmark(engine: Engine, run_id: int, stage_index: int) -> Job:
    """Queue the 3,150-board benchmark for a stage's checkpoint, once: a stage evaluated on the benchmark
    already, or with a benchmark job queued or running, is refused with a message saying when and which."""
    if (why := missing_checkpoint(engine, run_id, stage_index)) is not None:
        raise LoopError(why)
    with open_session(engine) as s:
        stage = stage_at(s, run_id, stage_index)
        if stage is None:
            raise LoopError(f"run {run_id} has no stage {stage_index}")
        if stage.status != StageStatus.DONE:
            raise LoopError(f"stage {stage_index} of run {run_id} is {stage.status}: it has no checkpoint to evaluate")
        evaluated = s.exec(select(Episode.id).where(Episode.run_id == run_id, Episode.stage_index == stage_index,
                                                    Episode.split == Split.BENCHMARK)).first()
        if evaluated is not None:
            job = s.exec(select(Job).where(Job.run_id == run_id, Job.kind == JobKind.BENCHMARK,
                                           Job.target == stage_index, Job.status == JobStatus.DONE)).first()
            when = f" at {job.finished_at:%Y-%m-%d %H:%M:%S} UTC (job {job.id})" if job and job.finished_at else ""
            raise LoopError(f"stage {stage_index} of run {run_id} was evaluated on the benchmark{when}")
        try:
            job = _enqueue(s, BenchmarkPayload(run_id=run_id, stage_index=stage_index))
            s.commit()
        except IntegrityError:
            s.rollback()
            raise LoopError(f"stage {stage_index} of run {run_id} has a benchmark job queued or running "
                            "already") from None
        return job


def after_job(engine: Engine, job: Job) -> None:
    """The worker's `after` hook: once any job of a run ends, drop a finished stage's intermediate checkpoints
    (`prune_checkpoints`) and queue what comes next for that run. A stage job handed back to the queue (its worker
    is ending) leaves its stage queued, not failed: the stage marks itself failed on any exception, its stop
    included."""
    if job.run_id is not None and job.kind == JobKind.STAGE and job.status == JobStatus.DONE:
        prune_checkpoints(engine, job.run_id, job.target)
    if job.run_id is not None and job.kind == JobKind.STAGE and job.status == JobStatus.QUEUED:
        with open_session(engine) as s:
            stage = stage_at(s, job.run_id, job.target)
            if stage is not None and stage.status == StageStatus.FAILED:
                stage.status, stage.finished_at = StageStatus.QUEUED, None
                s.add(stage)
                s.commit()
    if job.run_id is not None and job.kind in LOOP_KINDS:
        advance(engine, job.run_id)


CHECKPOINT_DIR = re.compile(r"checkpoint-\d+")  # TRL's intermediate checkpoints, in a stage's trl/ folder


def prune_checkpoints(engine: Engine, run_id: int, stage_index: int | None) -> list[Path]:
    """Delete TRL's intermediate checkpoints (`stage-K/trl/checkpoint-*/`) of a finished stage, whose final weights
    are in `stage-K/policy/`, unless the run keeps them (`RunSettings.keep_checkpoints`); returns what went. A
    stage that is not done keeps them: a new attempt resumes from the last one."""
    with open_session(engine) as s:
        run = s.get(Run, run_id)
        stage = stage_at(s, run_id, stage_index)
    if run is None or stage is None or stage.status != StageStatus.DONE or run.settings.keep_checkpoints:
        return []
    try:
        trainer_dir = run_folder(engine, run.uuid) / f"stage-{stage.index}" / "trl"
    except UnsafePath:
        return []
    if not trainer_dir.is_dir() or trainer_dir.is_symlink():
        return []
    gone = []
    for entry in sorted(trainer_dir.iterdir()):
        if CHECKPOINT_DIR.fullmatch(entry.name) and entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
            gone.append(entry)
    return gone


def _auto_decide(s: Session, proposal: Proposal, last: Stage) -> Decision:
    """Auto-apply: the projected config, or, for a failed proposal, the config in force (said in the note)."""
    if proposal.projected_config is not None:
        return decide(s, proposal.id, Action.AUTO, "auto-apply", commit=False).decision
    return record_decision(s, proposal.id, Action.AUTO, "auto-apply", last.config, commit=False,
                           note=f"the proposal failed ({proposal.error}); the previous config stays in force")


def engineer_needs(run: Run) -> Needs:
    """What the run's engineer needs besides the evidence, for the run's settings (`Engineer.needs`)."""
    return needs_of(run.engineer, run.settings)


def evidence_for(s: Session, run: Run, after_stage: int) -> Evidence:
    """What the engineer reads after `after_stage`: that stage's results and every earlier stage's, on the run's
    dev boards (`lab.context.evidence_split`): never its validation boards, which score it. An engineer that reads
    the episodes of that stage gets `NoEvidence` where they are not all stored (`lab.context.require_boards`): its
    proposal fails, loudly, instead of reading no board. The agent counts it may put in the mix are the run's
    `agent_counts`, else those of the config in force (a person's edit that added a count keeps it)."""
    split = evidence_split(run.settings)
    results = [load_stage_result(s, run.id, k, split=split) for k in range(after_stage + 1)]
    if engineer_needs(run).reads_episodes:
        require_boards(results[-1], run.id, split)
    total = run.settings.stages
    return Evidence(current=results[-1], history=tuple(results[:-1]), round_index=after_stage + 1,
                    rounds_left=total - after_stage - 1, instances_per_stage=results[-1].config.num_instances,
                    hyperparameters=run.settings.grpo or None,
                    self_summary=self_summary(s, run.id, after_stage),
                    agent_counts=run.settings.agent_counts or results[-1].config.agent_counts)


def keep_instances(answer: EngineerAnswer, n: int) -> EngineerAnswer:
    """The answer with `num_instances` kept at `n`, the change listed among its adjustments: a run of an
    experiment trains every stage on the same number of boards, whatever its engineer proposes (equal compute,
    docs/experiments.md)."""
    projection = answer.projection
    if projection is None or projection.config.num_instances == n:
        return answer
    kept = Adjustment("num_instances", projection.config.num_instances, n,
                      "kept: every stage of an experiment's run trains on the same number of boards")
    return replace(answer, projection=Projection(projection.config.model_copy(update={"num_instances": n}),
                                                 (*projection.adjustments, kept)))


def propose_loads_model(engine: Engine, job: Job) -> bool:
    """Whether a `propose` job loads a model (so its worker runs it in a child process): an engineer that probes
    the policy, or a language model that answers in process (an `hf:` backend)."""
    with open_session(engine) as s:
        run = s.get(Run, job.run_id) if job.run_id is not None else None
    if run is None:
        return False
    needs = engineer_needs(run)
    return needs.probe is not None or (needs.language_model and run.engineer_backend.startswith("hf:"))


ASKED_AGAIN = 10**15  # the seed's step per rejected proposal: above any run's `seed * 1000 + stage`


def proposal_seed(s: Session, run: Run, after: int) -> int:
    """The engineer's seed for the proposal after stage `after`: the run's seed and the stage, moved on by each
    proposal for that stage a person rejected already, so an engineer that draws (`random`, `learnability`'s probes,
    a sampling model) answers anew when asked again; one that reads only the evidence cannot
    (`Engineer.same_when_asked_again`), and the page says so before it is asked."""
    rejected = s.exec(select(Decision.id).join(Proposal, Decision.proposal_id == Proposal.id).where(
        Proposal.run_id == run.id, Proposal.after_stage == after, Decision.action == Action.REJECT)).all()
    return run.seed * 1000 + after + ASKED_AGAIN * len(rejected)


def run_propose_job(engine: Engine, job: Job, progress: Callable[..., bool]) -> dict:
    """The `propose` job: run the engineer on the evidence and store its proposal (even a failed one)."""
    from training.resolve import resolve_policy

    payload = ProposePayload.of(job)
    run_id, after = payload.run_id, payload.after_stage
    with open_session(engine) as s:
        run = s.get(Run, run_id)
        evidence = evidence_for(s, run, after)
        stage = stages_of(s, run_id)[after]
        progress(0, 1, f"engineer {run.engineer} reads stage {after}")
        needs = engineer_needs(run)
        options: dict[str, Any] = {}
        if needs.language_model:
            options |= {"backend": run.engineer_backend, "base_url": run.settings.base_url,
                        "modules": ContextModules(**run.settings.context),
                        "remeasure": bool(run.settings.remeasure), "thinking": run.settings.thinking == "on"}
        if needs.policy_path:
            # stage 0's checkpoint is the run's policy as named ("gemma3-270m"): its folder here, never a hub name
            options["policy_path"] = (resolve_policy(run.policy, build=True) if stage.index == 0
                                      else checkpoint_of(engine, stage))
        if needs.probe is not None:
            options["probe_fn"] = probe_for(engine, run, stage, **needs.probe)
        if needs.held_out:
            progress(0, 1, "reading the run's held-out boards (validation, dev, benchmark)")
            options["held_out"] = held_out_of(engine, run, evidence.agent_counts)
        if needs.held_configs:
            options["held"] = run.settings.held_configs
        check = fill_check(run.seed, after + 1)
        answer = ENGINEERS[run.engineer].propose(evidence, seed=proposal_seed(s, run, after), cannot_fill=check,
                                                 **options)
        if run.experiment_id is not None:
            answer = keep_instances(answer, evidence.current.config.num_instances)
        progress(0, 1, "checking that the generator can fill the proposed config")
        answer = fillable(answer, check)
        proposal = store_proposal(s, run_id, after, engineer_name(run, stage), answer, evidence.current.config)
        progress(1, 1, f"proposal {proposal.id}" + (f" failed: {answer.error}" if answer.error else ""))
        return {"proposal_id": proposal.id, "error": answer.error}


def engineer_name(run: Run, stage: Stage) -> str:
    """Who wrote a proposal, as its row names it: the engineer, and for a language model its backend; the policy
    as its own engineer (`hf:policy`) is named by the checkpoint that answered (the stage's, as its row stores it)."""
    if not engineer_needs(run).language_model:
        return run.engineer
    if run.engineer_backend == SELF_BACKEND:
        return f"{run.engineer} ({SELF_BACKEND}: {stage.checkpoint or run.policy})"
    return f"{run.engineer} ({run.engineer_backend})"


def probe_for(engine: Engine, run: Run, stage: Stage, *, boards: int, answers: int) -> Callable[[EnvConfig], Any]:
    """A config's probe on `stage`'s checkpoint, as the run's stages sample (its seed and temperature), cached in
    the `probes` table; the policy loads on the first probe that is not cached, once."""
    from training.policy import load_policy, local_device  # torch loads here, for the jobs that measure
    from training.probe import measure, sampling_temperature

    loaded: list[Any] = []
    # stage 0 is the run's policy as given ("tiny", a model name): the folder its row records is the one of the
    # machine that evaluated it, which an imported run does not share
    name = run.policy if stage.index == 0 else stage.checkpoint

    def load() -> Any:
        if not loaded:
            loaded.append(load_policy(run.policy if stage.index == 0 else checkpoint_of(engine, stage),
                                      device=local_device()).configured(run.settings))
        return loaded[0]

    temperature = sampling_temperature(run.settings.grpo)
    return lambda config: measure(engine, config, name, policy=load, settings=run.settings, seed=run.seed,
                                  boards=boards, answers=answers, temperature=temperature)


def held_out_of(engine: Engine, run: Run, counts: Sequence[int] | None = None) -> frozenset[str]:
    """The ids of the boards a run holds out, which nothing the run trains on as it is may be (`Needs.held_out`):
    its validation and dev sets, as its stages evaluate them (cached in the runs root), and, where its agent counts
    (`counts`, else its validation counts) reach 3, the benchmark's boards (3, 4 and 5 agents; built once per runs
    root, a few minutes of solver time, where the cache is missing)."""
    from training.evaluate import benchmark_entries, dev_entries, validation_entries

    settings, root = run.settings, runs_root(engine)
    per_size = settings.validation_per_size or VALIDATION_PER_SIZE
    agents = settings.validation_agents
    ids = {e.instance.id for e in validation_entries(root, per_size, agents)}
    if settings.dev_per_size:
        ids |= {e.instance.id for e in dev_entries(root, settings.dev_per_size, per_size, agents,
                                                    run.seed if settings.dev_per_seed else None)}
    if max((*(counts or ()), *agents)) >= 3:
        root.mkdir(parents=True, exist_ok=True)
        ids |= {e.instance.id for e in benchmark_entries(root)}
    return frozenset(ids)


def resume(engine: Engine, run_id: int) -> list[int]:
    """Put a stopped run (failed, cancelled, or cut off with its worker) back in the queue; returns the ids of
    the jobs queued again.

    Only dead work is touched: a running job is failed first if its worker is gone (a local process that
    no longer exists, or no heartbeat for `stale_after_s()` seconds, from any host); a running job with a
    fresh heartbeat, on this host or another, is left to its worker. Then the run's last failed or cancelled
    stage or propose job is queued again (a stage resumes from its last checkpoint).
    """
    with open_session(engine) as s:
        run = lock_run(s, run_id)
        if run is None:
            raise LoopError(f"no run {run_id}")
        try:  # a run imported by an older version may name a folder anywhere: it is not trained into
            run_folder(engine, run.uuid)
            for stage in stages_of(s, run_id):
                checkpoint_of(engine, stage)
        except UnsafePath as err:
            raise LoopError(f"run {run_id} cannot be resumed: {err}") from None
        now = db_now(s)
        for job in jobs_of(s, run_id, (JobStatus.RUNNING,)):
            if (why := _dead(job, now)) is not None:
                fail(s, job.id, why, commit=False)
        requeued = []
        last = stages_of(s, run_id)[-1]
        kind = JobKind.STAGE if last.status != StageStatus.DONE else JobKind.PROPOSE
        job = _last_job(s, run_id, kind, last.index)
        if job is not None and job.status in (JobStatus.FAILED, JobStatus.CANCELLED):
            requeue(s, job.id, commit=False)
            requeued.append(job.id)
        if last.status == StageStatus.FAILED:
            last.status = StageStatus.QUEUED
            s.add(last)
        if run.status != RunStatus.DONE:
            _set_status(run, RunStatus.ACTIVE)
        s.add(run)
        s.commit()
    return requeued


def switch_engineer(engine: Engine, run_id: int, engineer: str, backend: str = "") -> list[int]:
    """Give a run another engineer from its next proposal on (e.g. after the llm engineer failed), then resume.

    The change is kept in the run's settings (`engineer_history`), so the run's record says who proposed what.
    """
    with open_session(engine) as s:
        run = lock_run(s, run_id)
        if run is None:
            raise LoopError(f"no run {run_id}")
        check_engineer(engineer, backend, run.policy, run.settings.held_configs)
        history = [*run.settings.engineer_history,
                   {"engineer": run.engineer, "backend": run.engineer_backend, "until": utcnow().isoformat()}]
        run.settings = run.settings.model_copy(update={"engineer_history": history})
        run.engineer, run.engineer_backend = engineer, backend
        s.add(run)
        s.commit()
    return resume(engine, run_id)


def cancel(engine: Engine, run_id: int) -> list[int]:
    """Stop a run: its queued and running jobs are cancelled and the run stays cancelled until resumed
    (the worker's hook never undoes it). Returns the ids of the jobs asked to stop."""
    with open_session(engine) as s:
        run = lock_run(s, run_id)
        if run is None:
            raise LoopError(f"no run {run_id}")
        jobs = jobs_of(s, run_id, ACTIVE_JOB)
        for job in jobs:
            request_cancel(s, job.id, commit=False)
        if run.status != RunStatus.DONE:
            _set_status(run, RunStatus.CANCELLED, f"cancelled at {utcnow():%Y-%m-%d %H:%M:%S} UTC")
        s.add(run)
        s.commit()
    return [j.id for j in jobs]


def _dead(job: Job, now: datetime) -> str | None:
    """Why a running job's worker counts as gone, or None while it may still be working; `now` is the database's
    clock (`storage.queue.db_now`), the one its heartbeats were stamped by."""
    worker_host, _, pid = (job.worker or "").rpartition(":")
    if worker_host == socket.gethostname() and pid.isdigit() and not process_alive(int(pid)):
        return f"worker {job.worker} is gone (found on resume at {now:%H:%M:%S} UTC)"
    age = (now - job.heartbeat_at).total_seconds() if job.heartbeat_at else float("inf")
    if age > stale_after_s():
        return f"worker {job.worker} sent no heartbeat for {age:.0f} s (found on resume)"
    return None


def drive(engine: Engine, run_id: int, work: Callable[[], bool], on_state: Callable[[Step], None] | None = None,
          poll_s: float = 2.0) -> Step:
    """Advance a run until it is done or failed, calling `work()` to run queued jobs (returns True if it ran
    one); while a proposal waits for a person (no auto-apply), poll until someone decides in the web lab."""
    while True:
        state = advance(engine, run_id)
        if on_state:
            on_state(state)
        if state.status in (RunStatus.DONE, RunStatus.FAILED, RunStatus.CANCELLED):
            return state
        if not work():
            time.sleep(poll_s)


def decide_and_advance(engine: Engine, proposal_id: int, action: str, user: str, *, edited: Any = None,
                       note: str = "", probes: list[str] | None = None) -> tuple[Decided, Step]:
    """A decision (`lab.proposals.decide`: what it stored, an edit as projected) and the run's next step, in one
    session and one transaction under the run's lock (the page's buttons: one database session per click).
    Raises what `decide` raises (LookupError for no such proposal)."""
    with open_session(engine) as s:
        decided = decide(s, proposal_id, action, user, edited=edited, note=note, commit=False, probes=probes)
        run = lock_run(s, s.get(Proposal, proposal_id).run_id)  # in the session since `decide` read it
        return decided, _take_step(s, run)
