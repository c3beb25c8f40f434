"""One reading of a stage's results (docs/results.md): the tally's rates, the summary `lab.results` reads, and
the page, the engineer's context and `envlab run` showing the same numbers from it."""

from __future__ import annotations

import pytest
from sqlmodel import select

from envsim.config import EnvConfig
from envsim.instance import Instance
from envsim.parser import format_plan
from envsim.scoring import Tally, score_answer
from envsim.solver import label
from envsim.suite import Split
from lab.cli.runs import stage_line
from lab.context import load_stage_result
from lab.pages import review
from lab.results import outcome_of, stage_summaries
from storage.db import session
from storage.models import Episode, Run, Stage, StageMetric
from storage.settings import RunSettings
from tests.boards import CROSSING, OPEN
from training.evaluate import EpisodeResult, store_evaluation, tally_of


def test_a_tally_defines_the_rates_and_sums_into_the_pooled_one():
    three, four = Tally(2, 1, 1, {"hole": 1}), Tally(1, 1, 0, {})
    assert (three.valid_rate, three.optimal_rate, Tally().valid_rate) == (0.5, 0.5, 0.0)
    pooled = Tally.total([three, four])
    assert pooled == Tally(3, 2, 1, {"hole": 1})
    assert pooled.valid_rate == pytest.approx(2 / 3)  # not the mean over sizes, (0.5 + 1.0) / 2
    board = label(Instance.from_str("A.a\n...\n..."))
    outcomes = [score_answer(board, text) for text in ("Agent 0: RIGHT RIGHT", "Agent 0: LEFT")]
    assert Tally.of(outcomes) == Tally(2, 1, 1, {"illegal_move": 1})


def test_the_page_and_the_engineer_read_the_same_summary(lab):
    engine, ids = lab
    with session(engine) as s:
        summaries = stage_summaries(s, ids["history"])
        context = load_stage_result(s, ids["history"], 1, cases=0, split=Split.VALIDATION)
        assert stage_summaries(s, ids["history"], Split.BENCHMARK) == {}
        assert list(stage_summaries(s, ids["history"], stage_index=0)) == [0]
    stage1 = summaries[1]
    assert stage1.by_size == {3: Tally(2, 1, 1, {"vertex_conflict": 1}), 4: Tally(1, 1, 1, {})}
    assert (stage1.pooled.episodes, stage1.pooled.valid) == (3, 2)
    assert context.by_size == stage1.by_size
    r = review.review(engine, ids["history"], 1)
    assert r["table"]["data"][1][3:] == ["66.7%", "66.7%", 3]
    assert r["note"] == "Stage 1: valid 66.7%, optimal 66.7% over 3 validation boards."
    curves = {t.name: list(t.y) for t in r["curves"].data}
    assert curves["pooled valid"][1] == pytest.approx(stage1.pooled.valid_rate)


def test_a_stored_outcome_without_positions_is_scored_again_everywhere(lab):
    engine, ids = lab
    with session(engine) as s:
        ep = s.get(Episode, ids["clash"])
        expected = outcome_of(ep)
        ep.outcome = {k: v for k, v in ep.outcome.items() if k != "positions"}  # a row from before replays
        s.add(ep)
        s.commit()
        assert outcome_of(ep) == expected
        # the engineer's failure cases read it the same way (they used to fail on such a row)
        cases = load_stage_result(s, ids["history"], 1, split=Split.VALIDATION).cases
    assert [c.outcome for c in cases] == [expected]


MIXED = [  # board (agents, size), answer: 2 agents on 3x3, 3 agents on 3x3 and 4x4
    (label(OPEN), None),  # the reference plan: optimal
    (label(CROSSING), "Agent 0: D D\nAgent 1: R R"),  # both enter the centre at t=1: vertex conflict
    (label(Instance.from_str("A.a\nB.b\nC.c")), None),
    (label(Instance.from_str("A.a\nB.b\nC.c")), "hello"),  # unreadable
    (label(Instance.from_str("A..a\nB..b\nC..c\n....")), None),
    (label(Instance.from_str("A..a\nB..b\nC..c\n....")), "Agent 0: W R R R\nAgent 1: R R R\nAgent 2: R R R"),  # late
]


def test_an_evaluation_of_two_and_three_agent_boards_reads_back_per_size_and_per_agent_count(empty_lab):
    engine = empty_lab
    results = [EpisodeResult(board, text := answer or format_plan(board.reference_plan), score_answer(board, text))
               for board, answer in MIXED]
    with session(engine) as s:
        run = Run(name="mixed", policy="tiny", engineer="fixed", engineer_backend="", seed=0,
                  settings=RunSettings(stages=1))
        s.add(run)
        s.commit()
        s.add(Stage(run_id=run.id, index=0, config=EnvConfig.default(), status="done"))
        store_evaluation(s, run.id, 0, Split.VALIDATION, results)
        rows = s.exec(select(StageMetric).order_by(StageMetric.size, StageMetric.agents)).all()
        summary = stage_summaries(s, run.id)[0]
        stage = s.exec(select(Stage)).one()
        line = stage_line(s, stage, 1)
    assert [(m.size, m.agents, tally_of(m)) for m in rows] == [
        (3, 2, Tally(2, 1, 1, {"vertex_conflict": 1})), (3, 3, Tally(2, 1, 1, {"parse_error": 1})),
        (4, 3, Tally(2, 2, 1, {}))]
    # per size: each size's rows summed over agent counts, as one row per size held it before
    assert summary.by_size == {3: Tally(4, 2, 2, {"parse_error": 1, "vertex_conflict": 1}), 4: Tally(2, 2, 1, {})}
    assert summary.by_agents == {2: Tally(2, 1, 1, {"vertex_conflict": 1}), 3: Tally(4, 3, 2, {"parse_error": 1})}
    assert summary.pooled == Tally(6, 4, 3, {"parse_error": 1, "vertex_conflict": 1})
    assert line == ("stage 0/1 done: validation valid 66.7% optimal 50.0% (time unknown; 6 boards, valid by size "
                    "3:50% 4:100%, by agent count 2:50% 3:75%)")
    assert review.review(engine, run.id, 0)["note"] == (
        "Stage 0: valid 66.7%, optimal 50.0% over 6 validation boards.\n\n"
        "| agents | boards | valid | optimal |\n"
        "|---:|---:|---:|---:|\n"
        "| 2 | 2 | 50.0% | 50.0% |\n"
        "| 3 | 4 | 75.0% | 50.0% |")


def test_boards_of_one_agent_count_add_no_table_to_the_review(lab):
    engine, ids = lab
    with session(engine) as s:
        assert list(stage_summaries(s, ids["history"])[1].by_agents) == [2]
    assert "agents" not in review.review(engine, ids["history"], 1)["note"]
