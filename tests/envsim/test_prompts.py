"""Prompts: exact compact forms of hand-made boards, a closed vocabulary, chat prompts that hold the task."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envsim.instance import Instance
from envsim.parser import Parsed, parse
from envsim.prompts import (
    COMPACT_VOCAB,
    chat_prompt,
    chat_text,
    compact_answer,
    compact_prompt,
    compact_tokens,
)
from envsim.rules import ACTIONS, MAX_AGENTS, MAX_SIZE, MIN_SIZE, horizon

SMALL = Instance.from_str("..H\n...\nH..\nA0 (0,0) -> (2,2)\nA1 (1,0) -> (0,1)")
WIDE = Instance(size=12, holes=((0, 11),), starts=((11, 10),), goals=((0, 0),))


def test_compact_prompt_of_a_small_board() -> None:
    assert compact_prompt(SMALL) == (
        "size 3 agents 2 | holes (0,2) (2,0) | "
        "agent 0 start (0,0) goal (2,2) | agent 1 start (1,0) goal (0,1) | plan"
    )


def test_compact_prompt_of_a_board_without_holes() -> None:
    board = Instance(size=2, holes=(), starts=((0, 0),), goals=((1, 1),))
    assert compact_prompt(board) == "size 2 agents 1 | holes | agent 0 start (0,0) goal (1,1) | plan"


def test_compact_prompt_spells_numbers_digit_by_digit_and_cells_as_one_word() -> None:
    wider = WIDE.model_copy(update={"holes": ((0, 11), (10, 3))})
    assert compact_prompt(wider) == " | ".join(
        ["size 1 2 agents 1", "holes (0,11) (10,3)", "agent 0 start (11,10) goal (0,0)", "plan"])
    assert compact_tokens(compact_prompt(wider))[:8] == ["size", "1", "2", "agents", "1", "|", "holes", "(0,11)"]


def test_compact_answer_uses_short_forms_one_agent_per_line() -> None:
    plan = (("RIGHT", "DOWN", "WAIT", "DOWN"), (), ("UP", "LEFT"))
    assert compact_answer(plan) == "Agent 0: R D W D\nAgent 1:\nAgent 2: U L"
    assert compact_tokens(compact_answer(plan)) == [
        "Agent", "0", ":", "R", "D", "W", "D", "<nl>", "Agent", "1", ":", "<nl>", "Agent", "2", ":", "U", "L"]


def test_compact_answer_with_the_board_is_a_trace_of_cells() -> None:
    plan = (("RIGHT", "DOWN", "DOWN", "RIGHT"), ("UP", "RIGHT"))
    assert compact_answer(plan, SMALL) == (
        "Agent 0: (0,0) R (0,1) D (1,1) D (2,1) R (2,2)\nAgent 1: (1,0) U (0,0) R (0,1)")
    assert parse(compact_answer(plan, SMALL), 2) == Parsed(plan=plan)


def test_a_trace_keeps_an_agent_in_place_after_a_move_off_the_grid() -> None:
    plan = (("UP", "LEFT", "WAIT", "DOWN"), ())
    assert compact_answer(plan, SMALL) == "Agent 0: (0,0) U (0,0) L (0,0) W (0,0) D (1,0)\nAgent 1: (1,0)"


def test_compact_vocab_is_closed_and_has_no_repeats() -> None:
    assert len(set(COMPACT_VOCAB)) == len(COMPACT_VOCAB)
    assert COMPACT_VOCAB[:4] == ("<pad>", "<unk>", "<eos>", "<nl>")
    assert COMPACT_VOCAB[33:35] == ("(0,0)", "(0,1)") and COMPACT_VOCAB[-1] == f"({MAX_SIZE - 1},{MAX_SIZE - 1})"
    assert not any(ch.isspace() for token in COMPACT_VOCAB for ch in token)


@st.composite
def instances(draw: st.DrawFn) -> Instance:
    """A random well-formed board of any legal size with 1..8 agents."""
    size = draw(st.integers(MIN_SIZE, MAX_SIZE))
    rng = random.Random(draw(st.integers(0, 2**32)))
    cells = [(r, c) for r in range(size) for c in range(size)]
    rng.shuffle(cells)
    k = rng.randint(1, min(MAX_AGENTS, len(cells) // 2))
    rest = cells[2 * k:]
    holes = sorted(rng.sample(rest, rng.randint(0, len(rest) // 2)))
    return Instance(size=size, holes=tuple(holes), starts=tuple(cells[:k]), goals=tuple(cells[k:2 * k]))


action_lists = st.lists(st.sampled_from(ACTIONS), max_size=10).map(tuple)


@settings(max_examples=150, deadline=None)
@given(instance=instances(), data=st.data())
def test_compact_texts_use_only_the_vocabulary(instance: Instance, data: st.DataObject) -> None:
    prompt = compact_prompt(instance)
    assert compact_tokens(prompt) == prompt.split()
    assert set(prompt.split()) <= set(COMPACT_VOCAB)
    k = instance.num_agents
    plan = data.draw(st.lists(action_lists, min_size=k, max_size=k).map(tuple))
    tokens = compact_tokens(compact_answer(plan))
    assert set(tokens) <= set(COMPACT_VOCAB)
    assert compact_tokens(" ".join(tokens)) == tokens
    assert parse(" ".join(tokens), k) == Parsed(plan=plan)
    trace = compact_tokens(compact_answer(plan, instance))
    assert set(trace) <= set(COMPACT_VOCAB)
    assert parse(" ".join(trace), k) == Parsed(plan=plan)


def test_a_word_level_tokenizer_round_trips_compact_text() -> None:
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(
        vocab={t: i for i, t in enumerate(COMPACT_VOCAB)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    plan = (("RIGHT", "DOWN", "DOWN", "RIGHT"), ("UP", "RIGHT"))
    for text in (compact_prompt(SMALL), compact_prompt(WIDE), compact_answer(plan), compact_answer(plan, SMALL)):
        joined = " ".join(compact_tokens(text))
        ids = tokenizer.encode(joined).ids
        assert COMPACT_VOCAB.index("<unk>") not in ids
        assert tokenizer.decode(ids) == joined
    decoded = tokenizer.decode(tokenizer.encode(" ".join(compact_tokens(compact_answer(plan)))).ids)
    assert decoded == "Agent 0 : R D D R <nl> Agent 1 : U R"
    assert parse(decoded, 2) == Parsed(plan=plan)
    trace = tokenizer.decode(tokenizer.encode(" ".join(compact_tokens(compact_answer(plan, SMALL)))).ids)
    assert trace == "Agent 0 : (0,0) R (0,1) D (1,1) D (2,1) R (2,2) <nl> Agent 1 : (1,0) U (0,0) R (0,1)"
    assert parse(trace, 2) == Parsed(plan=plan)


def test_chat_prompt_holds_the_board_the_agents_and_the_answer_format() -> None:
    messages = chat_prompt(SMALL)
    assert messages == [{"role": "user", "content": chat_text(SMALL)}]
    text = chat_text(SMALL)
    assert "  0 1 2\n0 . . H\n1 . . .\n2 H . ." in text
    assert "Agent 0 starts at (0, 0) and must reach its goal at (2, 2)." in text
    assert "Agent 1 starts at (1, 0) and must reach its goal at (0, 1)." in text
    assert "<answer>\nAgent 0: ACTION ACTION ...\nAgent 1: ACTION ACTION ...\n</answer>" in text
    assert f"more than {horizon(3)} actions" in text
    for word in ("UP (row - 1)", "DOWN (row + 1)", "LEFT (col - 1)", "RIGHT (col + 1)", "WAIT", "hole",
                 "off the grid", "same cell at the same time", "swap cells", "shortest joint plan"):
        assert word in text


def test_chat_board_aligns_two_digit_columns() -> None:
    text = chat_text(WIDE)
    assert "    0  1  2  3  4  5  6  7  8  9 10 11\n 0  .  .  .  .  .  .  .  .  .  .  .  H\n" in text
    assert "Agent 0 starts at (11, 10) and must reach its goal at (0, 0)." in text


def test_the_chat_prompt_is_not_itself_an_answer() -> None:
    # Its agent list and answer template must not read as a plan if a model echoes them.
    result = parse(chat_text(SMALL).split("Answer format")[0], 2)
    assert result.failure is not None and result.message.startswith("no agent lines")


@settings(max_examples=50, deadline=None)
@given(instance=instances())
def test_prompts_are_deterministic_and_name_every_agent(instance: Instance) -> None:
    same = Instance.from_json(instance.to_json())
    assert chat_prompt(same) == chat_prompt(instance)
    assert compact_prompt(same) == compact_prompt(instance)
    text = chat_text(instance)
    for i, (s, g) in enumerate(zip(instance.starts, instance.goals, strict=True)):
        assert f"Agent {i} starts at ({s[0]}, {s[1]}) and must reach its goal at ({g[0]}, {g[1]})." in text
        assert f"\nAgent {i}: ACTION ACTION ...\n" in text
