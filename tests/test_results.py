"""One reading of a stage's results (docs/results.md): the tally's rates, the summary `lab.results` reads, and
the page, the engineer's context and `envlab run` showing the same numbers from it."""

from __future__ import annotations

import pytest

from envsim.instance import Instance
from envsim.scoring import Tally, score_answer
from envsim.solver import label
from envsim.suite import Split
from lab.context import load_stage_result
from lab.pages import review
from lab.results import outcome_of, stage_summaries
from storage.db import session
from storage.models import Episode


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
