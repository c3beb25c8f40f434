"""The stage loop under concurrency and failure: each step taken once, failures that stop for a person,
cancels that hold, resume that leaves live work alone, and a database from the previous version upgraded.

The stage job replays recorded answers (tests/test_loop.py); training itself is in tests/training/test_stage.py.
"""

from __future__ import annotations

import socket
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import column, insert, inspect, table, text
from sqlmodel import select

from envsim.config import EnvConfig
from lab.engineers import ENGINEERS
from lab.jobs.worker import WorkerOptions, run_job, run_worker
from lab.loop import (
    PROPOSE_ATTEMPTS,
    LoopError,
    Step,
    advance,
    after_job,
    cancel,
    create_run,
    drive,
    jobs_of,
    queue_benchmark,
    resume,
    run_propose_job,
    switch_engineer,
)
from lab.proposals import Superseded, decide, store_proposal
from storage import queue
from storage.db import current_revision, make_engine, session, upgrade
from storage.models import Decision, Job, JobKind, JobStatus, Priority, Proposal, Run, RunStatus, Stage, utcnow
from storage.settings import RunSettings
from tests.processes import in_processes
from tests.recorded import BOARDS, CONFIG, HANDLERS, recorded_stage, work
from tests.schema import HEAD
from training.evaluate import EpisodeResult, store_evaluation

FIRST, SECOND = EnvConfig.default(hole_ratio=0.1), EnvConfig.default(hole_ratio=0.3)  # two configs an older lab stored
FIRST_JSON, SECOND_JSON = FIRST.model_dump(mode="json"), SECOND.model_dump(mode="json")


def _advance_and_work(barrier, url: str, run_id: int, calls: int) -> list[str]:
    engine = make_engine(url)
    barrier.wait()
    states = []
    for _ in range(calls):  # at most `calls` rounds: the propose job's generator check may keep the other busy
        states.append(advance(engine, run_id).text)
        if states[-1] == "done":
            break
        run_worker(engine, HANDLERS, WorkerOptions(once=True, poll_s=0.001, after=after_job))
    engine.dispose()
    return states[-1:]


def test_two_processes_advancing_one_run_take_each_step_once(engine, db_url):
    with session(engine) as s:
        run = create_run(s, name="race", config=CONFIG, settings=RunSettings(stages=3, auto_apply=True),
                         engineer="fixed")
    ends = in_processes(_advance_and_work, [(db_url, run.id, 2000), (db_url, run.id, 2000)], engine)
    assert ends == [["done"], ["done"]]
    with session(engine) as s:
        proposals = s.exec(select(Proposal).where(Proposal.run_id == run.id)).all()
        assert sorted(p.after_stage for p in proposals) == [0, 1, 2]  # exactly one proposal per stage
        decisions = s.exec(select(Decision)).all()
        assert sorted(d.proposal_id for d in decisions) == sorted(p.id for p in proposals)
        jobs = jobs_of(s, run.id)
        assert sorted((j.kind, j.target) for j in jobs) == [
            ("propose", 0), ("propose", 1), ("propose", 2), ("stage", 0), ("stage", 1), ("stage", 2), ("stage", 3)]
        assert {(j.status, j.attempts) for j in jobs} == {("done", 1)}
        assert [st.index for st in s.exec(select(Stage).where(Stage.run_id == run.id))] == [0, 1, 2, 3]


def test_the_database_refuses_a_second_active_job_for_one_target(engine):
    with session(engine) as s:
        run = create_run(s, name="dup", config=CONFIG, settings=RunSettings(stages=1), engineer="fixed")
        with pytest.raises(queue.AlreadyQueued, match=f"stage job 1 for run {run.id}, stage 0 is queued already"):
            queue.enqueue(s, JobKind.STAGE, {"run_id": run.id, "stage_index": 0}, run_id=run.id, target=0)
        assert len(s.exec(select(Job)).all()) == 1


def _broken_engineer(engine, job, progress):
    with session(engine) as s:
        if s.get(Run, job.run_id).engineer == "llm":
            raise RuntimeError("the engineer's server is down")
    return run_propose_job(engine, job, progress)


def test_a_propose_job_that_raises_fails_the_run_after_bounded_retries_and_a_person_switches_engineer(engine):
    handlers = {**HANDLERS, "propose": _broken_engineer}
    with session(engine) as s:
        run = create_run(s, name="llm", config=CONFIG, settings=RunSettings(stages=1, auto_apply=True),
                         engineer="llm", engineer_backend="openai:x")
    options = WorkerOptions(once=True, poll_s=0.01, after=after_job)
    state = drive(engine, run.id, lambda: run_worker(engine, handlers, options) > 0, poll_s=0.01).text
    job_id = 2  # job 1 is stage 0
    assert state == ("failed: proposal after stage 0 failed: RuntimeError: the engineer's server is down")
    with session(engine) as s:
        jobs = jobs_of(s, run.id)
        assert [(j.id, j.kind, j.status, j.attempts) for j in jobs] == [
            (1, "stage", "done", 1), (job_id, "propose", "failed", PROPOSE_ATTEMPTS)]
        got = s.get(Run, run.id)
        assert (got.status, got.status_reason) == ("failed", state.removeprefix("failed: "))
    for _ in range(5):  # the hook, the page and the CLI asking again change nothing
        assert advance(engine, run.id).text == state
    with session(engine) as s:
        assert len(jobs_of(s, run.id)) == 2
    # A person switches to the fixed engineer: the same job is tried again and the run goes to the end.
    assert switch_engineer(engine, run.id, "fixed") == [job_id]
    assert drive(engine, run.id, lambda: run_worker(engine, handlers, options) > 0, poll_s=0.01).text == "done"
    with session(engine) as s:
        got = s.get(Run, run.id)
        assert (got.engineer, got.settings.engineer_history[0]["engineer"]) == ("fixed", "llm")
        assert len(jobs_of(s, run.id)) == 3  # + stage 1


def test_switching_to_an_unknown_engineer_is_refused(engine):
    with session(engine) as s:
        run = create_run(s, name="x", config=CONFIG, settings=RunSettings(stages=1), engineer="fixed")
    with pytest.raises(LoopError, match="unknown engineer 'oracle'"):
        switch_engineer(engine, run.id, "oracle")
    assert "oracle" not in ENGINEERS


def test_cancelling_a_run_is_not_undone_by_the_hook(engine):
    with session(engine) as s:
        run = create_run(s, name="stop", config=CONFIG, settings=RunSettings(stages=2, auto_apply=False),
                         engineer="fixed")
    with session(engine) as s:
        stage_job = queue.claim(s, "w")
    after_job(engine, run_job(engine, stage_job, recorded_stage))  # stage 0; the hook queues the proposal
    with session(engine) as s:
        assert [(j.kind, j.status) for j in jobs_of(s, run.id)] == [("stage", "done"), ("propose", "queued")]
    assert cancel(engine, run.id) == [2]
    with session(engine) as s:
        job = s.get(Job, 2)
    after_job(engine, job)  # what the worker does when a job ends
    assert advance(engine, run.id).text.startswith("cancelled: cancelled at ")
    assert not work(engine)  # nothing was queued again
    with session(engine) as s:
        assert [(j.kind, j.status) for j in jobs_of(s, run.id)] == [("stage", "done"), ("propose", "cancelled")]
        assert s.get(Run, run.id).status == RunStatus.CANCELLED
    # resume undoes it: the cancelled proposal job runs again
    assert resume(engine, run.id) == [2]
    assert work(engine)
    assert advance(engine, run.id) == Step(RunStatus.WAITING, "waiting: proposal 1 needs a decision")


def test_a_cancelled_stage_job_leaves_the_run_cancelled(engine):
    def cancelled_stage(engine, job, progress):
        with session(engine) as s:
            queue.request_cancel(s, job.id)
        from training.progress import Cancelled

        progress(1, 2)
        raise Cancelled("stopped at step 1")

    with session(engine) as s:
        run = create_run(s, name="c", config=CONFIG, settings=RunSettings(stages=1, auto_apply=True), engineer="fixed")
    run_worker(engine, {"stage": cancelled_stage}, WorkerOptions(once=True, poll_s=0.01, after=after_job))
    assert advance(engine, run.id) == Step(RunStatus.CANCELLED, "cancelled: stage 0 was cancelled (job 1)")
    with session(engine) as s:
        assert len(jobs_of(s, run.id)) == 1


def test_a_proposal_that_is_no_longer_current_is_superseded_and_cannot_be_decided(engine):
    with session(engine) as s:
        run = create_run(s, name="sup", config=CONFIG, settings=RunSettings(stages=2), engineer="fixed")
    assert work(engine)  # stage 0, then the proposal after it
    with session(engine) as s:
        first = s.exec(select(Proposal)).one()
        evidence = __import__("lab.loop", fromlist=["x"]).evidence_for(s, s.get(Run, run.id), 0)
        answer = ENGINEERS["fixed"].propose(evidence, seed=0)
        second = store_proposal(s, run.id, 0, "fixed", answer, CONFIG)
        with pytest.raises(Superseded, match=f"proposal {first.id} was superseded by proposal {second.id}"):
            decide(s, first.id, "accept", "alice")
        assert decide(s, second.id, "accept", "bob").decision.action == "accept"
    assert advance(engine, run.id) == Step(RunStatus.ACTIVE, "queued stage 1 (accept by bob)")
    with session(engine) as s:
        assert s.exec(select(Decision).where(Decision.proposal_id == first.id)).first() is None


def _benchmark_rows(engine, run_id: int, stage: int) -> None:
    results = [EpisodeResult(b, "no idea", __import__("envsim.scoring", fromlist=["x"]).score_answer(b, "no idea"))
               for b in BOARDS[:2]]
    with session(engine) as s:
        store_evaluation(s, run_id, stage, "benchmark", results, [0.25, 0.5])


def test_a_benchmark_job_is_queued_once_and_never_blocks_the_loop(engine):
    with session(engine) as s:
        run = create_run(s, name="b", config=CONFIG, settings=RunSettings(stages=2), engineer="fixed")
    with pytest.raises(LoopError, match="stage 0 of run 1 is queued: it has no checkpoint to evaluate"):
        queue_benchmark(engine, run.id, 0)
    assert work(engine)  # stage 0 and the proposal after it
    job = queue_benchmark(engine, run.id, 0)
    with pytest.raises(LoopError, match="stage 0 of run 1 has a benchmark job queued or running already"):
        queue_benchmark(engine, run.id, 0)
    # the loop goes on beside it: stage 1 is queued although the benchmark job waits
    with session(engine) as s:
        decide(s, s.exec(select(Proposal)).one().id, "accept", "alice")
    assert advance(engine, run.id).text == "queued stage 1 (accept by alice)"
    with session(engine) as s:  # alice waits on her stage: it goes first, the older benchmark job next
        first, second = queue.claim(s, "w"), queue.claim(s, "w")
        assert (first.kind, first.target, first.priority, second.id) == ("stage", 1, Priority.INTERACTIVE, job.id)

    _benchmark_rows(engine, run.id, 0)
    with session(engine) as s:
        queue.finish(s, job.id, {"episodes": 2})
        finished = s.get(Job, job.id).finished_at
    with pytest.raises(LoopError, match=f"stage 0 of run 1 was evaluated on the benchmark at "
                                        f"{finished:%Y-%m-%d %H:%M:%S} UTC \\(job {job.id}\\)"):
        queue_benchmark(engine, run.id, 0)


def test_resume_requeues_only_dead_work(engine):
    with session(engine) as s:
        run = create_run(s, name="r", config=CONFIG, settings=RunSettings(stages=1), engineer="fixed")
        job = queue.claim(s, "otherhost:4242")  # a live worker on another machine
    assert resume(engine, run.id) == []
    with session(engine) as s:
        assert s.get(Job, job.id).status == JobStatus.RUNNING
        s.exec(text("UPDATE jobs SET heartbeat_at = :t WHERE id = :id").bindparams(
            t=(utcnow() - timedelta(seconds=600)).replace(tzinfo=None) if engine.dialect.name == "sqlite"
            else utcnow() - timedelta(seconds=600), id=job.id))
        s.commit()
    assert resume(engine, run.id) == [job.id]  # no heartbeat for 10 minutes: its worker is gone
    with session(engine) as s:
        again = s.get(Job, job.id)
        assert (again.status, again.attempts) == ("queued", 1)
        assert "sent no heartbeat for 600 s (found on resume)" in again.log_tail


def test_resume_fails_a_local_dead_workers_job_and_queues_it(engine):
    with session(engine) as s:
        run = create_run(s, name="r", config=CONFIG, settings=RunSettings(stages=1), engineer="fixed")
        job = queue.claim(s, f"{socket.gethostname()}:999999")  # no such process
    assert resume(engine, run.id) == [job.id]
    assert work(engine)


# ---------------------------------------------------------------- the previous version's database


def test_a_database_of_the_previous_version_upgrades_with_nothing_lost(db_url):
    engine = make_engine(db_url)
    upgrade(engine, "0003")
    created = datetime(2026, 11, 21, 8, 0, 0, 123456, tzinfo=UTC)
    t = lambda name, *cols: table(name, *(column(c) for c in cols))  # noqa: E731
    runs = t("runs", "id", "name", "description", "policy", "engineer", "engineer_backend", "settings", "seed",
             "status", "created_at")
    stages = t("stages", "id", "run_id", "index", "config", "status", "checkpoint")
    proposals = t("proposals", "id", "run_id", "after_stage", "engineer", "prompt", "raw_answer", "adjustments",
                  "rationale", "diff", "created_at")
    decisions = t("decisions", "id", "proposal_id", "action", "user", "config", "note", "created_at")
    jobs = t("jobs", "id", "kind", "payload", "status", "step", "cancel_requested", "log_tail", "attempts",
             "created_at")
    import json

    j = json.dumps
    stamp = created.replace(tzinfo=None) if engine.dialect.name == "sqlite" else created
    with engine.begin() as c:
        c.execute(insert(runs), [
            dict(id=1, name="old", description="", policy="tiny", engineer="heuristic", engineer_backend="",
                 settings=j({"stages": 2}), seed=0, status="running", created_at=stamp),
            dict(id=2, name="new", description="d", policy="tiny", engineer="fixed", engineer_backend="",
                 settings=j({"stages": 1}), seed=1, status="created", created_at=stamp)])
        c.execute(insert(stages), [
            dict(id=1, run_id=1, index=0, config=j(FIRST_JSON), status="done", checkpoint="/abs/tiny"),
            dict(id=2, run_id=1, index=1, config=j(SECOND_JSON), status="pending", checkpoint=None)])
        c.execute(insert(proposals), [dict(id=1, run_id=1, after_stage=0, engineer="heuristic", prompt="p",
                                           raw_answer="{}", adjustments="[]", rationale="r", diff="{}",
                                           created_at=stamp)])
        c.execute(insert(decisions), [dict(id=1, proposal_id=1, action="edit", user="alice", config=j(SECOND_JSON),
                                           note="why", created_at=stamp)])
        c.execute(insert(jobs), [
            dict(id=k, kind=kind, payload=j(payload), status=status, step=0, cancel_requested=False, log_tail="",
                 attempts=1, created_at=stamp) for k, kind, payload, status in [
                (1, "stage", {"run_id": 1, "stage_index": 0}, "done"),
                (2, "propose", {"run_id": 1, "after_stage": 0}, "failed"),
                (3, "propose", {"run_id": 1, "after_stage": 0}, "queued"),
                (4, "propose", {"run_id": 1, "after_stage": 0}, "queued"),  # the old loop's duplicate
                (5, "stage", {"run_id": 2, "stage_index": 0}, "queued"),
                (6, "benchmark", {"run_id": 1, "stage_index": 0}, "done")]])
    upgrade(engine)
    assert current_revision(engine) == HEAD
    with session(engine) as s:
        got_runs = s.exec(select(Run).order_by(Run.id)).all()
        assert [(r.id, r.name, r.description, r.settings, r.seed, r.status, r.status_reason, r.created_at)
                for r in got_runs] == [  # scored on 2 agents, as every run of then was (0015)
            (1, "old", "", RunSettings(stages=2, validation_agents=(2,)), 0, "active", "", created),
            (2, "new", "d", RunSettings(stages=1, validation_agents=(2,)), 1, "active", "", created)]
        assert len({r.uuid for r in got_runs}) == 2 and all(len(r.uuid) == 32 for r in got_runs)
        assert [(st.id, st.run_id, st.index, st.config, st.status, st.checkpoint)
                for st in s.exec(select(Stage).order_by(Stage.id))] == [
            (1, 1, 0, FIRST, "done", "/abs/tiny"), (2, 1, 1, SECOND, "queued", None)]
        p = s.exec(select(Proposal)).one()
        assert (p.id, p.run_id, p.after_stage, p.prompt, p.rationale, p.created_at) == (1, 1, 0, "p", "r", created)
        d = s.exec(select(Decision)).one()
        assert (d.id, d.proposal_id, d.action, d.user, d.config, d.note, d.created_at) == (
            1, 1, "edit", "alice", SECOND, "why", created)
        assert [(jb.id, jb.kind, jb.run_id, jb.target, jb.status, jb.payload["run_id"])
                for jb in s.exec(select(Job).order_by(Job.id))] == [
            (1, "stage", 1, 0, "done", 1), (2, "propose", 1, 0, "failed", 1), (3, "propose", 1, 0, "queued", 1),
            (4, "propose", 1, 0, "cancelled", 1), (5, "stage", 2, 0, "queued", 2), (6, "benchmark", 1, 0, "done", 1)]
        assert s.get(Job, 4).error == "a duplicate of job 3, cancelled when the database was upgraded"
    assert "ix_jobs_run_id" in {ix["name"] for ix in inspect(engine).get_indexes("jobs")}
    with pytest.raises(Exception, match="(?i)check"), engine.begin() as c:
        c.execute(text("UPDATE runs SET status = 'running' WHERE id = 1"))
    engine.dispose()
