"""The answer parser: every tolerance and every strictness rule of its grammar, with exact expected plans."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envsim.parser import Parsed, format_plan, parse
from envsim.prompts import compact_answer, compact_tokens
from envsim.rules import ACTIONS, Failure

R, D, L, U, W = "RIGHT", "DOWN", "LEFT", "UP", "WAIT"

READABLE = [
    # (answer, num_agents, expected plan)
    ("Agent 0: RIGHT DOWN WAIT DOWN\nAgent 1: LEFT UP", 2, ((R, D, W, D), (L, U))),
    ("agent 0: right down\nAGENT 1: Left", 2, ((R, D), (L,))),
    ("Agent 0: U D L R W", 1, ((U, D, L, R, W),)),
    ("Agent 0: r d, l ; u", 1, ((R, D, L, U),)),
    ("Agent 0: [UP, DOWN]\nAgent 1: (LEFT; RIGHT)", 2, ((U, D), (L, R))),
    ('Agent 0: "UP","DOWN"\nAgent 1: \'L\', \'R\'', 2, ((U, D), (L, R))),
    ("Agent 0: UP -> DOWN => LEFT → RIGHT", 1, ((U, D, L, R),)),
    ("Agent 0: “UP” ‘DOWN’ `WAIT` | RIGHT", 1, ((U, D, W, R),)),
    ("Agent 0: UP DOWN.", 1, ((U, D),)),
    ("**Agent 0:** UP\n**Agent 1**: DOWN", 2, ((U,), (D,))),
    ("- Agent 0: UP\n* Agent 1: DOWN\n+ Agent 2: LEFT\n• Agent 3: RIGHT", 4, ((U,), (D,), (L,), (R,))),
    ("1. Agent 0: UP\n2) **Agent 1:** DOWN", 2, ((U,), (D,))),
    ("## Agent 0: UP\n> Agent 1: DOWN", 2, ((U,), (D,))),
    ("```\nAgent 0: UP\nAgent 1: DOWN\n```", 2, ((U,), (D,))),
    ("`Agent 0: UP DOWN`", 1, ((U, D),)),
    ("_Agent 0_: **UP** *DOWN*", 1, ((U, D),)),
    ("Agent 0 = UP DOWN\nA1: LEFT\nagent2: WAIT", 3, ((U, D), (L,), (W,))),
    ("Agent_0: UP\nAgent #1: DOWN\na2 : LEFT", 3, ((U,), (D,), (L,))),
    ("Agent 0:\nAgent 1: UP", 2, ((), (U,))),
    ("Agent 0: []", 1, ((),)),
    ("Agent 00: UP", 1, ((U,),)),
    ("Agent 1: UP\nAgent 0: DOWN", 2, ((D,), (U,))),
    ("\r\n  Agent 0: UP\r\nAgent 1: DOWN\r\n", 2, ((U,), (D,))),
    ("Agent 0 <nl> Agent 0 : R D <nl> Agent 1 : L", 2, ((R, D), (L,))),
    # Cell notes (where a move leads) are skipped, bracketed or not, wherever they stand.
    ("Agent 0: R (0,1) D [1, 1]\nAgent 1: (2,0) U (1,0)", 2, ((R, D), (U,))),
    ("Agent 0 : 0 , 0 R 0 , 1 <nl> Agent 1 : 1 , 0 W 1 , 0", 2, ((R,), (W,))),
    ("Agent 0: RIGHT -> (0, 1), DOWN -> (1, 1)", 1, ((R, D),)),
    ("Agent 0: R(0,1)D(1,1)", 1, ((R, D),)),
    ("Agent 0: 0 , 0\nAgent 1: 12,10 L 12,9", 2, ((), (L,))),
    ("Agent 0 : 1 0 , 1 0 U 9 , 1 0 L 9 , 9", 1, ((U, L),)),
    # Prose around the plan is skipped: no colon right after the agent label.
    ("Agent 0 should go right first, then down.\nAgent 1 waits.\nAgent 0: R D\nAgent 1: W\nDone.",
     2, ((R, D), (W,))),
    ("Agents 0 and 1 must not swap.\nAgent 0: R\nAgent 1: L", 2, ((R,), (L,))),
    ("The plan. Agent 0: R R\nAgent 0: D", 1, ((D,),)),
    # Answer tags: only the last block is read.
    ("Draft:\nAgent 0: UP\n<answer>\nAgent 0: DOWN\n</answer>", 1, ((D,),)),
    ("<answer>Agent 0: UP</answer> on second thought <ANSWER>Agent 0: LEFT</ANSWER>", 1, ((L,),)),
    ("< answer >\nAgent 0: UP\n< / answer >\nAgent 0: DOWN", 1, ((U,),)),
    ("<answer>\nAgent 0: UP\nAgent 1: DOWN", 2, ((U,), (D,))),  # closing tag cut by a stop string
    ("Agent 0: UP\nAgent 1: DOWN\n</answer>\nAgent 0: LEFT", 2, ((U,), (D,))),  # the prompt opened the block
]


@pytest.mark.parametrize(("text", "k", "plan"), READABLE)
def test_readable_answers(text: str, k: int, plan: tuple) -> None:
    assert parse(text, k) == Parsed(plan=plan)


UNREADABLE = [
    # (answer, num_agents, failure, exact message)
    ("Agent 0: UP JUMP", 1, Failure.PARSE_ERROR, "unknown action 'JUMP' for agent 0 on line 1"),
    ("hello\nAgent 0: UP\nAgent 1: go right", 2, Failure.PARSE_ERROR,
     "unknown action 'go' for agent 1 on line 3"),
    ("Agent 0: start (0,0)\nAgent 0: R", 1, Failure.PARSE_ERROR,
     "unknown action 'start' for agent 0 on line 1"),
    ("Agent 0: R 3", 1, Failure.PARSE_ERROR, "unknown action '3' for agent 0 on line 1"),
    ("Agent 0: R 1 2", 1, Failure.PARSE_ERROR, "unknown action '12' for agent 0 on line 1"),
    ("Agent 0: R 0 , 1 , 2", 1, Failure.PARSE_ERROR, "unknown action '2' for agent 0 on line 1"),
    ("Agent 0: R (0,-1)", 1, Failure.PARSE_ERROR, "unknown action '0' for agent 0 on line 1"),
    ("Agent 0: UP/DOWN", 1, Failure.PARSE_ERROR, "unknown action 'UP/DOWN' for agent 0 on line 1"),
    ("Agent 0: R Agent 1: L", 2, Failure.PARSE_ERROR, "unknown action 'Agent' for agent 0 on line 1"),
    ("Agent 0: " + "X" * 50, 1, Failure.PARSE_ERROR, f"unknown action '{'X' * 20}...' for agent 0 on line 1"),
    # parse_error beats wrong_agent_count, whatever the line order
    ("Agent 0: UP\nAgent 0: DOWN\nAgent 1: FLY", 2, Failure.PARSE_ERROR,
     "unknown action 'FLY' for agent 1 on line 3"),
    ("", 1, Failure.PARSE_ERROR, "no agent lines (expected 'Agent 0: UP RIGHT ...')"),
    ("I would move right, then down.", 1, Failure.PARSE_ERROR,
     "no agent lines (expected 'Agent 0: UP RIGHT ...')"),
    ("Agent 0 should go right first", 1, Failure.PARSE_ERROR,
     "no agent lines (expected 'Agent 0: UP RIGHT ...')"),
    ("<answer></answer>", 1, Failure.PARSE_ERROR, "the last <answer> block is empty"),
    ("<answer>Agent 0: UP</answer> <answer>\n \n</answer>", 1, Failure.PARSE_ERROR,
     "the last <answer> block is empty"),
    ("reasoning...\n<answer>\n", 1, Failure.PARSE_ERROR, "the last <answer> block is empty and not closed"),
    ("<answer>\nAgent 0: UP\nAgent 1: DO", 2, Failure.PARSE_ERROR,
     "unknown action 'DO' for agent 1 on line 3 (the last <answer> block is not closed)"),
    ("<answer>\nmy plan\n</answer>", 1, Failure.PARSE_ERROR,
     "no agent lines (expected 'Agent 0: UP RIGHT ...')"),
    ("Agent 0: UP\nAgent 1: DOWN\nAgent 1: DOWN", 2, Failure.WRONG_AGENT_COUNT,
     "agent 1 has two plans (lines 2 and 3)"),
    ("Draft:\nAgent 0: UP\nFinal:\nAgent 0: DOWN", 1, Failure.WRONG_AGENT_COUNT,
     "agent 0 has two plans (lines 2 and 4)"),
    ("A0: UP\nAgent 0: DOWN", 1, Failure.WRONG_AGENT_COUNT, "agent 0 has two plans (lines 1 and 2)"),
    ("Agent 0: UP", 2, Failure.WRONG_AGENT_COUNT, "no plan for agent 1"),
    ("Agent 1: UP", 3, Failure.WRONG_AGENT_COUNT, "no plan for agents 0, 2"),
    ("Agent 0: UP\nAgent 1: UP\nAgent 2: UP", 2, Failure.WRONG_AGENT_COUNT,
     "agent 2 on line 3 does not exist (2 agents)"),
    ("Agent 0: UP\nAgent 12345678: UP", 1, Failure.WRONG_AGENT_COUNT,
     "agent 123456... on line 2 does not exist (1 agent)"),
    ("<answer>\nAgent 0: UP\nAgent 0: UP", 1, Failure.WRONG_AGENT_COUNT,
     "agent 0 has two plans (lines 2 and 3) (the last <answer> block is not closed)"),
]


@pytest.mark.parametrize(("text", "k", "failure", "message"), UNREADABLE)
def test_unreadable_answers(text: str, k: int, failure: Failure, message: str) -> None:
    assert parse(text, k) == Parsed(plan=None, failure=failure, message=message)


@pytest.mark.parametrize("junk", [None, b"Agent 0: UP", 42, ["Agent 0: UP"]])
def test_non_text_is_a_parse_error(junk: object) -> None:
    result = parse(junk, 1)  # type: ignore[arg-type]
    assert result.plan is None and result.failure == Failure.PARSE_ERROR
    assert type(junk).__name__ in result.message


MEGABYTES = [
    # (text, expected plan for one agent, or None for a failure): each must be read in one pass
    (" " * 1_000_000 + "x", None),
    ("Agent" + " " * 1_000_000, None),
    ("#" * 1_000_000 + "Agent 0 x", None),
    ("<" * 1_000_000, None),
    ("< " * 500_000, None),
    ("<answer>" * 125_000, None),
    ("Agent 0:\n" * 100_000, None),
    ("\n" * 1_000_000, None),
    ("Agent " + "9" * 1_000_000 + ": UP", None),
    ("Agent 0" + "*" * 1_000_000 + ":", ((),)),
    ("- " * 500_000 + "Agent 0: UP", ((U,),)),
    ("Agent 0: " + "R " * 500_000, ((R,) * 500_000,)),
    ("Agent 0: " + "1" * 1_000_000, None),
    ("Agent 0: " + "(1 ," * 250_000, None),
    ("Agent 0: " + "1 " * 500_000, None),
    ("Agent 0: (" + " " * 1_000_000, ((),)),
    ("Agent 0: " + "R 0 , 1 " * 125_000, ((R,) * 125_000,)),
]


@pytest.mark.parametrize(("text", "plan"), MEGABYTES, ids=range(len(MEGABYTES)))
def test_megabyte_answers_are_read_in_one_pass(text: str, plan: tuple | None) -> None:
    result = parse(text, 1)
    _check_result(result, 1)
    assert result.plan == plan


def test_format_plan_is_the_canonical_answer() -> None:
    assert format_plan(((R, D, W), (), (L,))) == "Agent 0: RIGHT DOWN WAIT\nAgent 1:\nAgent 2: LEFT"


def _check_result(result: Parsed, k: int) -> None:
    if result.plan is None:
        assert result.failure in (Failure.PARSE_ERROR, Failure.WRONG_AGENT_COUNT)
        assert result.message
    else:
        assert result.failure is None
        assert len(result.plan) == k
        assert all(a in ACTIONS for actions in result.plan for a in actions)


FRAGMENTS = [
    "Agent", "agent", "A", "a", " ", "0", "1", "2", "7", "12", ":", "=", "\n", "\r\n", "UP", "down", "L", "r",
    "W", "WAIT", "JUMP", ",", ";", "->", "→", "[", "]", '"', "'", "`", "```", "**", "- ", "* ", "1. ", "# ",
    ".", "<answer>", "</answer>", "< answer >", "<nl>", "\x00", "\t", "é", "🙂", "\u2028", "#", ">",
]


@settings(max_examples=300, deadline=None)
@given(text=st.text(), k=st.integers(1, 8))
def test_any_text_gives_a_plan_or_a_reason(text: str, k: int) -> None:
    _check_result(parse(text, k), k)


@settings(max_examples=300, deadline=None)
@given(text=st.lists(st.sampled_from(FRAGMENTS), max_size=40).map("".join), k=st.integers(1, 3))
def test_answer_like_text_gives_a_plan_or_a_reason(text: str, k: int) -> None:
    _check_result(parse(text, k), k)


action_lists = st.lists(st.sampled_from(ACTIONS), max_size=12).map(tuple)
plans = st.lists(action_lists, min_size=1, max_size=8).map(tuple)


@settings(max_examples=300, deadline=None)
@given(plan=plans)
def test_format_plan_round_trips(plan: tuple) -> None:
    assert parse(format_plan(plan), len(plan)) == Parsed(plan=plan)


@settings(max_examples=300, deadline=None)
@given(plan=plans)
def test_compact_answer_round_trips_as_text_and_as_tokens(plan: tuple) -> None:
    answer = compact_answer(plan)
    assert parse(answer, len(plan)) == Parsed(plan=plan)
    assert parse(" ".join(compact_tokens(answer)), len(plan)) == Parsed(plan=plan)
