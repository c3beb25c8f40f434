import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from envsim.instance import Instance
from tests.boards import CROSSING, OPEN


def test_canonical_text_and_picture():
    assert OPEN.to_str() == "...\n...\n...\nA0 (0,0) -> (2,2)\nA1 (2,0) -> (0,2)"
    assert OPEN.picture() == "A.b\n...\nB.a"
    assert Instance.from_str(OPEN.to_str()) == OPEN
    assert Instance.from_str(OPEN.picture()) == OPEN


def test_id_is_a_stable_content_hash():
    assert OPEN.id == "bab1ed9eb94d"  # sha256 of the canonical text, first 12 hex digits
    labelled = OPEN.with_labels(opt_soc=8, opt_makespan=4, needs_wait=False,
                                reference_plan=(("RIGHT",) * 2 + ("DOWN",) * 2, ("UP",) * 2 + ("RIGHT",) * 2))
    assert labelled.id == OPEN.id
    assert CROSSING.id != OPEN.id


def test_json_round_trip_keeps_labels():
    labelled = CROSSING.with_labels(opt_soc=5, opt_makespan=3, needs_wait=True,
                                    reference_plan=(("WAIT", "DOWN", "DOWN"), ("RIGHT", "RIGHT")))
    assert Instance.from_json(labelled.to_json()) == labelled
    assert Instance.from_json(labelled.to_json()).reference_plan == (("WAIT", "DOWN", "DOWN"), ("RIGHT", "RIGHT"))


@pytest.mark.parametrize(("fields", "message"), [
    (dict(size=3, holes=((1, 1),), starts=((1, 1),), goals=((0, 0),)), "agent 0's start (1, 1) is a hole"),
    (dict(size=3, holes=(), starts=((0, 0),), goals=((0, 0),)), "agent 0's start and goal are the same cell (0, 0)"),
    (dict(size=3, holes=(), starts=((0, 0), (0, 0)), goals=((1, 1), (2, 2))), "two agents share a start"),
    (dict(size=3, holes=(), starts=((0, 0),), goals=((3, 0),)), "goal (3,0) is off the 3x3 board"),
    (dict(size=1, holes=(), starts=((0, 0),), goals=((0, 0),)), "size 1 is outside 2..32"),
    (dict(size=3, holes=((2, 2), (1, 1)), starts=((0, 0),), goals=((0, 1),)), "holes must be sorted and distinct"),
])
def test_ill_formed_instances_are_refused_with_a_clear_message(fields, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Instance(**fields)


@pytest.mark.parametrize(("text", "message"), [
    ("A.\n.", "row 1 has 1 cells"),
    ("A.a\n...\n.?.", "holds '?'"),
    ("A.\n..", "agents must be numbered 0..K-1"),
    ("AAbb\n....\n....\nB..a", "agent 0 has two starts ('A' at (0,0) and at (0,1))"),
    ("Ab..\n....\n..a.\nB..a", "agent 0 has two goals ('a' at (2,2) and at (3,3))"),
    ("A..b\n.Z..\n....\nB..a", "cell (1,1) holds 'Z', a stray character"),
])
def test_from_str_names_the_problem(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Instance.from_str(text)


@given(st.integers(2, 8), st.data())
def test_text_and_json_round_trip(size, data):
    cells = [(r, c) for r in range(size) for c in range(size)]
    picked = data.draw(st.lists(st.sampled_from(cells), min_size=2, max_size=len(cells), unique=True))
    k = data.draw(st.integers(1, max(1, min(8, len(picked) // 2))))
    starts, goals = picked[:k], picked[k:2 * k]
    holes = tuple(sorted(picked[2 * k:]))
    inst = Instance(size=size, holes=holes, starts=tuple(starts), goals=tuple(goals))
    assert Instance.from_str(inst.to_str()) == inst
    assert Instance.from_json(inst.to_json()) == inst


SWAP = Instance(size=3, holes=(), starts=((0, 0), (0, 2)), goals=((0, 2), (0, 0)))  # each goal under the other's start


def test_a_goal_under_another_agents_start_is_drawn_in_text_form():
    assert SWAP.picture() == SWAP.to_str() == "...\n...\n...\nA0 (0,0) -> (0,2)\nA1 (0,2) -> (0,0)"
    assert Instance.from_str(SWAP.picture()) == SWAP


@given(size=st.integers(3, 8), agents=st.integers(2, 5), hole_share=st.floats(0, 0.4), seed=st.integers(0, 2**32 - 1))
def test_every_generated_boards_picture_reads_back_to_the_same_board(size, agents, hole_share, seed):
    import numpy as np

    from envsim.generator import random_board

    board = random_board(size, int(hole_share * size * size), agents, np.random.default_rng(seed))
    if board is None:  # too few connected cells for the agents: the generator draws again
        return
    labelled = board.with_labels(opt_soc=1, opt_makespan=1, needs_wait=False, reference_plan=((),) * agents)
    assert Instance.from_str(labelled.picture()) == board
