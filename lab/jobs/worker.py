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
traceback goes to the job's log tail and to stderr) and the worker goes on with the next job. One that meets a full
disk is not failed: its job goes back to the queue, uncounted (`_back_from_full_disk`), and a full disk under the
database never ends the worker (docs/worker.md, "Faults").

Several workers may share one PostgreSQL database (the claim skips rows another worker has locked); on
SQLite one worker at a time is enough (claims are still exclusive, but writes queue behind one lock).

Whether a worker is at work is read from the jobs table (`worker_status`): a worker has no row of its own,
so an idle one is invisible, and a running job whose heartbeat is fresh is the sign of a live one.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import importlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from sqlmodel import select

from lab.jobs import zygote
from storage import queue
from storage.db import DB_SETTING as DATABASE_SETTING
from storage.db import DatabaseDamaged, DatabaseUnusable, RunsRootUnusable, open_database, session, usable_runs_root
from storage.models import Job, JobKind, JobStatus, utcnow
from storage.payloads import StagePayload
from storage.queue import LostJob, db_now, stale_after_s
from training import vllm
from training.progress import Cancelled, Progress

log = logging.getLogger("envlab.worker")

TRACEBACK_LINES = 40  # of a failed job's traceback, kept in its log tail
NICE = 10  # how much `envlab worker` lowers its CPU priority by default: the page beside it answers first
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
            except Exception as err:  # a database hiccup, a full disk: the next beat tries again
                if full_disk(err):
                    log.warning("job %s: no heartbeat written: %s", self.job_id, err)
                else:
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
        return beat.cancelled or ENDING.is_set()

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
        ended = _ended_by(engine, job, err)
    except KeyboardInterrupt:  # a second SIGINT/SIGTERM: hand the job back as it is, then stop
        _handed_back(engine, job)
        raise
    finally:
        beat.done.set()
        beat.join()
    return ended


FULL_DISK_WAIT_S = 30.0  # how often a write a full disk refused is tried again; a worker's wait before its next claim
_FULL_DISK_WORDS = ("No space left on device", "Disk quota exceeded", "database or disk is full")


def full_disk(err: BaseException) -> bool:
    """Whether `err`, or an error it was raised from, is a full disk: an OSError of ENOSPC or EDQUOT (the
    database's own, `storage.db.DatabaseFull`, included), or a library's error that says so in words (torch's
    writer and others wrap the OSError in a RuntimeError)."""
    seen: BaseException | None = err
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(words in str(seen) for words in _FULL_DISK_WORDS):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _ended_by(engine: Engine, job: Job, err: Exception) -> Job:
    """End a job whose handler raised `err`: failed, cancelled, or handed back where this process is ending or the
    disk is full (`_back_from_full_disk`), also where the disk fills while its failure is written."""
    try:
        if not full_disk(err):
            if ENDING.is_set() and isinstance(err, Cancelled):
                return _handed_back(engine, job)
            return _fail_job(engine, job, err)
    except OSError as written:
        if not full_disk(written):
            raise
        err = written
    return _back_from_full_disk(engine, job, err)


def _back_from_full_disk(engine: Engine, job: Job, err: BaseException) -> Job:
    """A job that met a full disk (a checkpoint, an episode, a heartbeat written) goes back to the queue, not
    failed: what it wrote before is kept (a stage resumes from its last checkpoint) and the attempt is not counted.
    While the disk stays full even that write can fail (the database is on it): it is tried again every
    `FULL_DISK_WAIT_S`, said once in the log, until it is written or this process is ending, when the job is left
    running for the next worker on this host to hand back (`hand_back_orphans`). Its row as it is then."""
    why = f"the disk is full ({err})"
    said = False
    while True:
        try:
            with session(engine) as s:
                if queue.hand_back(s, job.id, why) is not None:
                    log.warning("job %s (%s) handed back to the queue: %s", job.id, job.kind, why)
                return s.get(Job, job.id, populate_existing=True)
        except OSError as again:
            if not full_disk(again):
                raise
            if not said:
                log.warning("job %s: %s; handing it back is tried again every %g s", job.id, again, FULL_DISK_WAIT_S)
                said = True
        if ENDING.wait(FULL_DISK_WAIT_S):
            log.warning("job %s stays running: the disk is still full; the next worker on this host hands it back",
                        job.id)
            return job


def _handed_back(engine: Engine, job: Job) -> Job:
    """Give a job this ending process ran back to the queue (`storage.queue.hand_back`); its row as it is now."""
    with session(engine) as s:
        back = queue.hand_back(s, job.id, _ending_why[0])
        if back is not None:
            log.info("job %s (%s) handed back to the queue at step %s: %s", job.id, job.kind, job_step(back),
                     _ending_why[0])
        return s.get(Job, job.id, populate_existing=True)


def job_step(job: Job) -> str:
    return f"{job.step}" + (f"/{job.total}" if job.total else "")


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


# ---------------------------------------------------------------- a job in a process of its own

CHILD_TAIL_LINES = 40  # of a dead child's stderr, kept in its job's log tail
CANCEL_GRACE_S = 10.0  # a cancelled child's time to stop by itself (a stage saves its checkpoint) before SIGTERM
KILL_GRACE_S = 5.0  # then SIGTERM's (stop and save), before SIGTERM again (stop now) and SIGKILL
HAND_BACK_GRACE_S = 20.0  # an ending worker's child's time to save and hand its job back (Slurm's KillWait: 30 s)
ENDING = threading.Event()
"""Set when this process is ending (a signal, Ctrl+C, Slurm's SIGTERM): the job it runs stops at its next step,
saving what it has (a stage its TRL checkpoint), and is handed back to the queue (`storage.queue.hand_back`: queued
again, the attempt not counted), never failed for it. `end_process` sets it."""
_ending_why = ["this process is ending"]


def end_process(why: str) -> None:
    """Hand the running job back and stop (`ENDING`), saying `why` in its log."""
    _ending_why[0] = why
    ENDING.set()


HAND_BACK_SIGNAL = signal.SIGUSR1  # what an ending worker sends its child: stop at the next step, save, hand back


def stop_gracefully_on_sigterm() -> None:
    """A child's signals: `HAND_BACK_SIGNAL` (its worker is ending) and a first SIGTERM (Slurm stopping the task,
    a cancel's escalation) stop the job at its next step, which saves and hands it back; a second SIGTERM ends the
    process at once."""
    def on_term(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        end_process("its process got SIGTERM (its worker or the scheduler is stopping it)")

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(HAND_BACK_SIGNAL, lambda signum, frame: end_process("its worker is ending"))
DB_SETTING = "ENVLAB_CHILD_DB"  # the worker's database URL, password included: in the environment, not argv


def target_function(target: str) -> Handler:
    """The handler `module:function` names (e.g. `training.stage:run_stage_job`)."""
    module, _, name = target.partition(":")
    if not module or not name:
        raise ValueError(f"handler {target!r}: give module:function")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class InChild:
    """A handler that runs in a child process the worker starts (`lab.jobs.child`): every job that loads a model.

    `target` is the handler as `module:function`, imported in the child. `when(engine, job)`, where given,
    says whether this job loads a model at all (a proposal of the heuristic engineer does not): one that does
    not runs in the worker's own process, with no child's start-up to pay. `fsdp(engine, job, gpus)`, where given,
    says whether the job runs under FSDP on a worker of several GPUs, and why (`stage_needs_fsdp`).
    """

    target: str
    when: Callable[[Engine, Job], bool] | None = None
    fsdp: Callable[[Engine, Job, Sequence[str]], tuple[bool, str]] | None = None

    def function(self) -> Handler:
        return target_function(self.target)

    def sharded(self, engine: Engine, job: Job, gpus: Sequence[str]) -> bool:
        """Whether `job` runs under FSDP on `gpus`; a decision that fails keeps DDP (the stage's own estimate then
        says what would fit)."""
        if self.fsdp is None or len(gpus) <= 1:
            return False
        try:
            fsdp, line = self.fsdp(engine, job, gpus)
        except Exception:
            log.exception("job %s: could not tell whether it needs FSDP; it runs under DDP", job.id)
            return False
        log.info("job %s: %s", job.id, line)
        return fsdp


def _in_child(engine: Engine, job: Job, child: InChild) -> bool:
    """Whether `job` runs in a child process; a `when` that fails sends it there (its handler says what is wrong)."""
    try:
        return child.when is None or child.when(engine, job)
    except Exception:
        log.exception("job %s: could not tell whether it loads a model; it runs in a child process", job.id)
        return True


ACCELERATE_CONFIGS = Path(__file__).resolve().parents[2] / "assets" / "accelerate"  # the lab's own configs
FSDP_DECISION_TIMEOUT_S = 600  # for `stage_needs_fsdp`'s process: imports, a model's config, perhaps a conversion


def stage_needs_fsdp(engine: Engine, job: Job, gpus: Sequence[str]) -> tuple[bool, str]:
    """Whether a `stage` job runs under FSDP on `gpus`, and the line of its estimate that says why
    (`training.stage.needs_fsdp`), asked of `python -m training.stage --fsdp-on N` in a process of its own on those
    GPUs, so that the worker itself never imports torch or opens a CUDA context."""
    payload = StagePayload.of(job)
    command = [sys.executable, "-m", "training.stage", "--run", str(payload.run_id),
               "--stage", str(payload.stage_index), "--fsdp-on", str(len(gpus))]
    env = {**child_env(engine, gpus), DATABASE_SETTING: engine.url.render_as_string(hide_password=False)}
    done = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=FSDP_DECISION_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[1:])} {_ended_how(done.returncode)}: "
                           f"{(done.stderr.strip().splitlines() or [''])[-1]}")
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    return bool(answer["fsdp"]), str(answer["line"])


def child_command(job: Job, child: InChild, gpus: Sequence[str], stale_s: float | None = None,
                  fsdp: bool = False) -> list[str]:
    """The child's command line: `accelerate launch --config_file <the lab's> [--multi_gpu] --num_processes N -m
    lab.jobs.child ...` where the worker owns N GPUs (the lab's own config, `assets/accelerate/`, so a
    default_config.yaml of the user's never changes how a stage runs: one-gpu.yaml, multi-gpu.yaml for DDP, and
    fsdp.yaml where `fsdp` and N > 1, `InChild.sharded`), a plain `python -m lab.jobs.child ...` otherwise.

    Several processes meet at a free port of this host's (`--main_process_port`): accelerate's default, 29500, is
    every launch's, so two multi-GPU stages on one node (two workers, two Slurm tasks) would collide there."""
    args = [str(job.id), child.target] + ([] if stale_s is None else ["--stale", str(stale_s)])
    if not gpus:
        return [sys.executable, "-m", "lab.jobs.child", *args]
    config, multi = ("one-gpu.yaml", []) if len(gpus) == 1 else ("fsdp.yaml", []) if fsdp \
        else ("multi-gpu.yaml", ["--multi_gpu"])
    port = ["--main_process_port", str(vllm.free_port())] if len(gpus) > 1 else []
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ACCELERATE_CONFIGS / config),
            *multi, "--num_processes", str(len(gpus)), "--num_machines", "1", *port, "--mixed_precision", "no",
            "--dynamo_backend", "no", "-m", "lab.jobs.child", *args]


def child_env(engine: Engine, gpus: Sequence[str]) -> dict[str, str]:
    """The child's environment: the worker's, its database, the worker's GPUs (none: no GPU is visible), Trackio's
    folder (`training.trackers`) and no model hub unless downloads are allowed (`training.policy.downloads_allowed`)."""
    from training import trackers
    from training.resolve import offline_env

    env = {**os.environ, DB_SETTING: engine.url.render_as_string(hide_password=False),
           "CUDA_VISIBLE_DEVICES": ",".join(gpus), "PYTHONUNBUFFERED": "1"}
    return {**env, **trackers.child_env(engine), **offline_env()}


def warm_children(engine: Engine, gpus: Sequence[str] = ()) -> None:
    """Start the zygote that this process's CPU children fork from (`lab.jobs.zygote.warm`) now, before this
    process's own imports, so that the two overlap; nothing where children start cold or on GPUs."""
    env = child_env(engine, gpus)
    if not gpus and zygote.enabled(env):
        with contextlib.suppress(OSError):  # `spawn` tries again, and starts the child cold if it cannot
            zygote.warm(env)


def _kill_group(proc: subprocess.Popen, grace_s: float = KILL_GRACE_S) -> None:
    """End the child's whole process group (its own children too): SIGTERM (a child stops at its next step and
    saves), SIGTERM again after `grace_s` (at once), then SIGKILL."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGTERM, 1.0), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        if wait_s is not None:
            try:
                proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                continue
    proc.wait()


_CHILDREN: dict[int, tuple[subprocess.Popen | zygote.Forked, bool]] = {}  # what `run_child` watches, by job id:
# each child, and whether it is an `accelerate launch`


def _job_processes(launcher: int) -> list[int]:
    """The processes under `launcher` that run the job (`lab.jobs.child`: one per rank), found in /proc: torchrun
    starts each rank in a session of its own, where a signal to the launcher's group does not reach it."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parents[int(entry.name)] = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
    found, frontier = [], [launcher]
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier]
        for pid in children:
            with contextlib.suppress(OSError):
                if b"lab.jobs.child" in (Path("/proc") / str(pid) / "cmdline").read_bytes():
                    found.append(pid)
        frontier = children
    return sorted(found)


def _ask_to_hand_back(proc: subprocess.Popen | zygote.Forked, launched: bool) -> None:
    """`HAND_BACK_SIGNAL` to the processes that run the job: the child itself, or under `accelerate launch` each of
    its ranks, never the launcher (accelerate's one-process launcher and torchrun would die of it, or end the ranks
    before they save)."""
    for pid in _job_processes(proc.pid) if launched else [proc.pid]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, HAND_BACK_SIGNAL)


def stop_children(why: str, grace_s: float = HAND_BACK_GRACE_S, poll_s: float = 0.1) -> list[int]:
    """Stop the children this process runs and wait until they have ended: each is asked to hand its job back
    (`HAND_BACK_SIGNAL`: it stops at its next step, saves, a stage its checkpoint, and queues the job again itself)
    and has `grace_s` to do so before its process group is ended. Returns the ids of their jobs.

    For a caller that must not go on while a child still trains, and that runs where `run_child`'s own loop cannot
    notice `ENDING` (a signal handler in the thread that runs that loop: Slurm's checkpoint hook, after which the
    task is requeued and exits). It only polls: the loop it interrupted may hold the child's wait."""
    children = {job_id: proc for job_id, (proc, _) in _CHILDREN.items()}
    if children:
        end_process(why)
    for proc, launched in list(_CHILDREN.values()):
        _ask_to_hand_back(proc, launched)
    for sig, wait_s in ((None, grace_s), (signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, KILL_GRACE_S)):
        alive = [proc for proc in children.values() if proc.poll() is None]
        for proc in alive if sig is not None else ():
            log.info("child process group %d: %s", proc.pid, sig.name)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
        deadline = time.monotonic() + wait_s
        while any(proc.poll() is None for proc in alive) and time.monotonic() < deadline:
            time.sleep(poll_s)
    return list(children)


def _reap_group(pgid: int) -> None:
    """Whatever the child left running in its group (a data loader, a launcher's ranks) ends with it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _ended_how(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


def run_child(engine: Engine, job: Job, child: InChild, *, gpus: Sequence[str] = (), stale_s: float | None = None,
              poll_s: float = 0.2, cancel_grace_s: float = CANCEL_GRACE_S) -> Job:
    """Run one claimed job in a child process (`child_command`) and return its row as it ended.

    The child ends the job itself (done, failed, cancelled). The worker watches it: on Cancel (or the job lost
    to a reaper) it gives the child `cancel_grace_s` to stop by itself, then ends its process group; a child that
    dies without ending its job fails it, with its last lines of stderr in the log tail. The child's output goes
    to the worker's stderr as it comes, where the worker logs at INFO (`envlab worker`; `envlab run` does not).
    """
    fsdp = child.sharded(engine, job, gpus)
    command, env = child_command(job, child, gpus, stale_s, fsdp), child_env(engine, gpus)
    proc: subprocess.Popen | zygote.Forked | None = None
    if not gpus and zygote.enabled(env):  # forked from a process that has imported the training stack once
        try:
            proc = zygote.spawn(command[1:], env)
        except OSError as err:  # a zygote that could not start (it says why on stderr): this child starts cold
            log.warning("job %s: no zygote (%s); the child starts cold", job.id, err)
    if proc is None:
        proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_death_signal(),
                                text=True, errors="replace")
    log.info("job %s (%s): child process %d: %s", job.id, job.kind, proc.pid, child.target)
    tail: deque[str] = deque(maxlen=CHILD_TAIL_LINES)
    show = log.isEnabledFor(logging.INFO)  # `envlab worker` logs; `envlab run` into a file says one line a stage

    def relay() -> None:
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            if show:
                sys.stderr.write(line)

    reader = threading.Thread(target=relay, name=f"child-{job.id}", daemon=True)
    reader.start()
    stop_asked: float | None = None
    _CHILDREN[job.id] = (proc, bool(gpus))
    try:
        while proc.poll() is None:
            try:
                proc.wait(timeout=poll_s)
                break
            except subprocess.TimeoutExpired:
                pass
            with session(engine) as s:
                row = s.get(Job, job.id, populate_existing=True)
            if stop_asked is None and (row.cancel_requested or row.status != JobStatus.RUNNING):
                stop_asked = time.monotonic()
                log.info("job %s: %s; the child has %gs to stop", job.id,
                         "cancel requested" if row.cancel_requested else f"job is {row.status}", cancel_grace_s)
            elif stop_asked is None and ENDING.is_set():  # this worker is ending: the child saves and hands back
                stop_asked, cancel_grace_s = time.monotonic(), HAND_BACK_GRACE_S
                _ask_to_hand_back(proc, bool(gpus))
            if stop_asked is not None and time.monotonic() - stop_asked >= cancel_grace_s:
                log.info("job %s: ending child process group %d", job.id, proc.pid)
                _kill_group(proc)
    except BaseException:  # a second SIGINT/SIGTERM: the child goes, its job back to the queue
        _kill_group(proc)
        _handed_back(engine, job)
        raise
    finally:
        _CHILDREN.pop(job.id, None)
        _reap_group(proc.pid)
        reader.join(timeout=5)
    with session(engine) as s:
        ended = s.get(Job, job.id, populate_existing=True)
    if ended.status != JobStatus.RUNNING:
        return ended
    if ENDING.is_set():  # the child ended before it could hand its job back
        return _handed_back(engine, job)
    with session(engine) as s:
        ended = s.get(Job, job.id, populate_existing=True)
        how = _ended_how(proc.returncode)
        last = next((line for line in reversed(tail) if line.strip()), "")
        try:
            queue.heartbeat(s, job.id, ended.step, ended.total,
                            "\n".join([f"-- the job's process {how}; its last lines of stderr:", *tail]))
            return queue.fail(s, job.id, f"the job's process {how}" + (f": {last.strip()}" if last else ""))
        except LostJob as err:
            log.warning("job %s: %s", job.id, err)
            return s.get(Job, job.id, populate_existing=True)


def _unknown_kind(kinds: Sequence[str]) -> Handler:
    def handler(engine: Engine, job: Job, progress: Progress) -> dict[str, Any]:
        raise LookupError(f"no handler for job kind {job.kind!r} (this worker runs {', '.join(kinds)})")

    return handler


@dataclass(frozen=True)
class WorkerOptions:
    """How a worker claims and runs jobs (`run_worker`); the defaults poll for every kind of job until stopped."""

    worker_id: str | None = None  # its name in the jobs table (`Job.worker`); None: `host:pid`
    poll_s: float = 1.0  # seconds between polls of an empty queue
    stale_s: float | None = None  # seconds with no heartbeat before a running job counts as dead; None: stale_after_s()
    once: bool = False  # return when a poll finds nothing to claim (jobs that `after` queues still run first)
    after: After | None = None  # runs after each job that ended (done, failed, cancelled): the lab queues what is next
    stop: threading.Event | None = None  # set it to stop the worker after its current job
    gpus: Sequence[str] = ()  # the GPUs it owns: GPU jobs are claimed only with some, and an `InChild` runs on them
    run_id: int | None = None  # claim only this run's jobs
    kinds: Sequence[str] | None = None  # claim only jobs of these kinds (a lane: `probe` jobs beside a long stage)
    by_run: bool = False  # the oldest run's jobs first, so runs end in the order they were made (an experiment's)
    nice: int = 0  # lower this process's CPU priority by this much first (`os.nice`; its children inherit it)
    idle_exit_s: float | None = None  # return after this many seconds with nothing to claim (a Slurm task ends so)
    claimed: After | None = None  # runs on each claimed job before its handler (a Slurm task records itself on it)
    vllm_gpus: Sequence[str] = ()  # the GPUs its vLLM server (server mode) runs on; none: the last of `gpus`


def run_worker(engine: Engine, handlers: dict[str, Handler | InChild], options: WorkerOptions) -> int:
    """Claim and run jobs until `options.stop` is set (or, with `once` or `idle_exit_s`, until there is nothing to
    claim); returns how many jobs this worker ran.

    Each poll first reaps running jobs whose heartbeat is older than `stale_s` (their worker died), then claims the
    most urgent queued job this worker can run (`storage.queue.claim`: a person's before an experiment's, then the
    oldest). A handler that is an `InChild` runs in a child process on the worker's GPUs (`run_child`). A job of a
    kind with no handler is claimed and failed with a message naming the kinds this worker runs. A training stage
    planned for another count of processes than this worker launches (one per GPU it owns, one without a GPU) is
    left queued for a worker of that many, and the log says so once per job (`storage.queue.planned_elsewhere`).
    """
    if options.nice > 0:
        os.nice(options.nice)
    worker_id = options.worker_id or f"{socket.gethostname()}:{os.getpid()}"
    stale_s = stale_after_s() if options.stale_s is None else options.stale_s
    stop = options.stop or threading.Event()
    gpus, poll_s, idle_exit_s = options.gpus, options.poll_s, options.idle_exit_s
    ran = 0
    idle_since = time.monotonic()
    hand_back_orphans(engine)
    log.info("worker %s: polling every %gs for %s%s", worker_id, poll_s, ", ".join(handlers),
             f" on GPUs {','.join(gpus)}" if gpus else " (no GPU)")
    seen: dict[int, tuple[datetime, datetime]] = {}  # the reaper's first look at each stale job
    launches, left = launch_counts(gpus, options.vllm_gpus), set()  # its launches' processes; the jobs it leaves
    while not stop.is_set():
        try:
            with session(engine) as s:
                for reaped in queue.reap_stale(s, stale_s, seen):
                    log.warning("job %s (%s) reaped: %s", reaped.id, reaped.kind, reaped.error)
                job = queue.claim(s, worker_id, gpu=bool(gpus), run_id=options.run_id, kinds=options.kinds,
                                  by_run=options.by_run, processes=launches[0], served=launches[1])
                if job is None:
                    _say_left(s, launches, options, left)
        except OSError as err:  # the database's disk is full: nothing claimed, nothing lost; look again later
            if not full_disk(err):
                raise
            log.warning("worker %s: %s; claiming again in %g s", worker_id, err, FULL_DISK_WAIT_S)
            stop.wait(FULL_DISK_WAIT_S)
            continue
        if job is None:
            if options.once or (idle_exit_s is not None and time.monotonic() - idle_since >= idle_exit_s):
                break
            stop.wait(poll_s)
            continue
        log.info("job %s (%s) claimed, attempt %d: %s", job.id, job.kind, job.attempts, job.payload)
        if options.claimed is not None:
            options.claimed(engine, job)
        try:
            ended = _run_claimed(engine, job, handlers, gpus, stale_s, options.vllm_gpus)
        except OSError as err:  # the disk filled while the job's end was written
            if not full_disk(err):
                raise
            ended = _back_from_full_disk(engine, job, err)
        ran += 1
        if ended.status == JobStatus.QUEUED and not ENDING.is_set():  # handed back by its process: a full disk
            log.warning("job %s went back to the queue (the disk is full); claiming again in %g s", job.id,
                        FULL_DISK_WAIT_S)
            stop.wait(FULL_DISK_WAIT_S)
        if options.after is not None:
            try:
                options.after(engine, ended)
            except Exception:
                log.exception("job %s: the after hook failed", job.id)
        idle_since = time.monotonic()
    log.info("worker %s: stopped after %d jobs", worker_id, ran)
    return ran


def launch_counts(gpus: Sequence[str], vllm_gpus: Sequence[str] = ()) -> tuple[int, int]:
    """The processes a worker that owns `gpus` launches a stage on: one per GPU (one without a GPU), and for a stage
    in vLLM's server mode one per GPU left beside its server's (`training.vllm.split_for_server`). A worker that
    cannot serve (one GPU, no `vllm_gpus`) counts its GPUs for both, so it takes such a stage and fails it saying
    why, rather than leave it queued unsaid."""
    try:
        served = max(1, len(vllm.split_for_server(gpus, vllm_gpus)[0]))
    except vllm.VLLMError:
        served = max(1, len(gpus))
    return max(1, len(gpus)), served


def _say_left(s: Any, launches: tuple[int, int], options: WorkerOptions, said: set[int]) -> None:
    """One log line for each queued job this worker leaves because it was planned for another count of processes,
    the first time it finds it so (`said`: the ids it named); `launches`: `launch_counts`'."""
    for job in queue.planned_elsewhere(s, launches[0], gpu=bool(options.gpus), run_id=options.run_id,
                                       kinds=options.kinds, served=launches[1]):
        if job.id not in said:
            said.add(job.id)
            log.warning("job %s (%s, run %s stage %s) left queued: %s", job.id, job.kind, job.run_id, job.target,
                        left_why(job, launches[1] if job.vllm_server else launches[0]))


def left_why(job: Job, processes: int) -> str:
    """Why a worker that launches `processes` processes for `job` leaves it, planned for another count, in words."""
    if job.vllm_server:
        return (f"it is planned for {job.processes} processes beside the worker's vLLM server (its steps were counted "
                f"for them), and this worker launches {processes} beside its server; a worker of {job.processes} "
                f"GPUs besides its server's (--gpus, --vllm-gpus) trains it")
    return (f"it is planned for {job.processes} processes (its steps were counted for them), and this worker launches "
            f"{processes} ({'one per GPU it owns' if processes > 1 else 'it owns one GPU or none'}); a worker of "
            f"{job.processes} GPUs (--gpus) trains it")


def hand_back_orphans(engine: Engine) -> list[Job]:
    """Running jobs whose worker was a process of this host that is gone (killed, the machine restarted): handed back
    to the queue at once (`storage.queue.hand_back`), not failed after the heartbeat timeout. A worker is named
    `host:pid` (`WorkerOptions.worker_id`'s default); a job of a worker named otherwise is left to the reaper."""
    host = socket.gethostname()
    back = []
    with session(engine) as s:
        running = s.exec(select(Job).where(Job.status == JobStatus.RUNNING, Job.worker.like(f"{host}:%"))).all()
        for job in running:
            pid, worker = job.worker.rpartition(":")[2], job.worker
            why = f"its worker {worker} is gone from this host"
            if pid.isdigit() and not queue.process_alive(int(pid)) and queue.hand_back(s, job.id, why) is not None:
                log.info("job %s (%s) handed back to the queue: %s", job.id, job.kind, why)
                back.append(s.get(Job, job.id, populate_existing=True))
    return back


def _run_claimed(engine: Engine, job: Job, handlers: dict[str, Handler | InChild], gpus: Sequence[str],
                 stale_s: float, vllm_gpus: Sequence[str] = ()) -> Job:
    """Run one claimed job with its handler, in a child process where it loads a model; its row as it ended."""
    handler = handlers.get(job.kind) or _unknown_kind(list(handlers))
    if not (isinstance(handler, InChild) and _in_child(engine, job, handler)):
        return run_job(engine, job, vllm.with_server(handler.function() if isinstance(handler, InChild)
                                                     else handler, gpus, vllm_gpus), stale_s=stale_s)
    try:  # the worker's own vLLM server lives across stages; its children reach it by its URL
        url, gpus = vllm.serve_for_job(engine, job, gpus, vllm_gpus)  # a server on its GPUs, training on the rest
        if url is not None:
            os.environ[vllm.SERVER_URL_SETTING] = url
    except Exception as err:  # a server that cannot start fails the job with what it printed
        return _fail_job(engine, job, err)
    return run_child(engine, job, handler, gpus=gpus, stale_s=stale_s)


# ---------------------------------------------------------------- the `envlab worker` command


def handlers(in_child: bool = True) -> dict[str, Handler | InChild]:
    """Every job kind a worker of the lab runs: training's (`stage`, `benchmark`, `probe`) and the engineer's
    (`propose`). With `in_child` (the worker's way) every job that loads a model runs in a child process of its
    own (`InChild`): a stage, a benchmark, a probe, and a proposal whose engineer loads one
    (`lab.loop.propose_loads_model`); without, all of them run in this process (a test, a notebook).

    Imported here rather than at the top so that starting a worker costs no torch import until a job needs it.
    """
    if in_child:
        from lab.loop import propose_loads_model

        return {JobKind.STAGE: InChild("training.stage:run_stage_job", fsdp=stage_needs_fsdp),
                JobKind.BENCHMARK: InChild("training.evaluate:run_benchmark_job"),
                JobKind.PROPOSE: InChild("lab.loop:run_propose_job", when=propose_loads_model),
                JobKind.PROBE: InChild("training.probe:run_probe_job")}
    from lab.loop import run_propose_job
    from training import evaluate, probe, stage

    return {JobKind.STAGE: stage.run_stage_job, JobKind.BENCHMARK: evaluate.run_benchmark_job,
            JobKind.PROPOSE: run_propose_job, JobKind.PROBE: probe.run_probe_job}


def visible_gpus() -> list[str]:
    """The GPUs this process may use: `CUDA_VISIBLE_DEVICES` where it is set, else every GPU torch sees (none on a
    machine without an NVIDIA driver, found without importing torch)."""
    if (visible := os.environ.get("CUDA_VISIBLE_DEVICES")) is not None:
        return [g.strip() for g in visible.split(",") if g.strip() and g.strip() != "-1"]
    if not (Path("/dev/nvidia0").exists() or shutil.which("nvidia-smi")):
        return []
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def parse_gpus(text: str | None) -> list[str]:
    """`--gpus`: `0,1` (those GPUs), `none` (the CPU only), or nothing given (`visible_gpus()`)."""
    if text is None:
        return visible_gpus()
    if text.strip().lower() in ("", "none", "cpu"):
        return []
    gpus = [g.strip() for g in text.split(",")]
    if not all(g.isdigit() for g in gpus) or len(set(gpus)) != len(gpus):
        raise ValueError(f"--gpus {text!r}: give GPU numbers, each once, e.g. --gpus 0,1 (or none)")
    return gpus


def split_gpus(gpus: Sequence[str], workers: int, each: int = 1) -> list[list[str]]:
    """`gpus` shared out between `workers` workers in contiguous blocks of `each` (the processes their stages were
    planned for: a worker claims only stages of as many processes as it owns GPUs); a worker gets none where fewer
    than `each` are left, and GPUs beyond the workers' blocks stay idle (a block of another size would launch stages
    on other counts of processes than their steps were counted for)."""
    return [list(gpus[k * each:(k + 1) * each]) if (k + 1) * each <= len(gpus) else [] for k in range(workers)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The worker's options, for `envlab worker` (lab.cli) and `python -m lab.jobs.worker`."""
    parser.add_argument("--db", help="database path or URL (default: $ENVLAB_DB, else runs/envlab.db)")
    parser.add_argument("--worker-id", help="name in the jobs table (default: host:pid)")
    parser.add_argument("--poll", type=float, default=1.0, help="seconds between polls of an empty queue")
    parser.add_argument("--stale", type=float, default=None,
                        help="seconds without a heartbeat after which a running job counts as dead "
                             "(default: $ENVLAB_STALE_S, else 60; the page and resume use the same rule)")
    parser.add_argument("--once", action="store_true", help="exit when the queue is empty")
    parser.add_argument("--gpus", metavar="LIST",
                        help="the GPUs this worker owns, e.g. 0,1 (its jobs' processes run under accelerate launch "
                             "with one process per GPU), or none; default: every visible GPU")
    parser.add_argument("--vllm-gpus", metavar="LIST",
                        help="the GPUs of this worker's vLLM server, for runs in vLLM's server mode (training runs on "
                             "the rest of --gpus); default: the last of its GPUs")
    parser.add_argument("--in-process", action="store_true",
                        help="run every job in the worker's own process instead of a child process per job that "
                             "loads a model (debugging; the memory of a model is then never given back)")
    parser.add_argument("--kinds", nargs="+", choices=[str(k) for k in JobKind], metavar="KIND",
                        help="claim only jobs of these kinds (e.g. `--kinds probe`: a lane for Measure jobs beside "
                             "a worker busy with a long stage); default: every kind")
    parser.add_argument("--by-run", action="store_true",
                        help="claim the oldest run's jobs first, so runs end in the order they were made (an "
                             "experiment's workers do: a study stopped midway has whole seeds); default: the oldest "
                             "job first, so runs move together")
    parser.add_argument("--nice", type=int, default=NICE,
                        help=f"lower this worker's CPU priority by N (os.nice) so a page on the same machine stays "
                             f"quick while it trains; 0 keeps it (default: {NICE})")
    parser.add_argument("--exit-when-idle", type=float, metavar="SECONDS", dest="idle_exit_s",
                        help="exit after SECONDS with nothing to claim (what a Slurm array task does)")


def stop_on_signals() -> threading.Event:
    """A worker's SIGINT (Ctrl+C) and SIGTERM: the first hands the job in hand back to the queue (it stops at its
    next step and saves: `ENDING`) and stops the worker (the event returned: `WorkerOptions.stop`), in one log line;
    a second stops it at once (KeyboardInterrupt; the job still goes back, as it is)."""
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        name = signal.Signals(signum).name
        log.info("%s: handing the job in hand back to the queue and stopping (again to stop at once)", name)
        end_process(f"its worker got {name}")
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
    return stop


def run_from_args(args: argparse.Namespace) -> int:
    """Migrate the database, then run a worker of every lab job kind until SIGINT/SIGTERM (the first stops
    after the current job, a second interrupts it) or, with `--once`, until the queue is empty. After each
    job of a run, `lab.loop.after_job` queues what comes next. Returns the exit status (0; 2 for bad input)."""
    from lab.loop import after_job

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        gpus = parse_gpus(args.gpus)
        engine = open_database(args.db)
        usable_runs_root(engine)
    except (DatabaseUnusable, RunsRootUnusable, ValueError) as err:
        print(f"envlab worker: {err}", file=sys.stderr)
        return 2
    log.info("GPUs this worker owns: %s", ",".join(gpus) or "none")
    stop = stop_on_signals()
    try:
        options = WorkerOptions(worker_id=args.worker_id, poll_s=args.poll, stale_s=args.stale, once=args.once,
                                after=after_job, stop=stop, gpus=gpus, kinds=args.kinds, nice=args.nice,
                                by_run=getattr(args, "by_run", False),
                                idle_exit_s=getattr(args, "idle_exit_s", None),
                                vllm_gpus=parse_gpus(args.vllm_gpus) if getattr(args, "vllm_gpus", None) else ())
        run_worker(engine, handlers(in_child=not args.in_process), options)
    except KeyboardInterrupt:  # a second signal: the job in hand went back to the queue as it was (run_job)
        log.info("stopped at once")
    except DatabaseDamaged as err:  # one line, no traceback: no job can be claimed or ended on this file
        print(f"envlab worker: {err}", file=sys.stderr)
        return 2
    finally:
        engine.dispose()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m lab.jobs.worker`: the same worker as `envlab worker`."""
    parser = argparse.ArgumentParser(prog="python -m lab.jobs.worker", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))


# ---------------------------------------------------------------- the worker beside the page


def ago(t: datetime, now: datetime | None = None) -> str:
    """How long ago `t` was by `now` (default: this machine's clock), for people: seconds under two minutes, else
    minutes."""
    seconds = ((now or utcnow()) - t).total_seconds()
    return f"{seconds:.0f} s ago" if seconds < 120 else f"{seconds / 60:.0f} min ago"


class WorkerState(StrEnum):
    """Whether a worker is at work, as the page's badge shows it."""

    BUSY = "busy"  # a running job has a fresh heartbeat
    DOWN = "down"  # a running job's heartbeat is stale, or queued jobs wait too long with nothing running
    WAITING = "waiting"  # jobs are queued, for less than `QUEUE_PATIENCE_S` so far
    IDLE = "idle"  # nothing queued or running


WORKER_START_S = 120.0  # a worker a lab starts claims its first job within this (its imports come first)


def worker_status(engine: Engine, starting_since: float | None = None,
                  left_down: str | None = None) -> tuple[WorkerState, str]:
    """Whether a worker is picking up jobs, read from the jobs table: (state, one line for a person).
    `starting_since`: when (`time.monotonic()`) the caller started a worker of its own; for `WORKER_START_S` after,
    jobs queued long ago (handed back by a restart) wait for it rather than say that no worker runs. `left_down`:
    the line that says the caller's own worker kept dying and was not started again (`KeptWorker.down`): the state is
    down whatever the queue holds, unless a worker elsewhere is at work, whose line then says it too."""
    with session(engine) as s:
        now = db_now(s)  # the clock heartbeats are stamped by (`storage.queue`), whatever this machine's says
        running = list(s.exec(select(Job).where(Job.status == JobStatus.RUNNING).order_by(Job.id)))
        queued = list(s.exec(select(Job).where(Job.status == JobStatus.QUEUED).order_by(Job.id)))
    fresh = [j for j in running if j.heartbeat_at and now - j.heartbeat_at < timedelta(seconds=stale_after_s())]
    if fresh:
        j = fresh[0]
        step = f", step {j.step}/{j.total}" if j.total else ""
        more = f"; {len(queued)} queued" if queued else ""
        also = f" {_sentence(left_down)}" if left_down else ""
        return WorkerState.BUSY, (f"Worker busy: {j.kind} job {j.id}{step} (heartbeat {ago(j.heartbeat_at, now)})"
                                  f"{more}.{also}")
    if left_down:
        return WorkerState.DOWN, _sentence(left_down)
    if running:
        j = running[0]
        return WorkerState.DOWN, (f"Job {j.id} ({j.kind}) has sent no heartbeat since {ago(j.heartbeat_at, now)}: its "
                                  f"worker ({j.worker}) seems to be down. Start one with `envlab worker`; it fails the "
                                  "stale job, and the Train tab can queue it again.")
    if queued:
        waited = (now - queued[0].created_at).total_seconds()
        planned = next((j for j in queued if (j.processes or 1) > 1), None)
        also = (f" Job {planned.id} ({planned.kind}) is planned for {planned.processes} processes: only a worker of "
                f"{planned.processes} GPUs takes it (`envlab worker --gpus`)." if planned else "")
        if starting_since is not None and time.monotonic() - starting_since < WORKER_START_S:
            return WorkerState.WAITING, (f"{len(queued)} job(s) queued, waiting for the worker this lab started, "
                                         f"which is starting.{also}")
        if waited > QUEUE_PATIENCE_S:
            return WorkerState.DOWN, (f"{len(queued)} job(s) queued, the oldest for {waited:.0f} s, and no worker "
                                      "has taken one: no worker seems to be running. Start one with `envlab worker`."
                                      f"{also}")
        return WorkerState.WAITING, f"{len(queued)} job(s) queued, waiting for a worker.{also}"
    return WorkerState.IDLE, "Worker idle: no jobs queued."


def _sentence(line: str) -> str:
    return line[:1].upper() + line[1:] + ("" if line.endswith(".") else ".")


def worker_busy(engine: Engine) -> bool:
    return worker_status(engine)[0] == WorkerState.BUSY


def _death_signal() -> Callable[[], None] | None:
    """What the child runs before it starts on Linux: ask the kernel to SIGKILL it when its parent dies, even
    by SIGKILL (no atexit runs then), and ignore SIGUSR2. Resolved here, in the parent, so the forked child imports
    nothing (an import lock another thread held at the fork would stay held). None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def before_exec() -> None:
        prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
        # SIGUSR2 is Slurm's warning before a time limit or a preemption, sent to every process of the task: the
        # worker's to handle (it hands the job back and ends this child); ignored here, as across the exec
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)

    return before_exec


def beside_page_env(environ: Mapping[str, str] | None = None, cores: int | None = None) -> dict[str, str]:
    """What a worker started beside the page (`envlab serve`) adds to its environment: torch threads on every core
    but one (at least one; `OMP_NUM_THREADS`), so the page and the browser showing it keep a core while a stage
    trains. A lower CPU priority alone does not give them one on a small machine, and there the tiny policy trains
    faster on one thread than on two (docs/worker.md). An `OMP_NUM_THREADS` already set is left as it is."""
    environ = os.environ if environ is None else environ
    if "OMP_NUM_THREADS" in environ:
        return {}
    cores = len(os.sched_getaffinity(0)) if cores is None else cores
    return {"OMP_NUM_THREADS": str(max(1, cores - 1))}


STOP_WAIT_S = HAND_BACK_GRACE_S + KILL_GRACE_S + 5  # a stopped worker's time to hand its job back and exit


def start_worker(db: str | None, *, options: Sequence[str] = (), die_with_parent: bool = False,
                 own_group: bool = False, log: Path | None = None,
                 env: dict[str, str] | None = None) -> subprocess.Popen:
    """`envlab worker [options]` as a child process on the same database; it stops when this process stops
    (with `die_with_parent`, also when this process is killed). Its log goes to `log` when given; `env` adds
    variables to this process's environment for it.

    With `own_group` the worker is in a process group of its own, so a Ctrl+C at the terminal reaches this process
    only, and this process stops the worker with one SIGTERM as it exits: the job in hand is saved and handed back
    (`stop_on_signals`). Without it the terminal's SIGINT reaches the worker too, and the SIGTERM that follows is a
    second signal, which stops it at once and gives the job's process seconds, not `HAND_BACK_GRACE_S`, to save."""
    env = {**os.environ, **(env or {})}
    if db:
        env["ENVLAB_DB"] = db
    out = log.open("a") if log is not None else None
    proc = subprocess.Popen([sys.executable, "-m", "lab.cli", "worker", *options], env=env,  # same working directory
                            stdout=out, stderr=subprocess.STDOUT if out else None, start_new_session=own_group,
                            preexec_fn=_death_signal() if die_with_parent else None)
    if out is not None:
        out.close()  # the child holds its own copy

    def stop() -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()

    atexit.register(stop)
    return proc


RESTARTS = 3  # a kept worker that dies more often than this within RESTART_WINDOW_S is left down
RESTART_WINDOW_S = 300.0


class KeptWorker(threading.Thread):
    """A worker process beside the page (`start()`, e.g. `start_worker`), started again when it dies: killed (`kill
    -9`, the kernel's OOM killer) or crashed, it would leave the page with nothing that runs stage jobs while the
    badge read "idle". Each death and restart is one line on the command line; the job it held is handed back by the
    new one (`hand_back_orphans`). One that dies more than `RESTARTS` times within `RESTART_WINDOW_S` is left down,
    `down` saying so in one line (the page's badge shows it: `worker_status`). `started`: when (`time.monotonic()`)
    its latest process was started (`later`: its first process starts with `start()`, not when it is made: `envlab
    serve` starts its workers once the page serves). It stops watching as this process exits (before the workers are
    stopped)."""

    def __init__(self, start: Callable[[], subprocess.Popen], poll_s: float = 2.0, name: str = "the lab's worker",
                 later: bool = False):
        super().__init__(name="kept-worker", daemon=True)
        self.start_process, self.poll_s, self.what = start, poll_s, name
        self.proc: subprocess.Popen | None = None if later else start()
        self.started = time.monotonic()
        self.down: str | None = None
        self.stopping = threading.Event()
        atexit.register(self.stopping.set)  # runs before the workers' own stops (atexit runs last in, first out)

    def start(self) -> None:
        if self.proc is None:  # made `later`: its first process starts now
            self.proc = self.start_process()
            self.started = time.monotonic()
        super().start()

    def run(self) -> None:
        deaths: deque[float] = deque()
        while not self.stopping.wait(self.poll_s):
            code = self.proc.poll()
            if code is None or self.stopping.is_set():
                continue
            now = time.monotonic()
            deaths.append(now)
            while deaths and now - deaths[0] > RESTART_WINDOW_S:
                deaths.popleft()
            how = _ended_how(code)
            if len(deaths) > RESTARTS:
                self.down = (f"{self.what} (pid {self.proc.pid}) {how}; it died {len(deaths)} times in "
                             f"{RESTART_WINDOW_S / 60:.0f} min, so it is not started again: nothing here runs its "
                             "jobs; start one with `envlab worker`")
                print(self.down, file=sys.stderr, flush=True)
                return
            dead = self.proc.pid
            self.proc = self.start_process()
            self.started = time.monotonic()
            print(f"{self.what} (pid {dead}) {how}: started again (pid {self.proc.pid})", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
