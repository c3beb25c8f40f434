"""The job queue on SQLite and PostgreSQL: concurrent claims, heartbeats, cancel, reaping, requeue."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, text, update
from sqlmodel import select

import storage.models
from storage import queue
from storage.db import make_engine, session
from storage.models import Job, Priority, utcnow
from storage.queue import LOG_TAIL_LINES, LostJob, process_alive
from tests.processes import in_processes


def test_claim_takes_the_oldest_queued_job_and_marks_it_running(engine: Engine):
    with session(engine) as s:
        ids = [queue.enqueue(s, "stage", {"stage": i}).id for i in range(3)]
        first = queue.claim(s, "gpu-0")
        assert (first.id, first.status, first.worker, first.attempts, first.payload) == (
            ids[0],
            "running",
            "gpu-0",
            1,
            {"stage": 0},
        )
        assert first.started_at == first.heartbeat_at and first.started_at.tzinfo is not None
        assert [queue.claim(s, "gpu-1").id, queue.claim(s, "gpu-0").id] == ids[1:]
        assert queue.claim(s, "gpu-0") is None


def _work_in_child(barrier, url: str, worker: str) -> list[int]:
    engine = make_engine(url)
    claimed = []
    with session(engine) as s:
        s.exec(text("SELECT 1"))  # connected before the start line
        barrier.wait()
        while (job := queue.claim(s, worker)) is not None:
            claimed.append(job.id)
            queue.heartbeat(s, job.id, 1, 1, f"{worker} on job {job.id}")
            queue.finish(s, job.id, {"worker": worker})
    return claimed


def test_concurrent_worker_processes_claim_every_job_exactly_once(db_url: str, engine: Engine):
    with session(engine) as s:
        ids = [queue.enqueue(s, "benchmark", {"n": i}).id for i in range(40)]
    workers = ["w0", "w1", "w2"]
    claimed = dict(
        zip(workers, in_processes(_work_in_child, [(db_url, w) for w in workers], engine), strict=True)
    )
    every_claim = [job_id for w in workers for job_id in claimed[w]]
    assert sorted(every_claim) == ids  # none lost, none claimed twice
    with session(engine) as s:
        jobs = s.exec(select(Job).order_by(Job.id)).all()
        assert {j.status for j in jobs} == {"done"} and {j.attempts for j in jobs} == {1}
        owner = {job_id: w for w in workers for job_id in claimed[w]}
        assert all(j.worker == j.result["worker"] == owner[j.id] for j in jobs)


def test_a_claim_racing_another_workers_claim_takes_the_next_job(db_url: str, engine: Engine):
    sqlite = db_url.startswith("sqlite")
    with session(engine) as s:
        first, second = (queue.enqueue(s, "benchmark", {}).id for _ in range(2))

    def claim_once() -> Job | None:
        with session(engine) as s:
            return queue.claim(s, "me")

    with engine.connect() as other, ThreadPoolExecutor(1) as pool:
        # Another worker is in the middle of claiming the oldest job, its transaction still open:
        # on PostgreSQL it holds that row's lock, on SQLite the database's one write lock.
        if sqlite:
            other.exec_driver_sql("BEGIN IMMEDIATE")
        other.execute(update(Job).where(Job.id == first).values(status="running", worker="other"))
        mine = pool.submit(claim_once)
        if sqlite:
            time.sleep(0.3)  # the claim is now waiting for the write lock (busy_timeout)
            assert not mine.done()
        else:
            assert mine.result(timeout=10).id == second  # SKIP LOCKED: no waiting for the other worker
        other.commit()
        assert mine.result(timeout=30).id == second
    with session(engine) as s:
        assert [(j.id, j.worker) for j in s.exec(select(Job).order_by(Job.id))] == [
            (first, "other"),
            (second, "me"),
        ]


def test_heartbeat_records_progress_and_keeps_a_bounded_log(engine: Engine):
    with session(engine) as s:
        job = queue.enqueue(s, "stage", {"run_id": 1})
        claimed_at = queue.claim(s, "w").heartbeat_at
        time.sleep(0.002)  # SQLite's clock counts milliseconds
        assert queue.heartbeat(s, job.id, 0, 300, "step 0") is False
        queue.heartbeat(s, job.id, 248, 300, "\n".join(f"step {i}" for i in range(1, LOG_TAIL_LINES + 49)))
        assert queue.heartbeat(s, job.id, 249, 300, "loss 0.5\nreward 0.25") is False
        job = s.get(Job, job.id)
        lines = job.log_tail.splitlines()
        assert len(lines) == LOG_TAIL_LINES and lines[-3:] == ["step 248", "loss 0.5", "reward 0.25"]
        assert (job.step, job.total) == (249, 300) and job.heartbeat_at > claimed_at
        queue.heartbeat(s, job.id, 250, 300, result={"checkpoint": "runs/1/stage-1/step-250"})
        assert s.get(Job, job.id).result == {"checkpoint": "runs/1/stage-1/step-250"}


def test_finish_ends_a_running_job_once(engine: Engine):
    with session(engine) as s:
        job = queue.enqueue(s, "benchmark", {})
        with pytest.raises(LostJob, match="is queued, not running"):
            queue.finish(s, job.id, {"valid_rate": 0.5})
        queue.claim(s, "w")
        done = queue.finish(s, job.id, {"valid_rate": 0.5})
        assert (done.status, done.result, done.finished_at is not None) == ("done", {"valid_rate": 0.5}, True)
        with pytest.raises(LostJob, match="is done"):
            queue.fail(s, job.id, "late failure")
        with pytest.raises(LookupError, match="no job 999"):
            queue.cancel_requested(s, 999)


def test_cancel_stops_a_queued_job_at_once_and_a_running_one_through_its_worker(engine: Engine):
    with session(engine) as s:
        running, waiting, done = (queue.enqueue(s, "benchmark", {"n": i}).id for i in range(3))
        assert queue.claim(s, "w").id == running
        cancelled = queue.request_cancel(s, waiting)
        assert (cancelled.status, cancelled.cancel_requested, cancelled.finished_at is not None) == (
            "cancelled",
            True,
            True,
        )
        assert queue.claim(s, "w2").id == done  # the cancelled job is never claimed
        assert queue.claim(s, "w2") is None

        assert queue.cancel_requested(s, running) is False
        assert queue.request_cancel(s, running).status == "running"  # the worker decides when to stop
        assert queue.cancel_requested(s, running) is True
        assert queue.heartbeat(s, running, 5, 10) is True
        assert queue.fail(s, running, "stopped: cancel requested").status == "cancelled"

        queue.finish(s, done, None)
        assert queue.request_cancel(s, done).status == "done"  # an ended job stays as it ended


def test_stale_running_jobs_are_reaped_and_their_worker_learns_it(engine: Engine):
    with session(engine) as s:
        stale, alive = (queue.enqueue(s, "stage", {}).id for _ in range(2))
        queue.claim(s, "lost-machine")
        queue.claim(s, "w")
        ten_minutes_ago = utcnow() - timedelta(minutes=10)
        s.exec(update(Job).where(Job.id == stale).values(heartbeat_at=ten_minutes_ago))
        s.commit()
        reaped = queue.reap_stale(s, max_age_s=60)
        assert [j.id for j in reaped] == [stale]
        stamp = ten_minutes_ago.strftime("%Y-%m-%d %H:%M:%S")
        assert reaped[0].status == "failed"
        assert (
            reaped[0].error
            == f"worker stopped sending heartbeats (last at {stamp} UTC from worker 'lost-machine')"
        )
        assert s.get(Job, alive).status == "running"
        assert queue.reap_stale(s, max_age_s=60) == []
        with pytest.raises(LostJob, match=f"job {stale} is failed, not running"):
            queue.heartbeat(s, stale, 3, 10)


def test_a_stale_job_is_failed_only_at_a_second_look_with_the_same_heartbeat(engine: Engine):
    """A heartbeat 7 minutes old (a machine that slept, a stopped process, a clock step) is only noted at the first
    look; a job whose worker beats meanwhile keeps running, and one whose heartbeat is the same at a look half the
    stale time later is failed."""
    with session(engine) as s:
        alive, dead = (queue.enqueue(s, "stage", {}).id for _ in range(2))
        queue.claim(s, "sleeper")
        queue.claim(s, "lost")
        seven_minutes_ago = queue.db_now(s) - timedelta(minutes=7)
        s.exec(update(Job).values(heartbeat_at=seven_minutes_ago))
        s.commit()
        seen: dict = {}
        assert queue.reap_stale(s, max_age_s=60, seen=seen) == []
        assert set(seen) == {alive, dead}
        assert queue.reap_stale(s, max_age_s=60, seen=seen) == []  # too soon for a second look: two beats
        assert queue.heartbeat(s, alive, 5, 10) is False  # the sleeper wakes and beats
        seen = {job: (beat, when - timedelta(seconds=30)) for job, (beat, when) in seen.items()}  # 30 s on
        reaped = queue.reap_stale(s, max_age_s=60, seen=seen)
        assert [(j.id, j.status) for j in reaped] == [(dead, "failed")]
        assert s.get(Job, alive, populate_existing=True).status == "running"
        assert seen == {}


def skew_clock(monkeypatch: pytest.MonkeyPatch, by: timedelta) -> None:
    """This process's clock, as the lab reads it (`storage.models.utcnow`), runs `by` off the true one."""

    class Skewed(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.now(tz) + by

    monkeypatch.setattr(storage.models, "datetime", Skewed)


@pytest.mark.parametrize("skew", [timedelta(seconds=-90), timedelta(hours=-1), timedelta(hours=1)],
                         ids=["90s-behind", "1h-behind", "1h-ahead"])
def test_a_worker_whose_clock_is_off_keeps_its_job_and_a_dead_one_is_still_reaped(engine: Engine, monkeypatch,
                                                                                  skew: timedelta):
    """Heartbeats and the reaper's cutoff are read from the database's clock: a worker machine whose clock is off
    (and a reaper whose clock is off the other way) neither loses a live job nor keeps a dead one."""
    with session(engine) as s:
        live, dead = (queue.enqueue(s, "stage", {}).id for _ in range(2))
        with monkeypatch.context() as worker_machine:
            skew_clock(worker_machine, skew)
            assert [queue.claim(s, "skewed").id, queue.claim(s, "lost").id] == [live, dead]
            assert queue.heartbeat(s, live, 1, 10) is False
        ten_minutes_ago = queue.db_now(s) - timedelta(minutes=10)
        s.exec(update(Job).where(Job.id == dead).values(heartbeat_at=ten_minutes_ago))
        s.commit()
        with monkeypatch.context() as reaper_machine:
            skew_clock(reaper_machine, -skew)
            reaped = queue.reap_stale(s, max_age_s=60)
        assert [(j.id, j.status) for j in reaped] == [(dead, "failed")]
        assert s.get(Job, live, populate_existing=True).status == "running"
        assert queue.heartbeat(s, live, 2, 10) is False  # its worker carries on


def test_hand_back_queues_a_running_job_again_in_place_uncounted_unless_a_cancel_was_asked(engine: Engine):
    with session(engine) as s:
        job = queue.enqueue(s, "stage", {"run_id": 1, "stage": 2})
        asked = queue.enqueue(s, "stage", {"run_id": 2, "stage": 1})
        queue.claim(s, "w0")
        queue.heartbeat(s, job.id, 40, 100, "step 40", result={"checkpoint": "runs/1/stage-2/step-40"})
        back = queue.hand_back(s, job.id, "its worker got SIGTERM")
        assert (back.status, back.attempts, back.worker, back.step, back.started_at, back.error, back.result) == (
            "queued", 0, None, 40, None, None, {"checkpoint": "runs/1/stage-2/step-40"})
        assert back.log_tail.splitlines()[-1] == \
            "-- handed back at step 40 of 100: its worker got SIGTERM (the attempt is not counted)"
        assert queue.hand_back(s, job.id, "again") is None  # queued: not running any more
        assert (queue.claim(s, "w1").id, s.get(Job, job.id).attempts) == (job.id, 1)  # its turn kept
        queue.claim(s, "w1")
        queue.request_cancel(s, asked.id)
        cancelled = queue.hand_back(s, asked.id, "its worker got SIGINT")
        assert (cancelled.status, cancelled.error) == ("cancelled", "cancelled; its worker got SIGINT")


def test_requeue_gives_a_failed_job_a_new_attempt_that_resumes_from_its_checkpoint(engine: Engine):
    with session(engine) as s:
        job = queue.enqueue(s, "stage", {"run_id": 1, "stage": 2})
        queue.claim(s, "w0")
        queue.heartbeat(s, job.id, 40, 100, "step 40", result={"checkpoint": "runs/1/stage-2/step-40"})
        queue.fail(s, job.id, "CUDA out of memory")
        with pytest.raises(ValueError, match="only a failed or cancelled job"):
            queue.requeue(s, queue.enqueue(s, "benchmark", {}).id)

        again = queue.requeue(s, job.id)
        assert (again.status, again.worker, again.error, again.step, again.heartbeat_at) == (
            "queued",
            None,
            None,
            0,
            None,
        )
        assert again.payload == {"run_id": 1, "stage": 2}
        assert again.result == {"checkpoint": "runs/1/stage-2/step-40"}
        assert (
            again.log_tail.splitlines()[-1] == "-- requeued after attempt 1 ended failed: CUDA out of memory"
        )
        resumed = queue.claim(s, "w1")
        assert (resumed.id, resumed.attempts, resumed.worker) == (job.id, 2, "w1")
        with pytest.raises(ValueError, match="is running"):
            queue.requeue(s, job.id)


def test_claim_gives_a_worker_only_what_it_can_run_a_persons_jobs_first(engine: Engine):
    with session(engine) as s:
        big = queue.enqueue(s, "stage", {}, run_id=None, target=1, needs_gpu=True)
        small = queue.enqueue(s, "stage", {}, run_id=None, target=2)
        urgent = queue.enqueue(s, "probe", {}, run_id=None, target=3, priority=Priority.INTERACTIVE)
        urgent_big = queue.enqueue(s, "probe", {}, run_id=None, target=4, needs_gpu=True,
                                   priority=Priority.INTERACTIVE)
        # a worker without a GPU: the person's job that fits first, then the oldest that fits, then nothing
        assert [queue.claim(s, "cpu", gpu=False).id for _ in range(2)] == [urgent.id, small.id]
        assert queue.claim(s, "cpu", gpu=False) is None
        # a GPU worker takes what is left, the person's first
        assert [queue.claim(s, "gpu").id for _ in range(2)] == [urgent_big.id, big.id]
        assert queue.claim(s, "gpu") is None


def test_a_stage_planned_for_two_processes_is_claimed_only_by_a_worker_that_launches_two(engine: Engine):
    """A stage's steps are counted for the processes it was planned for (`RunSettings.processes`): a worker of one
    GPU, or of none, would take twice the steps, one of four half; each leaves it to a worker of two, and says so."""
    with session(engine) as s:
        two = queue.enqueue(s, "stage", {}, target=1, processes=2)
        one = queue.enqueue(s, "stage", {}, target=2, processes=1)
        anyone = queue.enqueue(s, "propose", {}, target=3)
        assert [j.id for j in queue.planned_elsewhere(s, 1)] == [two.id]
        assert [j.id for j in queue.planned_elsewhere(s, 2)] == [one.id]
        assert [j.id for j in queue.planned_elsewhere(s, 4)] == [two.id, one.id]
        assert [queue.claim(s, "cpu", gpu=False, processes=1).id for _ in range(2)] == [one.id, anyone.id]
        assert queue.claim(s, "cpu", gpu=False, processes=1) is None
        assert queue.claim(s, "four-gpus", processes=4) is None
        assert queue.claim(s, "two-gpus", processes=2).id == two.id
        assert queue.planned_elsewhere(s, 1) == []  # it is running, not left


def test_a_stage_in_vllms_server_mode_counts_the_workers_gpus_less_its_servers(engine: Engine):
    """A stage generating with the worker's own vLLM server trains on the worker's GPUs less the server's: a worker
    of two GPUs launches it on one, so it takes a served stage planned for one process and leaves a plain one (it
    would launch that on two), and a worker of one GPU leaves a served stage planned for one."""
    with session(engine) as s:
        served = queue.enqueue(s, "stage", {}, target=1, processes=1, vllm_server=True)
        plain = queue.enqueue(s, "stage", {}, target=2, processes=1)
        assert [j.id for j in queue.planned_elsewhere(s, 2, served=1)] == [plain.id]
        assert [j.id for j in queue.planned_elsewhere(s, 1, served=0)] == [served.id]
        assert queue.claim(s, "two-gpus", processes=2, served=1).id == served.id
        assert queue.claim(s, "two-gpus", processes=2, served=1) is None
        assert queue.claim(s, "one-gpu", processes=1).id == plain.id


def two_runs(s) -> None:
    """Runs 1 and 2, active, for jobs to belong to."""
    s.execute(text("INSERT INTO runs (id, uuid, name, description, policy, engineer, engineer_backend, "
                   "settings, seed, status, status_reason, created_at) VALUES "
                   "(1, 'a', 'a', '', 'tiny', 'fixed', '', '{}', 0, 'active', '', :t), "
                   "(2, 'b', 'b', '', 'tiny', 'fixed', '', '{}', 0, 'active', '', :t)"),
              {"t": utcnow()})
    s.commit()


def test_claim_of_one_run_leaves_the_others_jobs_queued(engine: Engine):
    with session(engine) as s:
        two_runs(s)
        other = queue.enqueue(s, "stage", {}, run_id=1, target=0)
        mine = queue.enqueue(s, "stage", {}, run_id=2, target=0)
        assert queue.claim(s, "envlab run 2", run_id=2).id == mine.id
        assert queue.claim(s, "envlab run 2", run_id=2) is None
        assert s.get(Job, other.id, populate_existing=True).status == "queued"


def test_claim_by_run_takes_the_oldest_runs_jobs_first_within_a_priority(engine: Engine):
    """An experiment's workers: run 1's later stage before run 2's earlier one, so runs end in the order they were
    made; a person's job still comes first, and a job of no run before any run's."""
    with session(engine) as s:
        two_runs(s)
        second_run = queue.enqueue(s, "stage", {}, run_id=2, target=1).id
        first_run = queue.enqueue(s, "stage", {}, run_id=1, target=2).id
        lab_wide = queue.enqueue(s, "benchmark", {}, run_id=None, target=0).id
        person = queue.enqueue(s, "probe", {}, run_id=2, target=3, priority=Priority.INTERACTIVE).id
        assert [queue.claim(s, "experiment", by_run=True).id for _ in range(4)] == [
            person, lab_wide, first_run, second_run]
        s.exec(update(Job).values(status="queued", worker=None))
        s.commit()
        # without it, the oldest job first: runs move together
        assert [queue.claim(s, "page").id for _ in range(4)] == [person, second_run, first_run, lab_wide]


def test_a_lane_claims_only_its_kinds_and_leaves_the_rest_in_order(engine: Engine):
    with session(engine) as s:
        stage = queue.enqueue(s, "stage", {"stage": 1}).id
        probe = queue.enqueue(s, "probe", {"configs": {}}).id
        assert queue.claim(s, "lane", kinds=["probe"]).id == probe  # the older stage job is not its kind
        assert queue.claim(s, "lane", kinds=["probe"]) is None
        assert queue.claim(s, "worker").id == stage


def test_a_worker_process_is_alive_while_it_runs_and_gone_once_ended_even_unreaped():
    """`process_alive`, which both hand-backs read (`lab.jobs.worker.hand_back_orphans`, `lab.loop` on resume): a
    process that ended and was not yet collected (a zombie) is gone, as one collected is."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert process_alive(child.pid) and process_alive(os.getpid())
        child.kill()
        deadline = time.monotonic() + 10
        stat = Path(f"/proc/{child.pid}/stat")
        while time.monotonic() < deadline and stat.read_text().rpartition(")")[2].split()[0] != "Z":
            time.sleep(0.05)
        assert not process_alive(child.pid)  # ended, its exit not collected yet
    finally:
        child.kill()
        child.wait()
    assert not process_alive(child.pid)  # collected
