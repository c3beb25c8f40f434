"""Runs moved through the real loop and worker, their stage jobs replaying recorded answers (real boards, real
scores) instead of training, so that the bookkeeping can be checked exactly: a run (`work`, `build_run`) and an
experiment of such runs (`scripted_experiment`). Training is tested in tests/training/test_stage.py."""

import random
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

from sqlalchemy import func
from sqlmodel import SQLModel, select

from envsim.config import EnvConfig
from envsim.generator import generate
from envsim.parser import format_plan
from envsim.scoring import score_answer
from envsim.suite import VALIDATION_PER_SIZE, Split
from lab.jobs.worker import WorkerOptions, run_worker
from lab.loop import advance, after_job, create_run, run_propose_job
from lab.proposals import current_proposal, decide
from lab.study.experiments import create_experiment
from storage.db import runs_root, session
from storage.models import Episode, Experiment, Job, Proposal, Run, Stage, TrainingLog
from storage.payloads import StagePayload
from storage.settings import RunSettings
from training.evaluate import EpisodeResult, store_evaluation

CONFIG = EnvConfig(data_ratio={3: 0.5, 4: 0.5}, hole_ratio={3: 0.2, 4: 0.2}, wait_ratio={3: 0.25, 4: 0.25},
                   num_agents=2, num_instances=8)
BOARDS = generate(CONFIG, 8, seed=11)


def answered_stage(engine, run_id: int, k: int, right, wrong: str, *, folder: bool = False) -> None:
    """Stage k of the run, done without training: the boards whose index is in `right` answered with the reference
    plan, the others with `wrong`, stored as the real stage stores them, on the validation boards and, the same, on
    the dev boards (what the engineer reads); its checkpoint inside the run's own folder (made, with `folder`, where
    a benchmark job would load it)."""
    results = []
    for i, b in enumerate(BOARDS):
        text = format_plan(b.reference_plan) if i in right else wrong
        results.append(EpisodeResult(b, text, score_answer(b, text)))
    with session(engine) as s:
        store_evaluation(s, run_id, k, "validation", results)
        store_evaluation(s, run_id, k, "dev", results)
        stage = s.exec(select(Stage).where(Stage.run_id == run_id, Stage.index == k)).one()
        stage.status, stage.checkpoint = "done", f"{s.get(Run, run_id).uuid}/stage-{k}"
        if folder:
            (runs_root(engine) / stage.checkpoint).mkdir(parents=True)
        s.add(stage)
        s.commit()


def recorded_stage(engine, job, progress):
    """Stage k answers the first 2k + 2 boards with the reference plan and the rest with garbage."""
    payload = StagePayload.of(job)
    k = payload.stage_index
    progress(1, 2, f"stage {k}: recorded answers")
    answered_stage(engine, payload.run_id, k, range(2 * k + 2), "I am not sure.")
    progress(2, 2)
    return {"valid": 2 * k + 2}


HANDLERS = {"stage": recorded_stage, "propose": run_propose_job}


def work(engine) -> bool:
    return run_worker(engine, HANDLERS, WorkerOptions(once=True, poll_s=0.01, after=after_job)) > 0


def build_run(engine, name: str = "travel", finish: bool = True) -> int:
    """A 2-stage run: an edit with a note after stage 0, a reject then (with `finish`) an accept after stage 1."""
    with session(engine) as s:
        run_id = create_run(s, name=name, config=CONFIG, settings=RunSettings(stages=2, grpo={"max_steps": 3}),
                            engineer="fixed", seed=7, description="a run that travels").id
    work(engine)  # stage 0; the worker's hook queues the proposal
    work(engine)  # proposal after stage 0
    with session(engine) as s:
        edited = {**CONFIG.model_dump(mode="json"), "hole_ratio": {"3": 0.1, "4": 0.3}}
        decide(s, current_proposal(s, run_id).id, "edit", "alice", edited, note="fewer holes on 4x4 — naïve?")
    advance(engine, run_id)
    work(engine)  # stage 1
    work(engine)  # proposal after stage 1
    with session(engine) as s:
        decide(s, current_proposal(s, run_id).id, "reject", "carol", note="ask again")
    advance(engine, run_id)
    work(engine)  # the proposal that replaces the rejected one: the run waits for a person
    with session(engine) as s:
        plus_two = timezone(timedelta(hours=2))
        for step, micro in [(1, 123456), (2, 999999), (3, 1)]:
            s.add(TrainingLog(run_id=run_id, stage_index=1, step=step,
                              metrics={"reward": 0.1 + 0.2 * step, "loss": -1.5e-7, "kl": 0.0, "big": 2**53 + 1,
                                       "per_size": {"3": [1, 2.5, None]}, "note": "ünïcode ✓"},
                              created_at=datetime(2026, 1, 2, 3, 4, step, micro, tzinfo=plus_two)))
        s.commit()
        answers = [format_plan(b.reference_plan) if i % 2 else "no idea" for i, b in enumerate(BOARDS[:3])]
        results = [EpisodeResult(b, a, score_answer(b, a)) for b, a in zip(BOARDS, answers, strict=False)]
        store_evaluation(s, run_id, 1, Split.BENCHMARK, results, subsets=[0.25, 0.5, 0.75])
    if finish:
        with session(engine) as s:
            decide(s, current_proposal(s, run_id).id, "accept", "bob")
        advance(engine, run_id)
        work(engine)  # stage 2
        assert advance(engine, run_id).text == "done"
    return run_id


def counts(engine) -> dict[str, int]:
    with engine.connect() as c:
        return {t.name: c.execute(select(func.count()).select_from(t)).scalar_one()
                for t in SQLModel.metadata.sorted_tables}


def fake_checkpoints(root: Path, engine, run_id: int) -> dict[str, bytes]:
    """A couple of files (one in a subfolder) in each trained stage's checkpoint folder; returns them."""
    files = {}
    with session(engine) as s:
        stages = s.exec(select(Stage).where(Stage.run_id == run_id, Stage.index > 0)).all()
    for stage in stages:
        rng = random.Random(stage.index)
        made = [("model.safetensors", rng.randbytes(70_000)), ("sub/config.json", b'{"k": %d}' % stage.index)]
        for rel, data in made:
            path = root / stage.checkpoint / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            files[f"{stage.checkpoint}/{rel}"] = data
    return files


# ---------------------------------------------------------------- an experiment of scripted runs


def solved(arm: str, seed: int, stage: int) -> list[int]:
    """Which of the 8 boards a run answers right: more with every stage, with the seed, and for `heuristic`."""
    n = min(8, 1 + seed + 2 * stage + (stage if arm == "heuristic" else 0))
    return [(seed + i) % 8 for i in range(n)]


def scripted_stage(engine, job, progress):
    """The stage job without training: the run's answers per `solved`."""
    payload = StagePayload.of(job)
    run_id, k = payload.run_id, payload.stage_index
    with session(engine) as s:
        run = s.get(Run, run_id)
    answered_stage(engine, run_id, k, set(solved(run.arm, run.seed, k)), "no idea", folder=True)
    return {"stage_index": k}


SCRIPTED = {"stage": scripted_stage, "propose": run_propose_job}


def run_all(engine) -> None:
    while run_worker(engine, SCRIPTED, WorkerOptions(once=True, poll_s=0.01, after=after_job)):
        pass


def scripted_experiment(engine, name: str = "cmp", seeds: int = 3, stages: int = 2) -> Experiment:
    experiment = create_experiment(engine, name=name, arms=["fixed", "heuristic"], seeds=seeds, config=CONFIG,
                                   settings=RunSettings(stages=stages, validation_per_size=VALIDATION_PER_SIZE,
                                                        validation_boards=8,
                                                        grpo={"num_generations": 4, "per_device_train_batch_size": 32}))
    run_all(engine)
    return experiment


def running_stage_1(engine) -> Job | None:
    """Stage 1's job while a worker runs it, else None."""
    with session(engine) as s:
        return s.exec(select(Job).where(Job.kind == "stage", Job.target == 1, Job.status == "running")).first()


def nothing_lost_nothing_twice(engine, runs, boards: int = 4) -> list[Job]:
    """Every run of a 1-stage experiment with `boards` validation boards is done, with one job per (run, kind,
    target), all done, `boards` episodes per (run, stage) and one proposal per run; returns the jobs."""
    with session(engine) as s:
        jobs = s.exec(select(Job)).all()
        episodes = s.exec(select(Episode).where(Episode.split == "validation")).all()
        proposals = s.exec(select(Proposal)).all()
    assert {r.status for r in runs} == {"done"}
    assert Counter((j.run_id, j.kind, j.target) for j in jobs) == Counter(
        {(r.id, kind, k): 1 for r in runs for kind, k in (("stage", 0), ("propose", 0), ("stage", 1))})
    assert {j.status for j in jobs} == {"done"}
    assert Counter((e.run_id, e.stage_index) for e in episodes) == {(r.id, k): boards for r in runs for k in (0, 1)}
    assert Counter((p.run_id, p.after_stage) for p in proposals) == {(r.id, 0): 1 for r in runs}
    return jobs
