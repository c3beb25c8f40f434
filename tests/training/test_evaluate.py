"""Evaluation: scripted answers give exact per-size sums, a real policy's batched answers are scored in order,
and the rows written to the database (episodes, stage metrics, the benchmark job's) are the right ones."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlmodel import select

from envsim.config import EnvConfig
from envsim.scoring import Tally, score_answer
from envsim.solver import label
from envsim.suite import Entry, write_jsonl
from storage.db import make_engine, runs_root, session
from storage.models import Episode, Job, Run, Stage, StageMetric
from storage.settings import RunSettings
from tests.boards import CROSSING, OPEN
from tests.seeded import copy_database
from training.evaluate import BENCHMARK_FILE, EpisodeResult, evaluate, run_benchmark_job, size_metrics, store_evaluation
from training.policy import build_tiny
from training.progress import Cancelled

SMALL_SHAPE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                   num_key_value_heads=2, head_dim=16)
OPEN_L, CROSSING_L = label(OPEN), label(CROSSING)
SCRIPTED = [  # board, answer: optimal; valid but one step late; agents collide; unreadable
    (OPEN_L, "Agent 0: R R D D\nAgent 1: U U R R"),
    (OPEN_L, "Agent 0: R R D D\nAgent 1: W U U R R"),
    (CROSSING_L, "Agent 0: D D\nAgent 1: R R"),
    (CROSSING_L, "hello"),
]


def _results() -> list[EpisodeResult]:
    return [EpisodeResult(board, text, score_answer(board, text)) for board, text in SCRIPTED]


@pytest.fixture
def engine(tmp_path: Path, migrated_template: Path):
    copy_database(migrated_template, tmp_path / "lab.db")
    engine = make_engine(f"sqlite:///{tmp_path / 'lab.db'}")
    yield engine
    engine.dispose()


def _run(engine, **settings) -> int:
    with session(engine) as s:
        run = Run(name="t", policy="tiny", engineer="fixed", engineer_backend="none", seed=0,
                  settings=RunSettings(stages=1, **settings))
        s.add(run)
        s.commit()
        return run.id


def test_size_metrics_of_scripted_answers() -> None:
    assert size_metrics(_results()) == {3: Tally(episodes=4, valid=2, optimal=1,
                                                 failures={"parse_error": 1, "vertex_conflict": 1})}


def test_evaluate_scores_batched_answers_in_order() -> None:
    policy = build_tiny(seed=3, **SMALL_SHAPE)
    boards = [OPEN_L, CROSSING_L, OPEN_L]
    calls = []
    results = evaluate(policy, boards, batch_size=2, max_new_tokens=6, progress=lambda d, t: calls.append((d, t)))
    assert [r.instance for r in results] == boards
    assert results[0].completion == results[2].completion  # same board, greedy: same answer
    assert all(r.outcome == score_answer(r.instance, r.completion) for r in results)
    assert calls == [(2, 3), (3, 3)]  # after each batch
    with pytest.raises(Cancelled, match="cancelled after 3 of 3 episodes"):
        evaluate(policy, boards, max_new_tokens=2, progress=lambda d, t: d == 3)


def test_store_evaluation_writes_episodes_and_metrics(engine) -> None:
    run_id = _run(engine)
    with session(engine) as s:
        store_evaluation(s, run_id, 2, "validation", _results())
    with session(engine) as s:
        episodes = s.exec(select(Episode).order_by(Episode.id)).all()
        metrics = s.exec(select(StageMetric)).all()
    assert [(e.stage_index, e.split, e.size, e.num_agents, e.valid, e.optimal, e.failure) for e in episodes] == [
        (2, "validation", 3, 2, True, True, None),
        (2, "validation", 3, 2, True, False, None),
        (2, "validation", 3, 2, False, False, "vertex_conflict"),
        (2, "validation", 3, 2, False, False, "parse_error"),
    ]
    assert episodes[1].plan == [["RIGHT", "RIGHT", "DOWN", "DOWN"], ["WAIT", "UP", "UP", "RIGHT", "RIGHT"]]
    assert episodes[3].plan is None
    assert episodes[0].instance_id == OPEN_L.id and episodes[0].instance["opt_makespan"] == 4
    assert episodes[1].outcome["makespan"] == 5 and episodes[2].completion == "Agent 0: D D\nAgent 1: R R"
    assert [(m.size, m.episodes, m.valid, m.optimal, m.failures) for m in metrics] == [
        (3, 4, 2, 1, {"parse_error": 1, "vertex_conflict": 1})]


def test_benchmark_job_evaluates_the_stage_checkpoint(engine, tmp_path: Path) -> None:
    run_id = _run(engine)
    checkpoint = build_tiny(seed=4, **SMALL_SHAPE).save(tmp_path / "stage-0")
    with session(engine) as s:
        s.add(Stage(run_id=run_id, index=0, config=EnvConfig.default(), status="done", checkpoint=str(checkpoint)))
        s.commit()
    # A cached benchmark file is read instead of building the 3,150 boards.
    cache = runs_root(engine) / BENCHMARK_FILE  # one cache for every run of the database
    write_jsonl([Entry(split="benchmark", subset=0.25, instance=b) for b in (OPEN_L, CROSSING_L)], cache)
    lines = []
    result = run_benchmark_job(engine, Job(kind="benchmark", payload={"run_id": run_id, "stage_index": 0}),
                               lambda step, total, line=None, result=None: lines.append(line) and False)
    assert result["checkpoint"] == str(checkpoint) and result["episodes"] == 2
    assert set(result["by_size"]) == {"2x3"}
    with session(engine) as s:
        episodes = s.exec(select(Episode).where(Episode.split == "benchmark")).all()
        metric = s.exec(select(StageMetric).where(StageMetric.split == "benchmark")).one()
    assert [e.instance_id for e in episodes] == [OPEN_L.id, CROSSING_L.id]
    assert (metric.size, metric.episodes, metric.valid) == (3, 2, result["valid"])
    assert "valid rate / optimal rate" in lines[-1]
