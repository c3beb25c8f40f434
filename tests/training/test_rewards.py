"""The GRPO rewards score scripted answers to exact numbers (formulas in training/rewards.py)."""

from __future__ import annotations

import pytest

from envsim.instance import Instance
from envsim.solver import label
from tests.boards import CROSSING
from training.rewards import (
    DEFAULT_WEIGHTS,
    REWARDS,
    format_reward,
    optimality_reward,
    progress_reward,
    validity_reward,
)

CROSS = label(CROSSING)  # makespan 3, soc 5: agent 0 waits while agent 1 crosses the centre
HOLE = label(Instance.from_str("""
AHa
...
B.b
"""))  # agent 0 must go round the hole: makespan 4, soc 6


def terms(board: Instance, completion) -> tuple[float, float, float, float]:
    """(validity, optimality, format, progress) of one completion on one board."""
    return tuple(f([completion], instance=[board.to_json()])[0] for f in REWARDS)


def test_labels_the_expected_numbers_rest_on():
    assert (CROSS.opt_makespan, CROSS.opt_soc) == (3, 5)
    assert CROSS.reference_plan == (("WAIT", "DOWN", "DOWN"), ("RIGHT", "RIGHT"))
    assert (HOLE.opt_makespan, HOLE.opt_soc) == (4, 6)


@pytest.mark.parametrize(
    ("board", "answer", "expected"),
    [
        # the solver's reference plan: valid, makespan- and SoC-optimal
        (CROSS, "Agent 0: WAIT DOWN DOWN\nAgent 1: RIGHT RIGHT", (1.0, 1.0, 1.0, 1.0)),
        # inside answer tags after some reasoning, short action forms, the compact tokenizer's <nl>
        (CROSS, "I wait first. <answer>Agent 0: W D D <nl> Agent 1: R R</answer>", (1.0, 1.0, 1.0, 1.0)),
        # valid but late: makespan 4 (opt 3), soc 4 + 2 = 6 (opt 5)
        (CROSS, "Agent 0: WAIT WAIT DOWN DOWN\nAgent 1: RIGHT RIGHT", (1.0, (3 / 4 + 5 / 6) / 2, 1.0, 1.0)),
        # both step into the centre at t=1: a vertex conflict; both end home, neither cleanly
        (CROSS, "Agent 0: DOWN DOWN\nAgent 1: RIGHT RIGHT", (0.0, 0.0, 1.0, 0.0)),
        # agent 0 falls into the hole; agent 1 gets home cleanly
        (HOLE, "Agent 0: RIGHT RIGHT\nAgent 1: RIGHT RIGHT", (0.0, 0.0, 1.0, 0.5)),
        # agent 1 stops one cell short: goal_not_reached for agent 1 only
        (HOLE, "Agent 0: DOWN RIGHT RIGHT UP\nAgent 1: RIGHT", (0.0, 0.0, 1.0, 0.5)),
        # a plan for one agent of two: wrong_agent_count
        (CROSS, "Agent 0: WAIT DOWN DOWN", (0.0, 0.0, 0.0, 0.0)),
        # an unknown action word: parse_error
        (CROSS, "Agent 0: WAIT DOWN JUMP\nAgent 1: RIGHT RIGHT", (0.0, 0.0, 0.0, 0.0)),
        # garbage
        (CROSS, "the quick brown fox", (0.0, 0.0, 0.0, 0.0)),
    ],
)
def test_each_term_scores_a_scripted_answer_exactly(board: Instance, answer: str, expected: tuple):
    assert terms(board, answer) == expected


def test_a_conversational_completion_is_read_from_its_last_message():
    chat = [{"role": "assistant", "content": "<answer>\nAgent 0: WAIT DOWN DOWN\nAgent 1: RIGHT RIGHT\n</answer>"}]
    assert terms(CROSS, chat) == (1.0, 1.0, 1.0, 1.0)


def test_a_batch_scores_each_completion_on_its_own_board_and_ignores_trainer_kwargs():
    completions = ["Agent 0: WAIT DOWN DOWN\nAgent 1: RIGHT RIGHT", "Agent 0: RIGHT RIGHT\nAgent 1: RIGHT RIGHT",
                   "nonsense"]
    boards = [CROSS.to_json(), HOLE.to_json(), CROSS.to_json()]
    extra = {"prompts": ["p"] * 3, "completion_ids": [[1]] * 3, "trainer_state": None, "log_metric": print}
    assert validity_reward(completions, instance=boards, **extra) == [1.0, 0.0, 0.0]
    assert optimality_reward(completions, instance=boards, **extra) == [1.0, 0.0, 0.0]
    assert format_reward(completions, instance=boards, **extra) == [1.0, 1.0, 0.0]
    assert progress_reward(completions, instance=boards, **extra) == [1.0, 0.5, 0.0]


def test_weighted_total_of_the_reference_plan_and_of_garbage():
    ref = terms(CROSS, "Agent 0: WAIT DOWN DOWN\nAgent 1: RIGHT RIGHT")
    assert sum(w * r for w, r in zip(DEFAULT_WEIGHTS, ref, strict=True)) == pytest.approx(2.4, abs=1e-12)
    assert sum(w * r for w, r in zip(DEFAULT_WEIGHTS, terms(CROSS, "??"), strict=True)) == 0.0


def test_mismatched_lengths_are_refused():
    with pytest.raises(ValueError, match="2 completions but 1 instances"):
        validity_reward(["a", "b"], instance=[CROSS.to_json()])
