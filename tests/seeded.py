"""A lab seeded through the real lab functions, for the page's tests: two runs with stages, episodes, proposals
and decisions. `lab.loop` creates runs and moves them, `storage.queue` moves jobs, the real heuristic engineer
proposes through `lab.loop.run_propose_job`, and episodes are real scored answers. Only what a trained policy
would have answered is scripted (`answers`), since training is tested elsewhere."""

from __future__ import annotations

import sqlite3
from collections import Counter
from contextlib import closing
from pathlib import Path

from sqlmodel import select

from envsim.config import EnvConfig, project
from envsim.instance import Instance
from envsim.parser import format_plan
from envsim.scoring import score_answer
from envsim.solver import label
from lab.engineers import EngineerAnswer
from lab.loop import advance, create_run, run_propose_job, stages_of
from lab.proposals import store_proposal
from storage.db import make_engine, session, upgrade
from storage.models import Episode, Stage, StageMetric, TrainingLog, utcnow
from storage.queue import claim, finish
from storage.settings import RunSettings
from tests.boards import CROSSING, OPEN

SIZES = (3, 4)
CROSSING_CLASH = "Agent 0: DOWN DOWN\nAgent 1: RIGHT RIGHT"  # both enter (1,1) at t=1: a vertex conflict
OPEN_OFF_GRID = "Agent 0: UP RIGHT\nAgent 1: DOWN"  # agent 0 leaves the grid at t=1 (illegal move)
HOLEY = Instance.from_str("""
A..a
.HH.
....
B..b
""")


def boards() -> dict[str, Instance]:
    return {name: label(b) for name, b in (("crossing", CROSSING), ("open", OPEN), ("holey", HOLEY))}


def answers(stage_index: int, b: dict[str, Instance]) -> list[tuple[Instance, str]]:
    """What the policy answered at a stage: stage 0 fails on every board, later stages solve two of three."""
    if stage_index == 0:
        return [(b["crossing"], CROSSING_CLASH), (b["open"], OPEN_OFF_GRID),
                (b["holey"], "Agent 0: DOWN RIGHT\nAgent 1: RIGHT")]
    return [(b["crossing"], CROSSING_CLASH), (b["open"], format_plan(b["open"].reference_plan)),
            (b["holey"], format_plan(b["holey"].reference_plan))]


def record_evaluation(engine, run_id: int, stage_index: int, split: str = "validation") -> None:
    """Store a stage's scored episodes and their sums per (size, agent count), as the stage job does after
    training."""
    per_cell: dict[tuple[int, int], dict] = {}
    with session(engine) as s:
        for inst, text in answers(stage_index, boards()):
            o = score_answer(inst, text)
            s.add(Episode(run_id=run_id, stage_index=stage_index, split=split, instance_id=inst.id,
                          instance=inst.model_dump(mode="json"), size=inst.size, num_agents=inst.num_agents,
                          completion=text, outcome=o.to_dict(), valid=o.valid, optimal=o.optimal,
                          failure=None if o.failure is None else o.failure.value))
            m = per_cell.setdefault((inst.size, inst.num_agents),
                                    {"episodes": 0, "valid": 0, "optimal": 0, "failures": Counter()})
            m["episodes"] += 1
            m["valid"] += o.valid
            m["optimal"] += o.optimal
            if o.failure is not None:
                m["failures"][o.failure.value] += 1
        for (size, agents), m in per_cell.items():
            s.add(StageMetric(run_id=run_id, stage_index=stage_index, split=split, size=size, agents=agents,
                              episodes=m["episodes"], valid=m["valid"], optimal=m["optimal"],
                              failures=dict(m["failures"])))
        s.commit()


def finish_stage(engine, run_id: int, stage_index: int) -> None:
    """The worker's part of a stage job, without the training: claim the job, evaluate, log, finish."""
    with session(engine) as s:
        job = claim(s, "test-worker")
        assert job.kind == "stage" and job.payload == {"run_id": run_id, "stage_index": stage_index}
    record_evaluation(engine, run_id, stage_index)
    with session(engine) as s:
        if stage_index > 0:
            for step in range(1, 6):
                s.add(TrainingLog(run_id=run_id, stage_index=stage_index, step=step,
                                  metrics={"reward": 0.1 * step, "loss": 1.0 / step, "kl": 0.01 * step}))
        stage = s.exec(select(Stage).where(Stage.run_id == run_id, Stage.index == stage_index)).one()
        stage.status, stage.finished_at = "done", utcnow()
        s.add(stage)
        s.commit()
        finish(s, job.id, {"stage_index": stage_index})


def propose(engine, run_id: int) -> int:
    """Queue and run the real `propose` job (the heuristic engineer); returns the proposal id."""
    advance(engine, run_id)
    with session(engine) as s:
        job = claim(s, "test-worker")
        assert job.kind == "propose"
    result = run_propose_job(engine, job, lambda *a, **k: False)
    with session(engine) as s:
        finish(s, job.id, result)
    return result["proposal_id"]


def clamped_proposal(engine, run_id: int) -> int:
    """A proposal whose hole_ratio[4] (0.9) the projection clamps to 0.5, stored as `store_proposal` does."""
    with session(engine) as s:
        base = EnvConfig.model_validate(stages_of(s, run_id)[-1].config)
        raw = {"hole_ratio": {"4": 0.9}, "data_ratio": {"3": 0.25, "4": 0.75}}
        answer = EngineerAnswer(prompt="(prompt)", raw='{"hole_ratio": {"4": 0.9}}', proposed=raw,
                                projection=project(raw, base), rationale="Size 4 is too easy: more holes there.")
        return store_proposal(s, run_id, stages_of(s, run_id)[-1].index, "llm", answer, base).id


def copy_database(source: Path, target: Path) -> None:
    """A SQLite database copied page by page (SQLite's backup API, so a write-ahead log is folded in)."""
    with closing(sqlite3.connect(source)) as src, closing(sqlite3.connect(target)) as dst:
        src.backup(dst)


def seeded_copy(template: tuple[Path, dict[str, int]], path: Path):
    """A copy of a lab `seed_lab` seeded (`template`: its database and ids, the `seeded_template` fixture) at
    `path`: its engine and the seeded ids. Seeding stores rows only, so the copy is the lab a fresh seeding gives."""
    copy_database(template[0], path)
    return make_engine(str(path)), dict(template[1])


def seed_lab(engine) -> dict[str, int]:
    """Two runs: `history` has trained one stage (stages 0 and 1 evaluated, proposal accepted, a second
    proposal pending); `waiting` has its stage 0 evaluated and a clamped proposal pending."""
    upgrade(engine)
    config = EnvConfig.default(sizes=SIZES, num_instances=16)
    with session(engine) as s:
        history = create_run(s, name="curriculum", config=config, settings=RunSettings(stages=2),
                             engineer="heuristic").id
    finish_stage(engine, history, 0)
    accepted = propose(engine, history)
    with session(engine) as s:
        from lab.proposals import decide
        decide(s, accepted, "accept", "alice")
    advance(engine, history)  # queues stage 1
    finish_stage(engine, history, 1)
    with session(engine) as s:
        waiting = create_run(s, name="llm engineer", config=config, settings=RunSettings(stages=2), engineer="llm",
                             engineer_backend="openai:test").id
    finish_stage(engine, waiting, 0)
    pending = clamped_proposal(engine, waiting)
    advance(engine, waiting)
    second = propose(engine, history)
    advance(engine, history)
    with session(engine) as s:
        failed = s.exec(select(Episode).where(Episode.run_id == history, Episode.stage_index == 1,
                                              Episode.failure == "vertex_conflict")).one().id
    return {"history": history, "waiting": waiting, "accepted": accepted, "pending": pending, "second": second,
            "clash": failed}
