"""The worker: a loop that claims queued jobs, runs their handlers, and reports on them; and the worker
process beside the web page.

The web page never trains in its own process; it queues a job (`storage.queue.enqueue`) and a worker
process picks it up. The contract (docs/loop.md) is a dict of handlers by job kind, each
`handler(engine, job, progress) -> dict`, where `progress` is `training.progress.Progress`: each call
writes a heartbeat (and a log line, and a partial result such as the latest checkpoint) and returns True
once someone asked the job to stop; the handler then raises `training.progress.Cancelled`.

Why a heartbeat thread as well: a handler can be silent for minutes (loading a 4B model, one long
generation batch), and a job whose heartbeat is older than `stale_s` looks like one whose worker died.
So while a handler runs, a background thread repeats its last reported step every `stale_s / 4`
seconds. A worker that is killed stops both; the next worker's poll reaps the job (`reap_stale`) as
failed with the heartbeat reason, and `requeue` gives it a new attempt that finds the previous attempt's
`result` (the checkpoint it recorded) on the job row.

A handler that raises fails its job and nothing else: the error is the traceback's last line (the full
traceback goes to the job's log tail and to stderr) and the worker goes on with the next job.

Several workers may share one PostgreSQL database (the claim skips rows another worker has locked); on
SQLite one worker at a time is enough (claims are still exclusive, but writes queue behind one lock).

Whether a worker is at work is read from the jobs table (`worker_status`): a worker has no row of its own,
so an idle one is invisible, and a running job whose heartbeat is fresh is the sign of a live one.
"""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from sqlmodel import select

from storage import queue
from storage.db import DatabaseUnusable, RunsRootUnusable, open_database, session, usable_runs_root
from storage.models import Job, JobKind, JobStatus, utcnow
from storage.queue import LostJob, stale_after_s
from training.progress import Cancelled, Progress

log = logging.getLogger("envlab.worker")

TRACEBACK_LINES = 40  # of a failed job's traceback, kept in its log tail
QUEUE_PATIENCE_S = 20  # a job queued longer than this with nobody running anything: the worker looks down


Handler = Callable[[Engine, Job, Progress], dict[str, Any] | None]
After = Callable[[Engine, Job], None]


class _Heartbeat(threading.Thread):
    """Repeats the job's last reported step every `interval` seconds while its handler runs.

    It also learns the cancel flag and whether the job was lost (reaped or ended elsewhere), so the
    next `progress` call can answer from them without waiting for its own round trip to fail.
    """

    def __init__(self, engine: Engine, job_id: int, interval: float):
        super().__init__(name=f"heartbeat-{job_id}", daemon=True)
        self.engine, self.job_id, self.interval = engine, job_id, interval
        self.step, self.total = 0, None
        self.cancelled = False
        self.lost: LostJob | None = None
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.interval):
            try:
                with session(self.engine) as s:
                    self.cancelled = queue.heartbeat(s, self.job_id, self.step, self.total) or self.cancelled
            except LostJob as err:
                self.lost = err
                return
            except Exception:  # a database hiccup: the next beat tries again
                log.exception("job %s: heartbeat failed", self.job_id)


def run_job(engine: Engine, job: Job, handler: Handler, *, stale_s: float | None = None) -> Job:
    """Run one claimed job to its end (done, failed or cancelled) and return its row as it ended."""
    stale_s = stale_after_s() if stale_s is None else stale_s
    beat = _Heartbeat(engine, job.id, interval=max(0.05, stale_s / 4))

    def progress(step: int, total: int | None, line: str | None = None,
                 result: dict[str, Any] | None = None) -> bool:
        if beat.lost is not None:
            raise beat.lost
        beat.step, beat.total = step, total
        with session(engine) as s:
            cancelled = queue.heartbeat(s, job.id, step, total, line, result)
        if line is not None:
            log.info("job %s: %s", job.id, line)
        beat.cancelled = beat.cancelled or cancelled
        return beat.cancelled

    beat.start()
    try:
        result = handler(engine, job, progress)
        with session(engine) as s:
            ended = queue.finish(s, job.id, result)
        log.info("job %s (%s) done", job.id, job.kind)
    except LostJob as err:
        log.warning("job %s: %s", job.id, err)
        with session(engine) as s:
            return s.get(Job, job.id, populate_existing=True)
    except Exception as err:
        ended = _fail_job(engine, job, err)
    except KeyboardInterrupt as err:  # a second SIGINT/SIGTERM: end the job as failed, then stop
        _fail_job(engine, job, err)
        raise
    finally:
        beat.done.set()
        beat.join()
    return ended


def _fail_job(engine: Engine, job: Job, err: BaseException) -> Job:
    cancelled = isinstance(err, Cancelled)
    error = JobStatus.CANCELLED.value if cancelled else traceback.format_exception_only(err)[-1].strip()
    if cancelled:
        log.info("job %s (%s) cancelled", job.id, job.kind)
        lines = None
    else:
        log.error("job %s (%s) failed", job.id, job.kind, exc_info=err)
        lines = "".join(traceback.format_exception(err)).splitlines()[-TRACEBACK_LINES:]
    try:
        with session(engine) as s:
            if lines:
                queue.heartbeat(s, job.id, job.step, job.total, "\n".join(lines))
            return queue.fail(s, job.id, error)
    except LostJob as lost:
        log.warning("job %s: %s", job.id, lost)
        with session(engine) as s:
            return s.get(Job, job.id, populate_existing=True)


def _unknown_kind(kinds: Sequence[str]) -> Handler:
    def handler(engine: Engine, job: Job, progress: Progress) -> dict[str, Any]:
        raise LookupError(f"no handler for job kind {job.kind!r} (this worker runs {', '.join(kinds)})")

    return handler


def run_worker(engine: Engine, handlers: dict[str, Handler], *, worker_id: str | None = None,
               poll_s: float = 1.0, stale_s: float | None = None, once: bool = False, after: After | None = None,
               stop: threading.Event | None = None, idle_exit_s: float | None = None) -> int:
    """Claim and run jobs until `stop` is set; returns how many jobs this worker ran.

    Each poll first reaps running jobs with no heartbeat for `stale_s` seconds (their worker died), then
    claims the oldest queued job. `after(engine, job)` runs after every job that ended (done, failed or
    cancelled; the lab queues what comes next there). With `once`, the worker returns when it finds the
    queue empty instead of waiting for more work (jobs that `after` queues still run first); with `idle_exit_s`,
    when it has found nothing to claim for that many seconds (a Slurm array task frees its allocation so).
    A job of a kind with no handler is claimed and failed with a message naming the kinds this worker runs.
    """
    worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}"
    stale_s = stale_after_s() if stale_s is None else stale_s
    stop = stop or threading.Event()
    ran = 0
    idle_since = time.monotonic()
    log.info("worker %s: polling every %gs for %s", worker_id, poll_s, ", ".join(handlers))
    while not stop.is_set():
        with session(engine) as s:
            for reaped in queue.reap_stale(s, stale_s):
                log.warning("job %s (%s) reaped: %s", reaped.id, reaped.kind, reaped.error)
            job = queue.claim(s, worker_id)
        if job is None:
            if once or (idle_exit_s is not None and time.monotonic() - idle_since >= idle_exit_s):
                break
            stop.wait(poll_s)
            continue
        log.info("job %s (%s) claimed, attempt %d: %s", job.id, job.kind, job.attempts, job.payload)
        handler = handlers.get(job.kind) or _unknown_kind(list(handlers))
        ended = run_job(engine, job, handler, stale_s=stale_s)
        ran += 1
        if after is not None:
            try:
                after(engine, ended)
            except Exception:
                log.exception("job %s: the after hook failed", job.id)
        idle_since = time.monotonic()
    log.info("worker %s: stopped after %d jobs", worker_id, ran)
    return ran


# ---------------------------------------------------------------- the `envlab worker` command


def handlers() -> dict[str, Handler]:
    """Every job kind a worker of the lab runs: training's (`stage`, `benchmark`, `probe`) and the engineer's
    (`propose`).

    Imported here rather than at the top so that starting a worker costs no torch import until a job needs it.
    """
    from lab.loop import run_propose_job
    from training import evaluate, probe, stage

    return {JobKind.STAGE: stage.run_stage_job, JobKind.BENCHMARK: evaluate.run_benchmark_job,
            JobKind.PROPOSE: run_propose_job, JobKind.PROBE: probe.run_probe_job}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The worker's options, for `envlab worker` (lab.cli) and `python -m lab.worker`."""
    parser.add_argument("--db", help="database path or URL (default: $ENVLAB_DB, else runs/envlab.db)")
    parser.add_argument("--worker-id", help="name in the jobs table (default: host:pid)")
    parser.add_argument("--poll", type=float, default=1.0, help="seconds between polls of an empty queue")
    parser.add_argument("--stale", type=float, default=None,
                        help="seconds without a heartbeat after which a running job counts as dead "
                             "(default: $ENVLAB_STALE_S, else 60; the page and resume use the same rule)")
    parser.add_argument("--once", action="store_true", help="exit when the queue is empty")
    parser.add_argument("--exit-when-idle", type=float, metavar="SECONDS", dest="idle_exit_s",
                        help="exit after SECONDS with nothing to claim (what a Slurm array task does)")


def visible_gpus() -> str:
    """The GPUs this process may use, as the scheduler that started it says (`CUDA_VISIBLE_DEVICES`: Slurm sets
    it to the GPUs it gave the job; torch then sees only those, numbered from 0); "" when none is named."""
    return os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()


def run_from_args(args: argparse.Namespace) -> int:
    """Migrate the database, then run a worker of every lab job kind until SIGINT/SIGTERM (the first stops
    after the current job, a second interrupts it) or, with `--once`, until the queue is empty. After each
    job of a run, `lab.loop.after_job` queues what comes next. Returns the exit status (0)."""
    from lab.loop import after_job

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        engine = open_database(args.db)
        usable_runs_root(engine)
    except (DatabaseUnusable, RunsRootUnusable) as err:
        print(f"envlab worker: {err}", file=sys.stderr)
        return 2
    log.info("GPUs visible to this worker: %s", visible_gpus() or "none")
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        log.info("signal %d: stopping after the current job (again to interrupt it)", signum)
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
    try:
        run_worker(engine, handlers(), worker_id=args.worker_id, poll_s=args.poll, stale_s=args.stale,
                   once=args.once, after=after_job, stop=stop, idle_exit_s=getattr(args, "idle_exit_s", None))
    finally:
        engine.dispose()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m lab.worker`: the same worker as `envlab worker`."""
    parser = argparse.ArgumentParser(prog="python -m lab.worker", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))


# ---------------------------------------------------------------- the worker beside the page


def ago(t: datetime) -> str:
    """How long ago `t` was, for people: seconds under two minutes, else minutes."""
    seconds = (utcnow() - t).total_seconds()
    return f"{seconds:.0f} s ago" if seconds < 120 else f"{seconds / 60:.0f} min ago"


class WorkerState(StrEnum):
    """Whether a worker is at work, as the page's badge shows it."""

    BUSY = "busy"  # a running job has a fresh heartbeat
    DOWN = "down"  # a running job's heartbeat is stale, or queued jobs wait too long with nothing running
    WAITING = "waiting"  # jobs are queued, for less than `QUEUE_PATIENCE_S` so far
    IDLE = "idle"  # nothing queued or running


def worker_status(engine: Engine) -> tuple[WorkerState, str]:
    """Whether a worker is picking up jobs, read from the jobs table: (state, one line for a person)."""
    now = utcnow()
    with session(engine) as s:
        running = list(s.exec(select(Job).where(Job.status == JobStatus.RUNNING).order_by(Job.id)))
        queued = list(s.exec(select(Job).where(Job.status == JobStatus.QUEUED).order_by(Job.id)))
    fresh = [j for j in running if j.heartbeat_at and now - j.heartbeat_at < timedelta(seconds=stale_after_s())]
    if fresh:
        j = fresh[0]
        step = f", step {j.step}/{j.total}" if j.total else ""
        more = f"; {len(queued)} queued" if queued else ""
        return WorkerState.BUSY, f"Worker busy: {j.kind} job {j.id}{step} (heartbeat {ago(j.heartbeat_at)}){more}."
    if running:
        j = running[0]
        return WorkerState.DOWN, (f"Job {j.id} ({j.kind}) has sent no heartbeat since {ago(j.heartbeat_at)}: its "
                                  f"worker ({j.worker}) seems to be down. Start one with `envlab worker`; it fails the "
                                  "stale job, and the Train tab can queue it again.")
    if queued:
        waited = (now - queued[0].created_at).total_seconds()
        if waited > QUEUE_PATIENCE_S:
            return WorkerState.DOWN, (f"{len(queued)} job(s) queued, the oldest for {waited:.0f} s, and no worker "
                                      "has taken one: no worker seems to be running. Start one with `envlab worker`.")
        return WorkerState.WAITING, f"{len(queued)} job(s) queued, waiting for a worker."
    return WorkerState.IDLE, "Worker idle: no jobs queued."


def worker_busy(engine: Engine) -> bool:
    return worker_status(engine)[0] == WorkerState.BUSY


def _death_signal() -> Callable[[], None] | None:
    """What the child runs before it starts on Linux: ask the kernel to SIGKILL it when its parent dies, even
    by SIGKILL (no atexit runs then). Resolved here, in the parent, so the forked child imports nothing (an
    import lock another thread held at the fork would stay held). None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    return lambda: prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


def start_worker(db: str | None, *, options: Sequence[str] = (), die_with_parent: bool = False,
                 log: Path | None = None, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`envlab worker [options]` as a child process on the same database; it stops when this process stops
    (with `die_with_parent`, also when this process is killed). Its log goes to `log` when given; `env` adds
    variables to this process's environment for it."""
    env = {**os.environ, **(env or {})}
    if db:
        env["ENVLAB_DB"] = db
    out = log.open("a") if log is not None else None
    proc = subprocess.Popen([sys.executable, "-m", "lab.cli", "worker", *options], env=env,  # same working directory
                            stdout=out, stderr=subprocess.STDOUT if out else None,
                            preexec_fn=_death_signal() if die_with_parent else None)
    if out is not None:
        out.close()  # the child holds its own copy

    def stop() -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()

    atexit.register(stop)
    return proc


if __name__ == "__main__":
    sys.exit(main())
