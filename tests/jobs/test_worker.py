"""The worker on SQLite and PostgreSQL: a killed worker's job is reaped and resumed from its checkpoint,
workers never share a job, cancel stops a running job, a failing handler fails only its job."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from sqlalchemy import Engine, text
from sqlmodel import select

from lab.jobs.worker import InChild, WorkerOptions, beside_page_env, run_worker, stop_on_signals, worker_status
from storage import queue
from storage.db import make_engine, session, upgrade
from storage.models import Job
from tests.processes import FORK, in_processes
from training.progress import Cancelled

# Handlers live at module level so forked worker processes run the same code.


def resumable(engine, job, progress) -> dict:
    """Records a checkpoint, then works silently for a long time; a later attempt reports where it resumed."""
    if job.result and "checkpoint" in job.result:
        progress(2, 2, f"resuming from {job.result['checkpoint']}")
        return {"resumed_from": job.result["checkpoint"], "attempt": job.attempts}
    progress(1, 2, "saved step 1", result={"checkpoint": "stage-1/trl/checkpoint-1"})
    time.sleep(120)  # a long silent step: only the heartbeat thread speaks
    return {"finished": True}


def noted(engine, job, progress) -> dict:
    progress(1, 1, f"pid {os.getpid()}")
    time.sleep(0.02)
    return {"pid": os.getpid()}


def patient(engine, job, progress) -> dict:
    step = 0
    while not progress(step, None):
        step += 1
        time.sleep(0.02)
    raise Cancelled


def broken(engine, job, progress) -> dict:
    progress(0, 3, "loading")
    raise ValueError(f"checkpoint for job {job.id} is unreadable")


def _job(engine: Engine, job_id: int) -> Job:
    with session(engine) as s:
        return s.get(Job, job_id, populate_existing=True)


def _wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _doomed_worker(url: str) -> None:
    run_worker(make_engine(url), {"stage": resumable}, WorkerOptions(worker_id="doomed", poll_s=0.02, stale_s=0.4))


def test_a_stage_planned_for_two_processes_is_left_by_a_cpu_worker_which_says_so_and_run_by_a_two_gpu_one(
        empty_lab: Engine, caplog):
    """`RunSettings.processes`: a run's training stages were counted for two processes, so a worker that launches
    one (no GPU) leaves them queued, saying why once, and a worker of two GPUs takes them. Stage 0 (evaluation) is
    anyone's."""
    from envsim.config import EnvConfig
    from lab.loop import _enqueue, create_run
    from storage.models import Stage, StageStatus
    from storage.payloads import StagePayload
    from storage.settings import RunSettings

    with session(empty_lab) as s:
        run = create_run(s, name="r", config=EnvConfig.default(sizes=(3, 4), num_instances=32),
                         settings=RunSettings(stages=1, processes=2), engineer="fixed")
        stage_0 = s.exec(select(Job)).one()
        s.exec(select(Stage)).one().status = StageStatus.DONE
        stage_1 = _enqueue(s, StagePayload(run_id=run.id, stage_index=1))
        s.commit()
        assert (stage_0.processes, stage_1.processes) == (None, 2)
    caplog.set_level("INFO", logger="envlab.worker")
    options = WorkerOptions(worker_id="cpu", once=True, poll_s=0.01)
    assert run_worker(empty_lab, {"stage": noted}, options) == 1  # stage 0, and nothing more
    assert run_worker(empty_lab, {"stage": noted}, options) == 0
    assert (_job(empty_lab, stage_0.id).status, _job(empty_lab, stage_1.id).status) == ("done", "queued")
    left = [r.getMessage() for r in caplog.records if "left queued" in r.getMessage()]
    assert left == [f"job {stage_1.id} (stage, run {run.id} stage 1) left queued: it is planned for 2 processes (its "
                    "steps were counted for them), and this worker launches 1 (it owns one GPU or none); a worker of 2 "
                    "GPUs (--gpus) trains it"] * 2  # once by each worker
    assert worker_status(empty_lab)[1].endswith(  # the page's badge says who takes it
        f". Job {stage_1.id} (stage) is planned for 2 processes: only a worker of 2 GPUs "
        "takes it (`envlab worker --gpus`).")
    assert run_worker(empty_lab, {"stage": noted}, WorkerOptions(worker_id="two", once=True, gpus=("0", "1"))) == 1
    assert (_job(empty_lab, stage_1.id).status, _job(empty_lab, stage_1.id).worker) == ("done", "two")


def test_a_stage_in_vllms_server_mode_is_taken_by_a_worker_whose_gpus_less_its_servers_match(empty_lab: Engine,
                                                                                            caplog):
    """A run in vLLM's server mode trains on the worker's GPUs less its server's (the last one, or `--vllm-gpus`):
    its one-process stage is left by a worker of three GPUs (it would launch two beside its server), saying so, and
    taken by a worker of two. A worker of one GPU cannot serve, so it counts one for both and takes such a stage to
    fail it saying why (training.vllm.split_for_server), rather than leave it queued unsaid."""
    from envsim.config import EnvConfig
    from lab.jobs.worker import launch_counts
    from lab.loop import _enqueue, create_run
    from storage.models import Stage, StageStatus
    from storage.payloads import StagePayload
    from storage.settings import RunSettings

    assert [launch_counts(g, v) for g, v in [((), ()), (("0",), ()), (("0", "1"), ()), (("0", "1", "2"), ()),
                                             (("0", "1"), ("2",)), (("0", "1", "2"), ("2",))]] == [
        (1, 1), (1, 1), (2, 1), (3, 2), (2, 2), (3, 2)]
    with session(empty_lab) as s:
        run = create_run(s, name="r", config=EnvConfig.default(sizes=(3, 4), num_instances=32), engineer="fixed",
                         settings=RunSettings(stages=1))
        # as a lab with vLLM stores it (without vLLM installed, as here, create_run refuses it, saying so)
        run.settings = RunSettings(stages=1, grpo={"use_vllm": True, "vllm_mode": "server"})
        s.exec(select(Job)).one().status = "done"
        s.exec(select(Stage)).one().status = StageStatus.DONE
        stage_1 = _enqueue(s, StagePayload(run_id=run.id, stage_index=1))
        s.commit()
        assert (stage_1.processes, stage_1.vllm_server) == (1, True)
    caplog.set_level("INFO", logger="envlab.worker")
    three = WorkerOptions(worker_id="three", once=True, poll_s=0.01, gpus=("0", "1", "2"))
    assert run_worker(empty_lab, {"stage": noted}, three) == 0
    left = [r.getMessage() for r in caplog.records if "left queued" in r.getMessage()]
    assert left == [f"job {stage_1.id} (stage, run {run.id} stage 1) left queued: it is planned for 1 processes "
                    "beside the worker's vLLM server (its steps were counted for them), and this worker launches 2 "
                    "beside its server; a worker of 1 GPUs besides its server's (--gpus, --vllm-gpus) trains it"]
    assert run_worker(empty_lab, {"stage": noted}, WorkerOptions(worker_id="two", once=True, gpus=("0", "1"))) == 1
    assert (_job(empty_lab, stage_1.id).status, _job(empty_lab, stage_1.id).worker) == ("done", "two")


def test_a_killed_workers_job_is_reaped_then_requeued_and_resumed_from_its_checkpoint(db_url: str, engine: Engine):
    with session(engine) as s:
        job_id = queue.enqueue(s, "stage", {"run_id": 1, "stage_index": 1}).id
    engine.dispose()  # no pooled connection crosses the fork
    worker = FORK.Process(target=_doomed_worker, args=(db_url,))
    worker.start()
    try:
        _wait_for(lambda: (_job(engine, job_id).result or {}).get("checkpoint") is not None)
        first_beat = _job(engine, job_id).heartbeat_at
        # the handler sleeps, yet the heartbeat thread keeps the job fresh
        _wait_for(lambda: _job(engine, job_id).heartbeat_at > first_beat)
    finally:
        worker.kill()  # SIGKILL: no cleanup of any kind
        worker.join(timeout=10)
    assert worker.exitcode == -9
    assert _job(engine, job_id).status == "running"  # nobody ended it

    time.sleep(0.5)
    # A second worker's polls reap the dead worker's job at a second look, at least 0.2 s (stale / 2) after the
    # first; nothing else is queued, so it returns when idle.
    looking = WorkerOptions(worker_id="second", poll_s=0.02, stale_s=0.4, idle_exit_s=1.0)
    assert run_worker(engine, {"stage": resumable}, looking) == 0
    second = WorkerOptions(worker_id="second", poll_s=0.02, stale_s=0.4, once=True)
    dead = _job(engine, job_id)
    assert (dead.status, dead.attempts, dead.worker) == ("failed", 1, "doomed")
    assert dead.error.startswith("worker stopped sending heartbeats") and "'doomed'" in dead.error
    assert dead.result == {"checkpoint": "stage-1/trl/checkpoint-1"}

    with session(engine) as s:
        queue.requeue(s, job_id)
    assert run_worker(engine, {"stage": resumable}, second) == 1
    resumed = _job(engine, job_id)
    assert (resumed.status, resumed.attempts, resumed.worker) == ("done", 2, "second")
    assert resumed.result == {"resumed_from": "stage-1/trl/checkpoint-1", "attempt": 2}
    assert "resuming from stage-1/trl/checkpoint-1" in resumed.log_tail
    assert "requeued after attempt 1 ended failed: worker stopped sending heartbeats" in resumed.log_tail


def _worker_in_child(barrier, url: str, name: str) -> int:
    engine = make_engine(url)
    with session(engine) as s:
        s.exec(text("SELECT 1"))  # connected before the start line
    barrier.wait()
    return run_worker(engine, {"benchmark": noted}, WorkerOptions(worker_id=name, poll_s=0.01, once=True))


def test_two_worker_processes_never_take_the_same_job(db_url: str, engine: Engine):
    with session(engine) as s:
        ids = [queue.enqueue(s, "benchmark", {"n": i}).id for i in range(30)]
    ran = in_processes(_worker_in_child, [(db_url, "w0"), (db_url, "w1")], engine)
    assert sum(ran) == len(ids) and min(ran) > 0  # every job ran once, and both workers took part
    with session(engine) as s:
        jobs = s.exec(select(Job).order_by(Job.id)).all()
    assert [j.id for j in jobs] == ids
    assert {(j.status, j.attempts) for j in jobs} == {("done", 1)}
    pid_of = {w: {j.result["pid"] for j in jobs if j.worker == w} for w in ("w0", "w1")}
    assert len(pid_of["w0"]) == len(pid_of["w1"]) == 1 and pid_of["w0"] != pid_of["w1"]
    assert sorted(ran) == sorted(sum(j.worker == w for j in jobs) for w in ("w0", "w1"))


def test_cancel_stops_a_running_job_and_the_after_hook_sees_it(engine: Engine):
    with session(engine) as s:
        job_id = queue.enqueue(s, "stage", {}).id
    seen: list[tuple[int, str]] = []

    def after(engine: Engine, job: Job) -> None:
        seen.append((job.id, job.status))

    worker = threading.Thread(target=run_worker,
                              args=(engine, {"stage": patient}, WorkerOptions(poll_s=0.02, once=True, after=after)))
    worker.start()
    _wait_for(lambda: _job(engine, job_id).step >= 3)
    with session(engine) as s:
        queue.request_cancel(s, job_id)
    worker.join(timeout=30)
    assert not worker.is_alive()
    job = _job(engine, job_id)
    assert (job.status, job.error) == ("cancelled", "cancelled")
    assert seen == [(job_id, "cancelled")]


def test_a_failing_handler_fails_only_its_job_with_the_last_traceback_line(engine: Engine):
    with session(engine) as s:
        bad, odd, good = (queue.enqueue(s, kind, {}).id for kind in ("stage", "propose", "benchmark"))
    ran = run_worker(engine, {"stage": broken, "benchmark": noted}, WorkerOptions(poll_s=0.02, once=True))
    assert ran == 3
    failed = _job(engine, bad)
    assert (failed.status, failed.error) == ("failed", f"ValueError: checkpoint for job {bad} is unreadable")
    assert "Traceback (most recent call last)" in failed.log_tail and "loading" in failed.log_tail
    assert _job(engine, odd).error == ("LookupError: no handler for job kind 'propose' "
                                       "(this worker runs stage, benchmark)")
    assert _job(engine, good).status == "done"


def test_the_worker_command_runs_the_queue_once_and_exits(tmp_path):
    url = f"sqlite:///{tmp_path / 'envlab.db'}"
    engine = make_engine(url)
    upgrade(engine)
    with session(engine) as s:
        job_id = queue.enqueue(s, "propose", {}).id
    done = subprocess.run([sys.executable, "-m", "lab.jobs.worker", "--db", url, "--once", "--poll", "0.01",
                           "--worker-id", "cli"], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert "worker cli: stopped after 1 jobs" in done.stderr
    job = _job(engine, job_id)
    assert (job.status, job.worker) == ("failed", "cli")
    # the lab's propose handler ran on a payload without a run
    assert job.error == f"ValueError: propose job {job_id}'s payload: run_id: Field required"
    engine.dispose()


def test_a_probe_lane_runs_a_measure_job_while_the_stage_ahead_of_it_waits_and_lowers_its_priority(tmp_path):
    url = f"sqlite:///{tmp_path / 'envlab.db'}"
    engine = make_engine(url)
    upgrade(engine)
    with session(engine) as s:
        stage = queue.enqueue(s, "stage", {}).id
        probe = queue.enqueue(s, "probe", {}).id
    script = ("import os, sys; from lab.jobs.worker import main; code = main(sys.argv[1:]); "
              "print('niceness', os.nice(0)); sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", script, "--db", url, "--once", "--poll", "0.01",
                           "--worker-id", "lane", "--kinds", "probe", "--nice", "5"], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert "worker lane: stopped after 1 jobs" in done.stderr
    assert done.stdout.split()[-1] == str(os.nice(0) + 5)  # lower than this process, which serves the page
    assert (_job(engine, probe).worker, _job(engine, probe).status) == ("lane", "failed")  # ran (on no configs)
    assert _job(engine, stage).status == "queued"  # left for the stage worker
    engine.dispose()


def test_a_worker_beside_the_page_leaves_it_a_core_unless_told_its_threads():
    assert beside_page_env({}, cores=2) == {"OMP_NUM_THREADS": "1"}
    assert beside_page_env({}, cores=1) == {"OMP_NUM_THREADS": "1"}  # at least one
    assert beside_page_env({}, cores=16) == {"OMP_NUM_THREADS": "15"}
    assert beside_page_env({"OMP_NUM_THREADS": "4"}, cores=16) == {}  # what the person set is kept


def _ending_worker(url: str, log_path: str) -> None:
    """A worker process as `envlab worker` runs one: its signals handled, its probe jobs in child processes."""
    import logging

    logging.basicConfig(filename=log_path, level=logging.INFO, format="%(name)s %(levelname)s %(message)s", force=True)
    stop = stop_on_signals()
    run_worker(make_engine(url), {"probe": InChild("tests.child_jobs:patient")}, WorkerOptions(poll_s=0.05, stop=stop))


def test_a_signalled_worker_hands_its_job_back_saved_and_uncounted_and_the_next_worker_finishes_it(
        db_url: str, engine: Engine, tmp_path: Path):
    saved, log_path = tmp_path / "saved", tmp_path / "worker.log"
    with session(engine) as s:
        job_id = queue.enqueue(s, "probe", {"saved": str(saved)}).id
    engine.dispose()  # no pooled connection crosses the fork
    worker = FORK.Process(target=_ending_worker, args=(db_url, str(log_path)))
    worker.start()
    try:
        _wait_for(lambda: _job(engine, job_id).step >= 3, timeout=180)  # the child is at work
        os.kill(worker.pid, signal.SIGTERM)
        worker.join(timeout=60)
    finally:
        if worker.is_alive():
            worker.kill()
    assert worker.exitcode == 0
    back = _job(engine, job_id)
    assert (back.status, back.attempts, back.worker, back.error) == ("queued", 0, None, None)
    assert saved.read_text().startswith("saved at step ")  # it stopped at a step and saved, as a stage does
    assert f"-- handed back at step {back.step} of 1000: its worker is ending (the attempt" in back.log_tail
    logged = log_path.read_text()
    assert "SIGTERM: handing the job in hand back to the queue and stopping" in logged and "Traceback" not in logged

    def finish(engine, job, progress) -> dict:
        return {"attempt": job.attempts}

    assert run_worker(engine, {"probe": finish}, WorkerOptions(poll_s=0.02, once=True)) == 1
    done = _job(engine, job_id)
    assert (done.status, done.attempts, done.result) == ("done", 1, {"attempt": 1})  # the handed-back one not counted


def test_a_job_whose_worker_process_is_gone_from_this_host_is_handed_back_at_the_next_start(engine: Engine):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = f"{socket.gethostname()}:{gone.pid}"
    with session(engine) as s:
        job_id = queue.enqueue(s, "stage", {"run_id": 1, "stage_index": 1}).id
        other = queue.enqueue(s, "stage", {"run_id": 2, "stage_index": 1}).id
        queue.claim(s, dead)
        queue.heartbeat(s, job_id, 7, 20, None, {"checkpoint": "stage-1/trl/checkpoint-7"})
        queue.claim(s, f"another-host:{gone.pid}")  # not this host's: left to the heartbeat reaper

    def resume(engine, job, progress) -> dict:
        return {"resumed_from": job.result["checkpoint"], "attempt": job.attempts}

    assert run_worker(engine, {"stage": resume}, WorkerOptions(poll_s=0.02, stale_s=3600, once=True)) == 1
    job = _job(engine, job_id)
    assert (job.status, job.attempts, job.result) == (
        "done", 1, {"resumed_from": "stage-1/trl/checkpoint-7", "attempt": 1})
    assert f"-- handed back at step 7 of 20: its worker {dead} is gone from this host (the attempt is not counted)" \
        in job.log_tail
    assert _job(engine, other).status == "running"
