"""A Slurm array task requeued by submitit's `checkpoint` hook (time limit or preemption) comes back with every
setting it was submitted with, `by_run` among them: an experiment's task claims the oldest run's jobs first again;
and the hook stops the job's child, which saves, before the task lets go of the job."""

from __future__ import annotations

import os
import pickle
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from lab.jobs.worker import InChild, WorkerOptions, run_worker
from lab.study.slurm import SlurmTask
from storage import queue
from storage.db import make_engine, session
from storage.models import Job
from tests.processes import FORK, alive


def test_a_requeued_task_keeps_every_setting_it_was_submitted_with(tmp_path: Path):
    pytest.importorskip("submitit")
    task = SlurmTask(db=str(tmp_path / "lab.db"), runs=str(tmp_path / "runs"), stale_s=60.0, idle_exit_s=5.0,
                     threads=2, poll_s=0.5, by_run=True)
    delayed = task.checkpoint()  # it held no job: nothing to hand back
    again = pickle.loads(pickle.dumps(delayed.function))  # as submitit stores it for the requeued task
    assert again == task and again.by_run is True and (delayed.args, delayed.kwargs) == ((), {})


def _task_at_its_time_limit(url: str, folder: str) -> None:
    """An array task as submitit runs one: its worker runs a probe job in a child process, and submitit's signal
    before the time limit calls the task's `checkpoint`, then requeues the task and exits (`sys.exit`). Writes
    whether the job's child was still alive when `checkpoint` returned."""
    task = SlurmTask(db=url, runs=folder, stale_s=60.0, idle_exit_s=600.0, poll_s=0.05)
    pid = Path(folder) / "pid"

    def at_time_limit(signum: int, frame: Any) -> None:
        task.checkpoint()
        (Path(folder) / "alive").write_text(str(alive(int(pid.read_text()))))
        sys.exit(-1)

    def claimed(engine: Any, job: Job) -> None:
        task._current = job.id

    signal.signal(signal.SIGUSR2, at_time_limit)
    run_worker(make_engine(url), {"probe": InChild("tests.child_jobs:patient")},
               WorkerOptions(poll_s=0.05, claimed=claimed, worker_id="slurm-task"))


def test_a_task_at_its_time_limit_stops_its_stage_which_saves_before_the_job_is_handed_back(empty_lab: Engine,
                                                                                             tmp_path: Path):
    """submitit requeues the task and exits once `checkpoint` returns: the job's child must have stopped by then,
    having saved at the step it reached and handed its job back itself; the job is queued, the attempt uncounted."""
    pytest.importorskip("submitit")
    saved = tmp_path / "saved"
    with session(empty_lab) as s:
        job_id = queue.enqueue(s, "probe", {"saved": str(saved), "pid": str(tmp_path / "pid")}).id
    url = empty_lab.url.render_as_string(hide_password=False)
    empty_lab.dispose()  # no pooled connection crosses the fork
    worker = FORK.Process(target=_task_at_its_time_limit, args=(url, str(tmp_path)))
    worker.start()
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            with session(empty_lab) as s:
                if s.get(Job, job_id, populate_existing=True).step >= 3:
                    break
            time.sleep(0.1)
        os.kill(worker.pid, signal.SIGUSR2)
        worker.join(timeout=90)
    finally:
        if worker.is_alive():
            worker.kill()
    with session(empty_lab) as s:
        back = s.get(Job, job_id, populate_existing=True)
    assert (tmp_path / "alive").read_text() == "False"  # the child had ended when the task let go of the job
    assert (back.status, back.attempts, back.worker) == ("queued", 0, None)
    assert saved.read_text() == f"saved at step {back.step}"  # it saved where it stopped, and that step is recorded
    assert f"-- handed back at step {back.step} of 1000: its worker is ending" in back.log_tail
