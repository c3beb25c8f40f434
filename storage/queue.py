"""The job queue: the web page enqueues work, worker processes claim it, report on it and end it.

A job moves queued -> running -> done | failed | cancelled, and back to queued only through
`requeue`. The claim is one UPDATE whose subquery picks the oldest queued job, so two workers
never get the same job: on PostgreSQL the subquery is `FOR UPDATE SKIP LOCKED` (a second worker
skips the row the first has locked and takes the next one), on SQLite the UPDATE runs under the
database's single write lock, and the `status = 'queued'` test in the UPDATE itself is the last word.

Every function here is one transaction and commits it. Progress, log lines and the end of a job are
written only while the job is still running, so a worker whose job was reaped as stale (or ended
by someone else) learns it from `LostJob` instead of overwriting what happened meanwhile.
Jobs are never deleted.

Every time in a job's life (enqueued, claimed, heartbeat, ended) and the reaper's cutoff is read from the
database's clock (`db_now`), never the calling machine's: a worker whose clock ran 90 s behind the reaper's
had its live job reaped at once, and workers on several machines would each have judged by their own.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import and_, func, not_, or_, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from storage.models import ACTIVE_JOB, Job, JobKind, JobStatus, Priority

LOG_TAIL_LINES = 200
STALE_SETTING = "ENVLAB_STALE_S"


def stale_after_s() -> float:
    """Seconds without a heartbeat after which a running job, and its worker, count as dead.

    One rule for everyone: the worker reaps such jobs, the page calls such a worker down, and
    `resume` requeues only such jobs. `$ENVLAB_STALE_S`, else 60.
    """
    return float(os.environ.get(STALE_SETTING) or 60.0)


def db_now(session: Session) -> datetime:
    """The database's clock, timezone-aware UTC: the one clock every worker, reaper and page compare heartbeats by.

    PostgreSQL's time of the current statement (`now()` would be the start of a transaction that may have been
    open a while); SQLite's UTC clock to the millisecond (its `CURRENT_TIMESTAMP` drops the fraction of a second).
    """
    if session.get_bind().dialect.name == "postgresql":
        return session.exec(select(func.statement_timestamp())).one().astimezone(UTC)
    return datetime.fromisoformat(session.exec(select(func.strftime("%Y-%m-%d %H:%M:%f", "now"))).one()
                                  ).replace(tzinfo=UTC)


class LostJob(RuntimeError):
    """The job is no longer running (reaped as stale, cancelled, or ended already)."""


class AlreadyQueued(ValueError):
    """The run has a queued or running job of this kind and target already; `job` is that one."""

    def __init__(self, job: Job):
        self.job = job
        super().__init__(f"{job.kind} job {job.id} for run {job.run_id}, stage {job.target} is {job.status} already")


def enqueue(session: Session, kind: JobKind, payload: dict[str, Any], *, run_id: int | None = None,
            target: int | None = None, commit: bool = True, needs_gpu: bool = False,
            priority: int = Priority.BACKGROUND, processes: int | None = None, vllm_server: bool = False) -> Job:
    """Queue a job of `kind` about stage `target` of run `run_id`; `payload` is whatever its worker needs.

    `needs_gpu`: only a worker that owns a GPU claims it. `processes`: only a worker that launches that many
    processes claims it (a training stage, whose steps were counted for them; None: any; `vllm_server`: a stage in
    vLLM's server mode, whose processes are the worker's GPUs less its server's). `priority`: a person's
    interactive jobs (`Priority.INTERACTIVE`) are claimed before the others. With `commit=False` the row is only
    flushed (a caller holding the run's lock commits it with the rest).

    Raises:
        AlreadyQueued: that run has a queued or running job of this kind and target already (the database's
            partial unique index says so, whoever asked first).
    """
    job = Job(kind=JobKind(kind), payload=payload, run_id=run_id, target=target, needs_gpu=needs_gpu,
              priority=int(priority), processes=processes, vllm_server=vllm_server, created_at=db_now(session))
    session.add(job)
    if not commit:
        session.flush()
        return job
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        existing = session.exec(select(Job).where(Job.run_id == run_id, Job.kind == kind, Job.target == target,
                                                  Job.status.in_(ACTIVE_JOB))).first()
        if existing is None:
            raise
        raise AlreadyQueued(existing) from None
    session.refresh(job)
    return job


def claim(session: Session, worker_id: str, *, gpu: bool = True, run_id: int | None = None,
          kinds: Collection[str] | None = None, by_run: bool = False, processes: int | None = None,
          served: int | None = None) -> Job | None:
    """Take the most urgent queued job that `worker_id` can run and mark it running; None when there is none.

    Most urgent: the highest `priority` (a person's interactive jobs), then the oldest by first enqueueing (a
    requeued job keeps its id and so its place ahead of newer jobs). `gpu=False`: a worker without a GPU, which
    never takes a job that needs one. `run_id`: only that run's jobs (`envlab run` drives its own run). `kinds`:
    only a job of one of those kinds (a light lane: `probe` jobs beside a long stage). `by_run`: within a
    priority, the oldest run's jobs first (a job with no run before any run's), so runs end in the order they were
    made: an experiment's workers claim so, and a study stopped midway has whole seeds rather than every run
    half-trained. `processes`: the processes the worker launches a job on (one per GPU it owns, one without a GPU):
    a job planned for another count is left to a worker of that many (`planned_elsewhere` names those); `served`:
    those it launches a stage in vLLM's server mode on (its GPUs less its server's; None: `processes`). Every filter
    is keyword-only and narrows the claim's one query; a new one is another keyword.
    """
    now = db_now(session)
    where = _claimable(gpu=gpu, run_id=run_id, kinds=kinds)
    if processes is not None:
        where.append(_launches(processes, served))
    oldest = (
        select(Job.id)
        .where(*where)
        .order_by(Job.priority.desc(), *([func.coalesce(Job.run_id, 0)] if by_run else []), Job.id)
        .limit(1)
        .with_for_update(skip_locked=True)  # PostgreSQL; SQLite renders no locking clause
        .scalar_subquery()
    )
    claimed = session.exec(
        _jobs(Job.id == oldest, Job.status == JobStatus.QUEUED)
        .values(
            status=JobStatus.RUNNING,
            worker=worker_id,
            started_at=now,
            heartbeat_at=now,
            attempts=Job.attempts + 1,
        )
        .returning(Job.id)
    ).scalar_one_or_none()
    session.commit()
    return None if claimed is None else _reload(session, claimed)


def planned_elsewhere(session: Session, processes: int, *, gpu: bool = True, run_id: int | None = None,
                      kinds: Collection[str] | None = None, served: int | None = None) -> list[Job]:
    """The queued jobs that a worker launching `processes` processes (`served` in vLLM's server mode) would
    otherwise claim (the same filters as `claim`) but leaves, because they were planned for another count of
    processes; oldest first."""
    where = _claimable(gpu=gpu, run_id=run_id, kinds=kinds)
    return list(session.exec(select(Job).where(*where, not_(_launches(processes, served))).order_by(Job.id)))


def _launches(processes: int, served: int | None) -> Any:
    """A job that a worker launching `processes` processes (`served` for a stage in vLLM's server mode) runs as
    planned: any count where none was planned."""
    served = processes if served is None else served
    return or_(Job.processes.is_(None), and_(Job.vllm_server.is_(False), Job.processes == processes),
               and_(Job.vllm_server.is_(True), Job.processes == served))


def _claimable(*, gpu: bool, run_id: int | None, kinds: Collection[str] | None) -> list[Any]:
    where = [Job.status == JobStatus.QUEUED]
    if not gpu:
        where.append(Job.needs_gpu.is_(False))
    if run_id is not None:
        where.append(Job.run_id == run_id)
    if kinds is not None:
        where.append(Job.kind.in_(list(kinds)))
    return where


def heartbeat(
    session: Session,
    job_id: int,
    step: int,
    total: int | None,
    log_line: str | None = None,
    result: dict[str, Any] | None = None,
) -> bool:
    """Report progress (and optionally a log line, and a partial result such as the latest
    checkpoint, which `requeue` keeps for the next attempt); returns whether cancellation was requested.

    Raises:
        LostJob: the job is not running any more; the worker should stop working on it.
    """
    job = _reload(session, job_id)
    values: dict[str, Any] = {"step": step, "total": total, "heartbeat_at": db_now(session)}
    if log_line is not None:
        values["log_tail"] = _append(job.log_tail, log_line)
    if result is not None:
        values["result"] = result
    _update_running(session, job_id, values)
    return _reload(session, job_id).cancel_requested


def finish(session: Session, job_id: int, result: dict[str, Any] | None) -> Job:
    """End a running job as done with its result."""
    _update_running(session, job_id, {"status": JobStatus.DONE, "result": result, "finished_at": db_now(session)})
    return _reload(session, job_id)


def fail(session: Session, job_id: int, error: str, *, commit: bool = True) -> Job:
    """End a running job as failed with `error`; as cancelled when a cancel had been requested
    (a worker stops a cancelled job by raising, and both paths end here)."""
    job = _reload(session, job_id)
    status = JobStatus.CANCELLED if job.cancel_requested else JobStatus.FAILED
    _update_running(session, job_id, {"status": status, "error": error, "finished_at": db_now(session)},
                   commit=commit)
    return _reload(session, job_id)


def request_cancel(session: Session, job_id: int, *, commit: bool = True) -> Job:
    """Ask for a job to stop: a queued job is cancelled at once, a running one when its worker next
    checks; an ended job is left as it is."""
    now = db_now(session)
    session.exec(
        _jobs(Job.id == job_id, Job.status == JobStatus.QUEUED).values(
            status=JobStatus.CANCELLED, cancel_requested=True, finished_at=now
        )
    )
    session.exec(_jobs(Job.id == job_id, Job.status == JobStatus.RUNNING).values(cancel_requested=True))
    if commit:
        session.commit()
    return _reload(session, job_id)


def cancel_requested(session: Session, job_id: int) -> bool:
    """Whether someone asked this job to stop (a worker checks between steps)."""
    return _reload(session, job_id).cancel_requested


def reap_stale(session: Session, max_age_s: float,
               seen: dict[int, tuple[datetime, datetime]] | None = None) -> list[Job]:
    """Fail the running jobs whose worker has sent no heartbeat for `max_age_s` seconds, each at a second look.

    A worker that died (killed, machine lost) never ends its job; this is how the page finds out. But a live
    worker's heartbeat can look old too: its machine slept, its process was stopped a while, the database's clock
    stepped forward. So a stale job is only noted in `seen` (job id: the heartbeat it had, when it was seen; the
    caller keeps the dict from one call to the next) and failed by a later call that finds the same heartbeat at
    least `max_age_s / 2` later, two beats of a live worker's (it beats every `max_age_s / 4`). Without `seen`
    every stale job is failed at once. A heartbeat that lands between the read and the update keeps its job running.
    """
    now = db_now(session)
    cutoff = now - timedelta(seconds=max_age_s)
    stale = session.exec(select(Job).where(Job.status == JobStatus.RUNNING, Job.heartbeat_at < cutoff)).all()
    looked = {} if seen is None else dict(seen)
    if seen is not None:
        seen.clear()
    reaped = []
    for job in stale:
        first = looked.get(job.id)
        if seen is not None and (first is None or first[0] != job.heartbeat_at
                                 or now - first[1] < timedelta(seconds=max_age_s / 2)):
            seen[job.id] = first if first is not None and first[0] == job.heartbeat_at else (job.heartbeat_at, now)
            continue
        error = (
            f"worker stopped sending heartbeats (last at {job.heartbeat_at:%Y-%m-%d %H:%M:%S} UTC "
            f"from worker {job.worker!r})"
        )
        changed = session.exec(
            _jobs(Job.id == job.id, Job.status == JobStatus.RUNNING, Job.heartbeat_at < cutoff).values(
                status=JobStatus.FAILED, error=error, finished_at=now
            )
        ).rowcount
        if changed:
            reaped.append(job.id)
    session.commit()
    return [_reload(session, job_id) for job_id in reaped]


def hand_back(session: Session, job_id: int, why: str, *, commit: bool = True) -> Job | None:
    """Give a running job back to the queue because its worker is ending (a signal, Ctrl+C, Slurm's SIGTERM or
    time limit), not because the job failed: queued again in place (its id keeps its turn), this attempt not
    counted (`attempts` back by one, so no retry is spent on it), its recorded result (a checkpoint) kept for the
    next attempt, `why` in its log tail. A job whose cancel was asked ends cancelled instead. None when it was not
    running (it ended, or another process handed it back first)."""
    job = _reload(session, job_id)
    if job.status != JobStatus.RUNNING:
        return None
    if job.cancel_requested:
        _update_running(session, job_id, {"status": JobStatus.CANCELLED, "error": f"cancelled; {why}",
                                          "finished_at": db_now(session)}, commit=commit)
        return _reload(session, job_id)
    step = f"at step {job.step}" + (f" of {job.total}" if job.total else "")
    changed = session.exec(
        _jobs(Job.id == job_id, Job.status == JobStatus.RUNNING).values(
            status=JobStatus.QUEUED, worker=None, heartbeat_at=None, started_at=None, finished_at=None, error=None,
            attempts=Job.attempts - 1,
            log_tail=_append(job.log_tail, f"-- handed back {step}: {why} (the attempt is not counted)"),
        )
    ).rowcount
    if commit:
        session.commit()
    return _reload(session, job_id) if changed else None


def process_alive(pid: int) -> bool:
    """Whether process `pid` of this host still runs, for a job whose worker names it (`<host>:<pid>`): a zombie
    (dead, its exit not yet collected, as a worker killed with its parent can stay when nothing reaps orphans) is
    gone; another user's process of that number counts as running."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):  # no /proc (not Linux): the signal's answer stands
        return True
    return state != "Z"


def requeue(session: Session, job_id: int, *, commit: bool = True) -> Job:
    """Queue a failed or cancelled job again for a new attempt.

    Its payload and result stay as they are, so a worker that recorded a checkpoint in either
    resumes from it; the previous attempt's error moves into the log tail.

    Raises:
        ValueError: the job is queued, running or done.
    """
    job = _reload(session, job_id)
    if job.status not in (JobStatus.FAILED, JobStatus.CANCELLED):
        raise ValueError(f"job {job_id} is {job.status}; only a failed or cancelled job can be requeued")
    note = f"-- requeued after attempt {job.attempts} ended {job.status}: {job.error or 'no error given'}"
    try:
        changed = _requeue(session, job, note, commit)
    except IntegrityError:
        session.rollback()
        raise AlreadyQueued(session.exec(select(Job).where(
            Job.run_id == job.run_id, Job.kind == job.kind, Job.target == job.target,
            Job.status.in_(ACTIVE_JOB))).one()) from None
    if not changed:
        raise ValueError(f"job {job_id} changed while being requeued; look again")
    return _reload(session, job_id)


def _requeue(session: Session, job: Job, note: str, commit: bool) -> int:
    changed = session.exec(
        _jobs(Job.id == job.id, Job.status == job.status).values(
            status=JobStatus.QUEUED,
            worker=None,
            step=0,
            heartbeat_at=None,
            cancel_requested=False,
            error=None,
            started_at=None,
            finished_at=None,
            log_tail=_append(job.log_tail, note),
        )
    ).rowcount
    if commit:
        session.commit()
    return changed


def _jobs(*where: Any):
    # Rows are re-read after every change (`_reload`), so the session need not patch its objects.
    return update(Job).where(*where).execution_options(synchronize_session=False)


def _append(tail: str, text: str) -> str:
    lines = tail.splitlines() + text.splitlines()
    return "\n".join(lines[-LOG_TAIL_LINES:])


def _update_running(session: Session, job_id: int, values: dict[str, Any], commit: bool = True) -> None:
    changed = session.exec(_jobs(Job.id == job_id, Job.status == JobStatus.RUNNING).values(**values)).rowcount
    if commit:
        session.commit()
    if not changed:
        status = _reload(session, job_id).status
        raise LostJob(f"job {job_id} is {status}, not running: stop working on it")


def _reload(session: Session, job_id: int) -> Job:
    job = session.get(Job, job_id, populate_existing=True)
    if job is None:
        raise LookupError(f"no job {job_id}")
    return job
