"""A job that loads a model, run in a process of its own: `python -m lab.jobs.child JOB_ID module:function`, or
the same under `accelerate launch --num_processes N` where its worker owns N GPUs (`lab.jobs.worker.run_child`).

Why a process per job: a model's memory (a GPU's above all: CUDA caches, a vLLM engine, NCCL groups) is given
back whole only when the process that held it ends, and a job that hangs or leaks is ended with its process
group. The child reports through the same rows as a job run in the worker (`lab.jobs.worker.run_job`: progress, log
lines, heartbeats, its end), so the page cannot tell the difference; its worker only watches it, ends its
process group on Cancel, and fails the job with the child's last lines of stderr when the child dies without
ending it.

Under `accelerate launch` only the main process (`RANK` 0) writes rows; a stage's other processes train with it
(as `python -m training.stage` does), and any other job runs on the main process alone.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence

from sqlmodel import select

from storage.db import make_engine, session
from storage.models import Job, JobKind, JobStatus
from storage.payloads import StagePayload

log = logging.getLogger("envlab.child")


def _other_rank(engine, job: Job) -> None:
    """What a process other than the main one does: train with it, for a stage not trained already."""
    if job.kind != JobKind.STAGE:
        return
    payload = StagePayload.of(job)
    if payload.stage_index == 0:  # stage 0 is evaluated, never trained
        return
    from training.policy import local_device
    from training.stage import stage_args, start_policy, train

    args = stage_args(engine, payload.run_id, payload.stage_index)
    if args.adoptable_marker() is None:
        from lab.jobs.worker import ENDING
        from training.progress import Cancelled

        try:  # its vote to stop is its own signal (`ENDING`); the main process's counts the job's rows too
            train(engine, args, start_policy(args, local_device()), lambda *a, **k: ENDING.is_set())
        except Cancelled:  # stopped with the main process, at the same step, after the checkpoint all saved
            return


def _die_with_launcher() -> None:
    """Under `accelerate launch` of several processes each rank runs in a session of its own (torchrun's), out of
    reach of a signal to its launcher's process group: it asks the kernel to end it when its launcher dies, so that
    no rank trains on once its worker ended the launch."""
    if not sys.platform.startswith("linux") or "LOCAL_RANK" not in os.environ:
        return
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    if os.getppid() == 1:  # the launcher died before the request was made
        os._exit(1)


def main(argv: Sequence[str] | None = None) -> int:
    """Run job JOB_ID (claimed by the worker that started this process) with its handler; 0 when it ended
    done, 1 when it ended otherwise (its row says how)."""
    from lab.jobs.worker import (  # the worker's runner: heartbeats, lines, its end
        DB_SETTING,
        run_job,
        stop_gracefully_on_sigterm,
        target_function,
    )

    parser = argparse.ArgumentParser(prog="python -m lab.jobs.child", description=main.__doc__.splitlines()[0])
    parser.add_argument("job", type=int)
    parser.add_argument("target", help="the handler, module:function")
    parser.add_argument("--stale", type=float, default=None, help="the worker's --stale")
    opts = parser.parse_args(argv)
    # The output goes to a pipe its worker reads. A worker killed without a word (SIGKILL, the OOM killer, a lost
    # Slurm task) closes it: the next write ends this process at once, as SIGPIPE ends a plain Unix program,
    # instead of raising BrokenPipeError in the middle of the job, which would end the job failed for a cause
    # that is not the job's. The job stays running, and is handed back when its worker is seen dead.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    _die_with_launcher()
    # A SIGTERM (its worker ending, Slurm stopping the task) stops the job at its next step: a stage saves its TRL
    # checkpoint, and the job goes back to the queue for the next attempt to resume from it (a second: at once).
    stop_gracefully_on_sigterm()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    engine = make_engine(os.environ.get(DB_SETTING))
    try:
        with session(engine) as s:
            job = s.exec(select(Job).where(Job.id == opts.job)).one()
        if int(os.environ.get("RANK", "0")) != 0:
            _other_rank(engine, job)
            return 0
        if job.status != JobStatus.RUNNING:
            log.warning("job %s is %s, not running: nothing to do", job.id, job.status)
            return 1
        ended = run_job(engine, job, target_function(opts.target), stale_s=opts.stale)
        return 0 if ended.status == JobStatus.DONE else 1
    finally:
        engine.dispose()


if __name__ == "__main__":
    sys.exit(main())
