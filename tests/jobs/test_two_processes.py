"""A stage on two processes under `accelerate launch` (gloo on the CPU, standing in for two GPUs): a stop reaches
every rank, all of them stop at the same step and save its checkpoint, the job goes back to the queue, and no rank is
left alive."""

from __future__ import annotations

import threading
import time

from sqlmodel import select

from envsim.config import EnvConfig
from lab.jobs import worker
from lab.jobs.worker import InChild, handlers, run_child, stop_children
from lab.loop import create_run
from storage import queue
from storage.db import run_folder, session
from storage.models import Job, JobStatus, Run, Stage, StageStatus
from storage.settings import RunSettings
from tests.processes import alive

CONFIG = EnvConfig.default(sizes=(3, 4), num_instances=32)


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


def test_a_stop_reaches_every_rank_of_a_two_process_stage_which_saves_and_leaves_nonealive(empty_lab, monkeypatch):
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
        assert len(ranks) == 2 and all(map(alive, ranks))
        assert stop_children("the worker is ending") == [job.id]
        watcher.join(timeout=120)
    finally:
        worker.ENDING.clear()
    assert not watcher.is_alive()
    assert not alive(launcher) and not any(map(alive, ranks))  # no rank trains on
    back = ended[0]
    assert (back.status, back.attempts, back.worker) == (JobStatus.QUEUED, 0, None)
    checkpoint = f"checkpoint-{back.step}"
    assert back.result["checkpoint"].endswith(f"/stage-1/trl/{checkpoint}")  # saved at the step all ranks stopped
    with session(empty_lab) as s:
        folder = run_folder(empty_lab, s.exec(select(Run)).one().uuid) / "stage-1" / "trl" / checkpoint
    assert (folder / "trainer_state.json").is_file()
    assert f"-- handed back at step {back.step} of 100: its worker is ending" in back.log_tail


def test_two_launches_of_two_processes_run_on_one_node_at_once_each_meeting_at_a_port_of_its_own(empty_lab, tmp_path):
    """Two workers of two "GPUs" on one node (two Slurm tasks, two `envlab worker --gpus`): each launch's ranks meet
    at a port of this host's that its launcher listens on (`--main_process_port`, free when it starts), so the two
    run at the same time; at accelerate's default, 29500 for every launch, the second could not listen there."""
    ports = [tmp_path / f"port-{k}" for k in range(2)]
    with session(empty_lab) as s:
        jobs = [queue.enqueue(s, "probe", {"port": str(port), "ports": list(map(str, ports))}) for port in ports]
        assert [queue.claim(s, f"worker-{k}", processes=2).id for k in range(2)] == [job.id for job in jobs]
    ended: dict[int, Job] = {}
    launches = [threading.Thread(target=lambda job=job: ended.setdefault(job.id, run_child(
        empty_lab, job, InChild("tests.child_jobs:meets"), gpus=["0", "1"], poll_s=0.2))) for job in jobs]
    for launch in launches:
        launch.start()
    for launch in launches:
        launch.join(timeout=300)
    assert [(ended[job.id].status, ended[job.id].error) for job in jobs] == [(JobStatus.DONE, None)] * 2
    met = [ended[job.id].result["port"] for job in jobs]
    assert met == [int(port.read_text()) for port in ports] and met[0] != met[1] and 29500 not in met
