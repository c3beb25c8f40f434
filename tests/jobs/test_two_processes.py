"""A stage on two processes under `accelerate launch` (gloo on the CPU, standing in for two GPUs): a stop reaches
every rank, all of them stop at the same step and save its checkpoint, the job goes back to the queue, and no rank is
left alive."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from sqlmodel import select

from envsim.config import EnvConfig
from lab.jobs import worker
from lab.jobs.worker import InChild, handlers, run_child, stop_children
from lab.loop import create_run
from storage import queue
from storage.db import run_folder, session
from storage.models import Job, JobStatus, Run, Stage, StageStatus
from storage.settings import RunSettings

CONFIG = EnvConfig.default(sizes=(3, 4), num_instances=32)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _stage_1_claimed(engine) -> Job:
    """A tiny run whose stage 0 is done (its policy the shipped one) and whose stage 1 job a worker claimed."""
    with session(engine) as s:
        run = create_run(s, name="r", config=CONFIG, settings=RunSettings(stages=1, grpo={"max_steps": 100}),
                         engineer="fixed")
        queue.request_cancel(s, 1)  # stage 0's job: its stage is done here
        stage = s.exec(select(Stage).where(Stage.run_id == run.id)).one()
        stage.status, stage.checkpoint = StageStatus.DONE, "tiny"
        s.add(Stage(run_id=run.id, index=1, config=stage.config, status=StageStatus.RUNNING))
        s.commit()
        job = queue.enqueue(s, "stage", {"run_id": run.id, "stage_index": 1}, run_id=run.id, target=1)
        assert queue.claim(s, "test-worker", gpu=True).id == job.id
        return job


def test_a_stop_reaches_every_rank_of_a_two_process_stage_which_saves_and_leaves_none_alive(empty_lab, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    job = _stage_1_claimed(empty_lab)
    ended: list[Job] = []
    # two "GPUs" on a machine without CUDA: `accelerate launch --multi_gpu --num_processes 2`, whose ranks find no
    # GPU and train on the CPU (the stage's `use_cpu`), meeting over gloo
    watcher = threading.Thread(target=lambda: ended.append(run_child(
        empty_lab, job, InChild(handlers()["stage"].target), gpus=["0", "1"], poll_s=0.2)))
    watcher.start()
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and watcher.is_alive():
            with session(empty_lab) as s:
                if (s.get(Job, job.id, populate_existing=True).step or 0) >= 2:
                    break
            time.sleep(0.5)
        launcher = worker._CHILDREN[job.id][0].pid
        ranks = worker._job_processes(launcher)
        assert len(ranks) == 2 and all(map(_alive, ranks))
        assert stop_children("the worker is ending") == [job.id]
        watcher.join(timeout=120)
    finally:
        worker.ENDING.clear()
    assert not watcher.is_alive()
    assert not _alive(launcher) and not any(map(_alive, ranks))  # no rank trains on
    back = ended[0]
    assert (back.status, back.attempts, back.worker) == (JobStatus.QUEUED, 0, None)
    checkpoint = f"checkpoint-{back.step}"
    assert back.result["checkpoint"].endswith(f"/stage-1/trl/{checkpoint}")  # saved at the step all ranks stopped
    with session(empty_lab) as s:
        folder = run_folder(empty_lab, s.exec(select(Run)).one().uuid) / "stage-1" / "trl" / checkpoint
    assert (folder / "trainer_state.json").is_file()
    assert f"-- handed back at step {back.step} of 100: its worker is ending" in back.log_tail
