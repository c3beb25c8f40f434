"""The engineer's context: exact text per module for a hand-built Evidence, and evidence read from the database."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest
from sqlalchemy import Engine

from envsim.config import EnvConfig
from envsim.instance import Instance
from envsim.scoring import Tally, score_answer
from envsim.suite import Split
from lab.context import (
    CONTEXT_PRESETS,
    BoardOutcome,
    ContextModules,
    Evidence,
    FailureCase,
    StageResult,
    build_context,
    guideline,
    load_stage_result,
)
from storage.db import session
from storage.models import Episode, Run, Stage, StageMetric
from storage.settings import RunSettings
from training.probe import ProbeResult, SizeProbe

T, F = True, False
MEASURED = ProbeResult({3: SizeProbe.of(3, [[T, T], [T, T]], [[T, F], [F, F]]),
                        4: SizeProbe.of(4, [[T, F], [T, T]], [[F, F], [T, F]]),
                        5: SizeProbe.of(5, [[F, F], [F, F]], [[F, F], [F, F]])},
                       {3: 0.5, 4: 0.25, 5: 0.25}, 12, 0.5)

BOARD = Instance.from_str("""
A.H
.a.
B.b
""")
ANSWER = "Agent 0: RIGHT RIGHT\nAgent 1: RIGHT RIGHT"
CONFIG = EnvConfig.default((3, 4, 5))
SECOND = EnvConfig(data_ratio={3: 0.5, 4: 0.25, 5: 0.25}, hole_ratio={3: 0.3, 4: 0.2, 5: 0.1},
                   wait_ratio={3: 0.25, 4: 0.5, 5: 0.25})


def evidence() -> Evidence:
    current = StageResult(2, SECOND, {
        3: Tally(10, 9, 8, {"hole": 1}),
        4: Tally(10, 5, 2, {"vertex_conflict": 4, "hole": 1}),
        5: Tally(10, 0, 0, {"goal_not_reached": 3, "hole": 7}),
    }, (FailureCase(BOARD, ANSWER, score_answer(BOARD, ANSWER)),))
    stage0 = StageResult(0, CONFIG, {3: Tally(10, 5, 5, {"hole": 5})})
    stage1 = StageResult(1, CONFIG, {3: Tally(10, 6, 4, {"hole": 3, "edge_conflict": 1}),
                                     4: Tally(10, 2, 1, {"hole": 8})})
    return Evidence(current, (stage0, stage1), round_index=3, rounds_left=2, instances_per_stage=128,
                    hyperparameters={"learning_rate": 1e-5, "beta": 0.0}, self_summary="  I lowered the holes.  ",
                    measured=MEASURED)


SECTIONS = {
    "bookkeeping": """\
## Round
You are choosing the environment config of stage 3, after stage 2 was evaluated. Training stages left, this one \
included: 2. Each stage trains on 128 instances.""",
    "failure_breakdown": """\
## Failure breakdown of stage 2 (dev set, per map size)
| size | episodes | valid | optimal | hole | vertex_conflict | goal_not_reached |
|---|---|---|---|---|---|---|
| 3 | 10 | 90% | 80% | 1 | 0 | 0 |
| 4 | 10 | 50% | 20% | 1 | 4 | 0 |
| 5 | 10 | 0% | 0% | 7 | 0 | 3 |
| all | 30 | 47% | 33% | 9 | 4 | 3 |""",
    "history": """\
## Earlier stages (oldest first): config and results per map size
### Stage 1
agent_ratio {"2": 1}, num_instances 512
| size | data_ratio | hole_ratio | wait_ratio | valid | optimal | most common failure |
|---|---|---|---|---|---|---|
| 3 | 0.333 | 0.2 | 0.25 | 60% | 40% | hole (3) |
| 4 | 0.333 | 0.2 | 0.25 | 20% | 10% | hole (8) |
| 5 | 0.333 | 0.2 | 0.25 | - | - | - |""",
    "history_with_default": """\
## Earlier stages (oldest first): config and results per map size
### Stage 0 (the round-0 default config)
agent_ratio {"2": 1}, num_instances 512
| size | data_ratio | hole_ratio | wait_ratio | valid | optimal | most common failure |
|---|---|---|---|---|---|---|
| 3 | 0.333 | 0.2 | 0.25 | 50% | 50% | hole (5) |
| 4 | 0.333 | 0.2 | 0.25 | - | - | - |
| 5 | 0.333 | 0.2 | 0.25 | - | - | - |
### Stage 1
agent_ratio {"2": 1}, num_instances 512
| size | data_ratio | hole_ratio | wait_ratio | valid | optimal | most common failure |
|---|---|---|---|---|---|---|
| 3 | 0.333 | 0.2 | 0.25 | 60% | 40% | hole (3) |
| 4 | 0.333 | 0.2 | 0.25 | 20% | 10% | hole (8) |
| 5 | 0.333 | 0.2 | 0.25 | - | - | - |""",
    "failure_cases": """\
## Failed answers from stage 2
### Case 1: size 3, 2 agents, hole
Board (A, B, ... starts; a, b, ... goals; H holes):
A.H
.a.
B.b
Answer:
Agent 0: RIGHT RIGHT
Agent 1: RIGHT RIGHT
Outcome: hole: agent 0 falls into the hole at (0,2), t=2""",
    "guideline": """\
## The knobs
Per map size (the keys are the map sizes 3, 4, 5):
- data_ratio: share of the stage's training instances drawn at this map size (the shares sum to 1); 0 to 1
- hole_ratio: share of the board's cells that are holes; 0 to 0.5
- wait_ratio: share of this size's instances whose optimal plans need a WAIT; 0 to 1
Global:
- agent_ratio: share of the stage's training instances with this many agents (the keys are agent counts; the \
shares sum to 1); agent counts 1 to 8, each share 0 to 1
- num_instances: training instances in the stage; 1 to 100000
A value outside its range is clamped into it, and data_ratio and agent_ratio are rescaled to sum to 1.""",
    "hyperparameters": """\
## Training hyperparameters
- beta: 0.0
- learning_rate: 1e-05""",
    "self_summary": """\
## Your summary of the earlier rounds
I lowered the holes.""",
    "measured": """\
## The current config measured on the policy (stage 2's checkpoint)
Each size: 2 boards drawn from the config, each answered 2 times by sampling as training does. GRPO learns only \
from boards whose answers disagree: learnability is the mean over boards of p_b(1-p_b), p_b a board's share of \
valid answers (at most 0.25).
| size | data_ratio | valid p | learnability | boards with no valid answer | boards all valid | verdict |
|---|---|---|---|---|---|---|
| 3 | 0.5 | 100% | 0.000 | 0% | 100% | too easy |
| 4 | 0.25 | 75% | 0.125 | 0% | 50% | learnable |
| 5 | 0.25 | 0% | 0.000 | 100% | 0% | too hard |
Boards that carry signal, weighted by data_ratio: 12%.""",
}
ORDER = ["bookkeeping", "failure_breakdown", "history", "failure_cases", "guideline", "hyperparameters",
         "self_summary", "measured"]


@pytest.mark.parametrize("module", [f.name for f in fields(ContextModules)])
def test_each_module_alone_is_exactly_its_section(module: str) -> None:
    only = replace(ContextModules.none(), **{module: True})
    assert build_context(evidence(), only) == SECTIONS[module]


@pytest.mark.parametrize("module", [f.name for f in fields(ContextModules) if f.name != "history_with_default"])
def test_turning_one_module_off_removes_exactly_its_section(module: str) -> None:
    without = replace(ContextModules.every(), history_with_default=False, **{module: False})
    expected = [SECTIONS[name] for name in ORDER if name != module]
    assert build_context(evidence(), without) == "\n\n".join(expected)


def test_paper_best_is_breakdown_guideline_history_without_default_and_bookkeeping() -> None:
    best = ContextModules.paper_best()
    assert {f.name for f in fields(best) if getattr(best, f.name)} == {
        "failure_breakdown", "guideline", "history", "bookkeeping"}
    assert build_context(evidence()) == "\n\n".join(
        SECTIONS[m] for m in ("bookkeeping", "failure_breakdown", "history", "guideline"))


def test_history_with_default_includes_stage_zero_and_the_rest() -> None:
    text = build_context(evidence(), ContextModules.every())
    assert SECTIONS["history_with_default"] in text
    assert text.count("### Stage 1") == 1


def test_empty_evidence_says_so_instead_of_leaving_a_section_blank() -> None:
    bare = Evidence(StageResult(0, CONFIG, {}), round_index=1, rounds_left=4)
    text = build_context(bare, ContextModules.every())
    assert "No dev results were recorded for this stage." in text
    assert "## Earlier stages (oldest first): config and results per map size\nNone yet." in text
    assert "No failed answers were recorded." in text
    assert text.endswith("## The current config measured on the policy (stage 0's checkpoint)\nNot measured.")
    assert "## Training hyperparameters\nNot given." in text
    assert "## Your summary of the earlier rounds\nNone yet." in text
    assert "Each stage trains on 512 instances." in text  # the config's num_instances when not given


def test_a_long_answer_is_cut_in_the_failure_case() -> None:
    long = "Agent 0: " + "UP " * 400
    ev = evidence()
    ev = replace(ev, current=replace(ev.current, cases=(FailureCase(BOARD, long, score_answer(BOARD, long)),)))
    text = build_context(ev, replace(ContextModules.none(), failure_cases=True))
    assert f"... ({len(long.strip()) - 600} more characters)" in text


def test_context_is_deterministic() -> None:
    assert build_context(evidence(), ContextModules.every()) == build_context(evidence(), ContextModules.every())


# ---------------------------------------------------------------- from the database


def _episode(run_id: int, stage: int, size: int, failure: str | None, n: int, split: str = "dev") -> Episode:
    board = BOARD if size == 3 else Instance(size=size, holes=(), starts=((0, 0), (0, 1)), goals=((1, 0), (1, 1)))
    answer = f"Agent 0: DOWN\nAgent 1: DOWN  # {n}"
    outcome = score_answer(board, answer if failure is None else ANSWER if size == 3 else "nonsense")
    return Episode(run_id=run_id, stage_index=stage, split=split, instance_id=board.id,
                   instance=board.model_dump(mode="json"), size=size, num_agents=2,
                   completion=answer if failure is None else f"answer {n}", outcome=outcome.to_dict(),
                   valid=failure is None, optimal=failure is None, failure=failure)


def test_load_stage_result_reads_config_metrics_and_cases(engine: Engine) -> None:
    with session(engine) as s:
        run = Run(name="r", policy="tiny", engineer="heuristic", engineer_backend="", seed=1,
                  settings=RunSettings(stages=1))
        s.add(run)
        s.commit()
        s.add(Stage(run_id=run.id, index=0, config=SECOND.model_dump(mode="json")))
        s.add(StageMetric(run_id=run.id, stage_index=0, split="dev", size=4, agents=2, episodes=10, valid=5,
                          optimal=2, failures={"hole": 5}))
        s.add(StageMetric(run_id=run.id, stage_index=0, split="dev", size=3, agents=2, episodes=10, valid=9,
                          optimal=8, failures={"hole": 1}))
        s.add(StageMetric(run_id=run.id, stage_index=0, split="validation", size=5, agents=2, episodes=10, valid=0,
                          optimal=0, failures={"hole": 10}))  # the score: never read by an engineer
        for n in range(5):
            s.add(_episode(run.id, 0, 5, "parse_error", 100 + n, split="validation"))
        s.add(StageMetric(run_id=run.id, stage_index=0, split="benchmark", size=3, agents=3, episodes=50, valid=1,
                          optimal=0, failures={"hole": 49}))
        # parse errors are the most common (3), then holes (2), then one vertex conflict.
        for n, (size, failure) in enumerate([(3, "hole"), (4, "parse_error"), (4, "parse_error"), (3, None),
                                             (4, "vertex_conflict"), (3, "hole"), (4, "parse_error")]):
            s.add(_episode(run.id, 0, size, failure, n))
        s.add(_episode(run.id, 1, 3, "hole", 99))
        s.commit()

        result = load_stage_result(s, run.id, 0, cases=4)
        assert result.stage_index == 0
        assert result.config == SECOND
        assert result.by_size == {3: Tally(10, 9, 8, {"hole": 1}), 4: Tally(10, 5, 2, {"hole": 5})}
        # one per type, most common first, then the second of the most common type
        assert [c.completion for c in result.cases] == ["answer 1", "answer 0", "answer 4", "answer 2"]
        assert result.cases[1].instance == BOARD
        assert result.cases[1].outcome == score_answer(BOARD, ANSWER)
        # every dev board, board by board, in stored order: BOARD has 1 hole of 9
        assert [(b.size, b.hole_ratio, b.valid, b.failure) for b in result.boards] == [
            (3, 0.1111, False, "hole"), (4, 0.0, False, "parse_error"), (4, 0.0, False, "parse_error"),
            (3, 0.1111, True, None), (4, 0.0, False, "vertex_conflict"), (3, 0.1111, False, "hole"),
            (4, 0.0, False, "parse_error")]
        assert [(b.agents, b.optimal) for b in result.boards] == [(2, False)] * 3 + [(2, True)] + [(2, False)] * 3
        assert load_stage_result(s, run.id, 0, split=Split.VALIDATION).by_size == {5: Tally(10, 0, 0, {"hole": 10})}
        assert load_stage_result(s, run.id, 0, cases=0).cases == ()
        with pytest.raises(LookupError, match="no stage 5"):
            load_stage_result(s, run.id, 5)


def test_presets_hold_the_modules_their_names_say():
    on = {name: {f.name for f in fields(ContextModules) if getattr(m, f.name)} for name, m in CONTEXT_PRESETS.items()}
    assert on == {
        "paper-best": {"failure_breakdown", "guideline", "history", "bookkeeping"},
        "failures-only": {"failure_breakdown"},
        "no-history": {"failure_breakdown", "guideline", "bookkeeping"},
        "with-default": {"failure_breakdown", "guideline", "history", "history_with_default", "bookkeeping"},
        "full": {f.name for f in fields(ContextModules)},
    }
    ev = evidence()
    assert build_context(ev, CONTEXT_PRESETS["failures-only"]).startswith("## Failure breakdown of stage")
    assert "(the round-0 default config)" in build_context(ev, CONTEXT_PRESETS["with-default"])
    assert "(the round-0 default config)" not in build_context(ev, CONTEXT_PRESETS["paper-best"])
    assert "## Earlier stages" not in build_context(ev, CONTEXT_PRESETS["no-history"])


def test_the_breakdown_counts_the_boards_per_agent_count_where_they_had_several() -> None:
    boards = (BoardOutcome(3, 0.2, False, True, None, 2, True), BoardOutcome(4, 0.2, False, False, "hole", 2),
              BoardOutcome(3, 0.2, False, True, None, 3), BoardOutcome(5, 0.2, True, False, "vertex_conflict", 3))
    current = replace(evidence().current, boards=boards)
    only = ContextModules.none()
    text = build_context(replace(evidence(), current=current), replace(only, failure_breakdown=True))
    assert text == SECTIONS["failure_breakdown"] + """

The same boards per agent count:
| agents | episodes | valid | optimal | hole | vertex_conflict |
|---|---|---|---|---|---|
| 2 | 2 | 50% | 50% | 1 | 0 |
| 3 | 2 | 50% | 0% | 0 | 1 |
| all | 4 | 50% | 25% | 1 | 1 |"""
    one_count = replace(current, boards=boards[:2])  # one agent count: the breakdown as before
    assert build_context(replace(evidence(), current=one_count), replace(only, failure_breakdown=True)) == \
        SECTIONS["failure_breakdown"]


def test_the_guideline_names_the_runs_agent_counts() -> None:
    text = guideline(CONFIG, (2, 3, 4))
    assert ("- agent_ratio: share of the stage's training instances with this many agents (the keys are agent counts; "
            "the shares sum to 1); the run's agent counts 2, 3, 4 only, each share 0 to 1") in text
    assert guideline(CONFIG) == SECTIONS["guideline"]
