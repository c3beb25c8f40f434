"""The headless stage loop that the web lab and `envlab run` both drive (docs/loop.md).

State lives in the database, never here: `advance` reads a run's rows and queues the one thing that
comes next (a stage, a proposal, or nothing while a person decides), so it can be called as often as
anyone likes, from any process, and a run picks up where it stopped after a crash.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from sqlalchemy import Engine
from sqlmodel import Session, select

from envsim.config import EnvConfig
from lab.context import ContextModules, Evidence, load_stage_result
from lab.engineers import ENGINEERS
from lab.proposals import decide, decision_of, store_proposal
from storage.db import session as open_session
from storage.decisions import record_decision
from storage.models import Decision, Job, Proposal, Run, Stage, utcnow
from storage.queue import enqueue, fail, requeue

ACTIVE = ("queued", "running")


class LoopError(ValueError):
    """A run cannot be created or moved as asked; the message says why."""


def create_run(s: Session, *, name: str, config: EnvConfig, stages: int, policy: str = "tiny",
               engineer: str = "heuristic", engineer_backend: str = "", auto_apply: bool = False, seed: int = 0,
               grpo: dict[str, Any] | None = None, context: ContextModules | None = None,
               base_url: str | None = None, description: str = "", lora: int = 0,
               validation_boards: int | None = None) -> Run:
    """Store a run, its stage 0 (the starting policy, evaluated on `config`) and queue that stage.

    `lora` > 0 trains LoRA adapters of that rank in each stage (folded into the weights when it ends) instead
    of every weight: the option for large policies. `validation_boards` evaluates each stage on that many of
    the 240 validation boards, spread over the sizes (None: all of them), for a quick look.
    """
    if engineer not in ENGINEERS:
        raise LoopError(f"unknown engineer {engineer!r}: one of {', '.join(ENGINEERS)}")
    if engineer == "llm" and not engineer_backend:
        raise LoopError("the llm engineer needs a backend, e.g. hf:policy, hf:gemma3-270m or openai:<model>")
    if stages < 1:
        raise LoopError(f"stages = {stages}: a run trains at least 1 stage")
    if lora < 0:
        raise LoopError(f"lora = {lora}: a LoRA rank is a positive number (0: no LoRA)")
    if validation_boards is not None and validation_boards < 1:
        raise LoopError(f"validation_boards = {validation_boards}: evaluate on at least 1 board (None: all 240)")
    settings = {"stages": stages, "auto_apply": auto_apply, "grpo": grpo or {}, "lora": lora,
                "context": asdict(context or ContextModules.paper_best()), "base_url": base_url}
    if validation_boards is not None:
        settings["validation_boards"] = validation_boards
    run = Run(name=name, description=description, policy=policy, engineer=engineer, engineer_backend=engineer_backend,
              settings=settings, seed=seed, status="active")
    s.add(run)
    s.commit()
    s.refresh(run)
    s.add(Stage(run_id=run.id, index=0, config=config.model_dump(mode="json"), status="queued"))
    s.commit()
    enqueue(s, "stage", {"run_id": run.id, "stage_index": 0})
    return run


def set_auto_apply(s: Session, run_id: int, on: bool) -> Run:
    run = s.get(Run, run_id)
    run.settings = {**run.settings, "auto_apply": on}  # a new dict: JSON columns do not track edits inside one
    s.add(run)
    s.commit()
    return run


def stages_of(s: Session, run_id: int) -> list[Stage]:
    return list(s.exec(select(Stage).where(Stage.run_id == run_id).order_by(Stage.index)))


def jobs_of(s: Session, run_id: int, statuses: tuple[str, ...] | None = None) -> list[Job]:
    """A run's jobs, oldest first (payloads are JSON, so the run filter is applied here)."""
    query = select(Job).order_by(Job.id)
    if statuses:
        query = query.where(Job.status.in_(statuses))
    return [j for j in s.exec(query) if j.payload.get("run_id") == run_id]


def _set_status(s: Session, run: Run, status: str) -> None:
    if run.status != status:
        run.status = status
        s.add(run)
        s.commit()


def advance(engine: Engine, run_id: int) -> str:
    """Queue what comes next for a run and return a one-line description of where it stands."""
    with open_session(engine) as s:
        run = s.get(Run, run_id)
        if run is None:
            raise LoopError(f"no run {run_id}")
        if run.status == "done":
            return "done"
        active = jobs_of(s, run_id, ACTIVE)
        if active:
            _set_status(s, run, "active")
            job = active[0]
            return f"{job.status}: {job.kind} job {job.id}" + (f" ({job.step}/{job.total})" if job.total else "")
        last = stages_of(s, run_id)[-1]
        if last.status != "done":
            ended = [j for j in jobs_of(s, run_id) if j.kind == "stage" and j.payload.get("stage_index") == last.index]
            if not ended:
                enqueue(s, "stage", {"run_id": run_id, "stage_index": last.index})
                return f"queued stage {last.index}"
            last.status = "failed"
            s.add(last)
            _set_status(s, run, "failed")
            why = ended[-1].error or ended[-1].status
            return f"failed: stage {last.index} job {ended[-1].id} ended {ended[-1].status} ({why})"
        if last.index >= run.settings["stages"]:
            _set_status(s, run, "done")
            return "done"
        proposal = s.exec(select(Proposal).where(Proposal.run_id == run_id, Proposal.after_stage == last.index)
                          .order_by(Proposal.id.desc())).first()
        if proposal is None:
            enqueue(s, "propose", {"run_id": run_id, "after_stage": last.index})
            _set_status(s, run, "active")
            return f"queued a proposal after stage {last.index}"
        decision = decision_of(s, proposal.id)
        if decision is None:
            if not run.settings.get("auto_apply"):
                _set_status(s, run, "waiting")
                return f"waiting: proposal {proposal.id} needs a decision"
            decision = _auto_decide(s, proposal, last)
        if decision.action == "reject":
            enqueue(s, "propose", {"run_id": run_id, "after_stage": last.index})
            _set_status(s, run, "active")
            return f"proposal {proposal.id} rejected: asking the engineer again"
        s.add(Stage(run_id=run_id, index=last.index + 1, config=decision.config, status="queued"))
        s.commit()
        enqueue(s, "stage", {"run_id": run_id, "stage_index": last.index + 1})
        _set_status(s, run, "active")
        return f"queued stage {last.index + 1} ({decision.action} by {decision.user})"


def after_job(engine: Engine, job: Job) -> None:
    """The worker's `after` hook: once any job of a run ends, queue what comes next for that run."""
    if "run_id" in job.payload:
        advance(engine, job.payload["run_id"])


def _auto_decide(s: Session, proposal: Proposal, last: Stage) -> Decision:
    """Auto-apply: the projected config, or, for a failed proposal, the config in force (said in the note)."""
    if proposal.projected_config is not None:
        return decide(s, proposal.id, "auto", "auto-apply")
    return record_decision(s, proposal.id, "auto", "auto-apply", last.config,
                           note=f"the proposal failed ({proposal.error}); the previous config stays in force")


def evidence_for(s: Session, run: Run, after_stage: int) -> Evidence:
    """What the engineer reads after `after_stage`: that stage's results and every earlier stage's."""
    results = [load_stage_result(s, run.id, k) for k in range(after_stage + 1)]
    total = run.settings["stages"]
    return Evidence(current=results[-1], history=tuple(results[:-1]), round_index=after_stage + 1,
                    rounds_left=total - after_stage - 1, instances_per_stage=results[-1].config.num_instances,
                    hyperparameters=run.settings.get("grpo") or None, self_summary=None)


def run_propose_job(engine: Engine, job: Job, progress: Callable[..., bool]) -> dict:
    """The `propose` job: run the engineer on the evidence and store its proposal (even a failed one)."""
    run_id, after = job.payload["run_id"], job.payload["after_stage"]
    with open_session(engine) as s:
        run = s.get(Run, run_id)
        evidence = evidence_for(s, run, after)
        stage = stages_of(s, run_id)[after]
        progress(0, 1, f"engineer {run.engineer} reads stage {after}")
        options: dict[str, Any] = {}
        if run.engineer == "llm":
            options = {"backend": run.engineer_backend, "base_url": run.settings.get("base_url"),
                       "policy_path": stage.checkpoint, "modules": ContextModules(**run.settings["context"])}
        answer = ENGINEERS[run.engineer](evidence, seed=run.seed * 1000 + after, **options)
        proposal = store_proposal(s, run_id, after, run.engineer, answer, evidence.current.config)
        progress(1, 1, f"proposal {proposal.id}" + (f" failed: {answer.error}" if answer.error else ""))
        return {"proposal_id": proposal.id, "error": answer.error}


def resume(engine: Engine, run_id: int) -> list[int]:
    """Put a stopped run back in the queue: jobs of dead local workers and failed or cancelled stage jobs
    are queued again (a stage resumes from its last checkpoint). Returns the requeued job ids."""
    host = socket.gethostname()
    requeued = []
    with open_session(engine) as s:
        for job in jobs_of(s, run_id, ("running",)):
            worker_host, _, pid = (job.worker or "").rpartition(":")
            if worker_host == host and pid.isdigit() and not _alive(int(pid)):
                fail(s, job.id, f"worker {job.worker} is gone (found on resume at {utcnow():%H:%M:%S} UTC)")
        for stage in stages_of(s, run_id):
            if stage.status in ("failed", "running", "queued"):
                ended = [j for j in jobs_of(s, run_id) if j.kind == "stage"
                         and j.payload.get("stage_index") == stage.index]
                if ended and ended[-1].status in ("failed", "cancelled"):
                    requeue(s, ended[-1].id)
                    requeued.append(ended[-1].id)
                stage.status = "queued"
                s.add(stage)
        run = s.get(Run, run_id)
        run.status = "active"
        s.add(run)
        s.commit()
    return requeued


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def drive(engine: Engine, run_id: int, work: Callable[[], bool], on_state: Callable[[str], None] | None = None,
          poll_s: float = 2.0) -> str:
    """Advance a run until it is done or failed, calling `work()` to run queued jobs (returns True if it ran
    one); while a proposal waits for a person (no auto-apply), poll until someone decides in the web lab."""
    while True:
        state = advance(engine, run_id)
        if on_state:
            on_state(state)
        if state == "done" or state.startswith("failed"):
            return state
        if not work():
            time.sleep(poll_s)
