"""Scripted episodes with exact outcomes, and the batch path held to the step-by-step one.

Every scripted episode goes through `played`, which also scores it with `score_batch` and checks that the two
agree, so each scenario is a test of both paths.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envsim.instance import Instance
from envsim.parser import Parsed, Plan
from envsim.rules import ACTIONS, SHORT, Failure, horizon
from envsim.scoring import Event, Outcome, score, score_answer, score_batch

F = Failure

# Two agents crossing a 3x3 board: A (0,0) -> a (2,2), B (0,2) -> b (2,0).
CROSS = Instance.from_str("A.B\n...\nb.a")


def plan(*lists: str) -> Plan:
    """One string of short action letters per agent: plan("RRD", "") is RIGHT RIGHT DOWN and an empty list."""
    return tuple(tuple(SHORT[ch] for ch in letters) for letters in lists)


def batch_views(instances: list[Instance], plans: list[Plan]) -> list[tuple]:
    """`score_batch`'s fields for each episode, in the shape of `outcome_view` (-1 read as None)."""
    b = score_batch(instances, plans)
    defined = lambda x: None if x < 0 else int(x)  # noqa: E731
    return [(bool(b.valid[e]), bool(b.optimal[e]), bool(b.soc_optimal[e]),
             list(Failure)[b.failure[e]] if b.failure[e] >= 0 else None, defined(b.failure_time[e]),
             defined(b.makespan[e]), defined(b.soc[e]), float(b.isr[e])) for e in range(len(instances))]


def outcome_view(o: Outcome) -> tuple:
    return o.valid, o.optimal, o.soc_optimal, o.failure, o.failure_time, o.makespan, o.soc, o.isr


def played(instance: Instance, p: Plan) -> Outcome:
    """`score`, checked against `score_batch` on the fields the batch has."""
    o = score(instance, p)
    assert batch_views([instance], [p]) == [outcome_view(o)]
    return o


# ---------------------------------------------------------------- answers that are not plans


@pytest.mark.parametrize("failure", [F.PARSE_ERROR, F.WRONG_AGENT_COUNT])
def test_unread_answer_is_a_failure_at_time_zero_with_nothing_played(failure):
    o = score(CROSS, Parsed(None, failure, "line 2: no agent named"))
    assert (o.valid, o.failure, o.failure_time, o.failure_agents) == (False, failure, 0, ())
    assert o.events == (Event(failure, 0, ()),)
    assert o.positions == (((0, 0), (0, 2)),)
    assert (o.arrivals, o.makespan, o.soc, o.isr) == ((None, None), None, None, 0.0)
    assert o.message == "line 2: no agent named"


def test_unknown_word_in_a_plan_is_a_parse_error():
    o = played(CROSS, (("DOWN", "JUMP"), ("WAIT",)))
    assert (o.failure, o.failure_time, o.positions) == (F.PARSE_ERROR, 0, (((0, 0), (0, 2)),))
    assert o.message == "parse_error: agent 0's action 1 is 'JUMP', not one of UP, DOWN, LEFT, RIGHT, WAIT"


@pytest.mark.parametrize("lists", [("DD",), ("DD", "DD", "DD")])
def test_wrong_number_of_lists_is_wrong_agent_count(lists):
    o = played(CROSS, plan(*lists))
    assert (o.failure, o.failure_time, o.failure_agents) == (F.WRONG_AGENT_COUNT, 0, ())
    assert o.message == f"wrong_agent_count: {len(lists)} action lists for 2 agents"


def test_unknown_word_is_reported_before_a_wrong_count():
    assert played(CROSS, (("JUMP",),)).failure is F.PARSE_ERROR


# ---------------------------------------------------------------- failures in play


def test_too_long_is_at_time_zero_and_play_goes_on_recording_later_events():
    board = Instance.from_str("A.\n.a")  # horizon 16
    long = ("WAIT",) * 16 + ("UP", "RIGHT", "DOWN")
    o = played(board, (long,))
    assert o.events == (Event(F.TOO_LONG, 0, (0,)), Event(F.ILLEGAL_MOVE, 17, (0,), (-1, 0)))
    assert (o.failure, o.failure_time, o.failure_agents) == (F.TOO_LONG, 0, (0,))
    assert len(o.positions) == 20 and o.positions[17] == ((0, 0),) and o.positions[19] == ((1, 1),)
    # The agent still ends on its goal: the scores are read from where it ends.
    assert (o.valid, o.arrivals, o.makespan, o.soc, o.isr) == (False, (19,), 19, 19, 1.0)
    assert o.message == "too_long: agent 0's list has 19 actions, over the horizon of 16, t=0 (+1 more events)"


def test_illegal_move_stops_the_agent_then_a_vertex_conflict_is_still_recorded():
    o = played(CROSS, plan("UR", "WL"))
    assert o.events == (Event(F.ILLEGAL_MOVE, 1, (0,), (-1, 0)), Event(F.VERTEX_CONFLICT, 2, (0, 1), (0, 1)))
    assert (o.failure, o.failure_time, o.failure_agents) == (F.ILLEGAL_MOVE, 1, (0,))
    assert o.positions == (((0, 0), (0, 2)), ((0, 0), (0, 2)), ((0, 1), (0, 1)))
    assert o.message == "illegal_move: agent 0 moves off the grid to (-1,0), t=1 (+1 more events)"


def test_hole_comes_before_a_later_conflict_and_the_fallen_agent_stays_drawn_in_it():
    board = Instance.from_str("..H\n...\n...\nA0 (0,0) -> (2,2)\nA1 (2,0) -> (0,1)\nA2 (1,2) -> (2,1)")
    o = played(board, plan("WD", "WU", "UR"))
    assert o.events == (Event(F.HOLE, 1, (2,), (0, 2)), Event(F.VERTEX_CONFLICT, 2, (0, 1), (1, 0)))
    assert (o.failure, o.failure_time, o.failure_agents) == (F.HOLE, 1, (2,))
    assert o.positions[1][2] == o.positions[2][2] == (0, 2)  # its RIGHT at t=2 is ignored
    assert o.message == "hole: agent 2 falls into the hole at (0,2), t=1 (+1 more events)"


def test_agents_in_one_hole_fall_each_and_are_in_no_conflict():
    board = Instance.from_str("A.B\n.H.\nb.a")
    o = played(board, plan("DR", "DL"))
    assert o.events == (Event(F.HOLE, 2, (0,), (1, 1)), Event(F.HOLE, 2, (1,), (1, 1)))
    assert (o.arrivals, o.makespan, o.isr) == ((None, None), None, 0.0)


def test_vertex_conflict_with_an_agent_that_finished_its_list():
    board = Instance.from_str("A.a\n...\nB.b")
    o = played(board, plan("RR", "UURR"))
    # Agent 0 is on its goal (0,2) from t=2 with an ended list; agent 1 walks into it at t=4.
    assert o.events == (Event(F.VERTEX_CONFLICT, 4, (0, 1), (0, 2)),)
    assert o.message == "vertex_conflict: agents 0 and 1 at (0,2), t=4"
    assert (o.arrivals, o.makespan, o.soc, o.isr) == ((2, None), None, None, 0.5)


def test_edge_swap():
    board = Instance.from_str("...\n...\n...\nA0 (0,0) -> (1,0)\nA1 (1,0) -> (0,0)")
    o = played(board, plan("D", "U"))
    assert o.events == (Event(F.EDGE_CONFLICT, 1, (0, 1), (1, 0)),)
    assert o.message == "edge_conflict: agents 0 and 1 swap cells, agent 0 moving into (1,0), t=1"
    assert (o.makespan, o.soc, o.isr) == (1, 2, 1.0)  # both end on their goals; the plan is still invalid


def test_following_into_a_vacated_cell_is_allowed():
    board = Instance.from_str("...\n...\n...\nA0 (0,0) -> (0,1)\nA1 (0,1) -> (0,2)")
    o = played(board, plan("R", "R"))
    assert (o.valid, o.events, o.makespan, o.soc, o.message) == (True, (), 1, 2, "valid: makespan 1, soc 2")


def test_a_rotation_of_four_agents_is_allowed():
    board = Instance(size=2, holes=(), starts=((0, 0), (0, 1), (1, 1), (1, 0)),
                     goals=((0, 1), (1, 1), (1, 0), (0, 0)))
    assert played(board, plan("R", "D", "L", "U")).valid


# ---------------------------------------------------------------- ties at one timestep


def test_tie_goes_to_the_failure_order():
    # t=1: agent 2 leaves the grid while agents 0 and 1 meet at (0,1).
    board = Instance(size=3, holes=(), starts=((0, 0), (0, 2), (2, 0)), goals=((2, 2), (2, 1), (0, 1)))
    o = played(board, plan("R", "L", "D"))
    assert [e.type for e in o.events] == [F.ILLEGAL_MOVE, F.VERTEX_CONFLICT]
    assert (o.failure, o.failure_agents) == (F.ILLEGAL_MOVE, (2,))


def test_hole_outranks_a_vertex_conflict_and_vertex_outranks_an_edge_conflict():
    board = Instance(size=4, holes=((3, 3),), starts=((0, 0), (0, 1), (2, 0), (2, 2), (3, 2)),
                     goals=((1, 1), (1, 0), (3, 0), (2, 3), (0, 3)))
    # t=1: agents 0 and 1 swap, agents 2 and 3 meet at (2,1), agent 4 falls into (3,3).
    o = played(board, plan("R", "L", "R", "L", "R"))
    assert [(e.type, e.agents) for e in o.events] == [(F.HOLE, (4,)), (F.VERTEX_CONFLICT, (2, 3)),
                                                      (F.EDGE_CONFLICT, (0, 1))]
    o = played(board, plan("R", "L", "R", "L", "W"))
    assert (o.failure, o.failure_agents) == (F.VERTEX_CONFLICT, (2, 3))


def test_tie_within_a_type_goes_to_the_lower_agent_index():
    o = played(CROSS, plan("L", "R"))  # both leave the grid at t=1
    assert o.events == (Event(F.ILLEGAL_MOVE, 1, (0,), (0, -1)), Event(F.ILLEGAL_MOVE, 1, (1,), (0, 3)))
    assert o.failure_agents == (0,)


def test_three_agents_in_one_cell_are_one_event_per_pair():
    board = Instance(size=3, holes=(), starts=((0, 1), (1, 0), (1, 2)), goals=((2, 1), (2, 0), (2, 2)))
    o = played(board, plan("D", "R", "L"))
    assert [e.agents for e in o.events] == [(0, 1), (0, 2), (1, 2)]
    assert {e.cell for e in o.events} == {(1, 1)}
    assert o.message == "vertex_conflict: agents 0 and 1 at (1,1), t=1 (+2 more events)"


# ---------------------------------------------------------------- ends and scores


def test_valid_plan_with_trailing_waits_arrives_when_it_first_stays_on_its_goal():
    board = Instance.from_str("A.a\n...\nB.b")
    # Agent 0 reaches (0,2) at t=2, steps off and back (t=4), then waits; agent 1 arrives at t=2 and waits.
    o = played(board, plan("RRDUWW", "RRWW"))
    assert (o.valid, o.arrivals, o.makespan, o.soc) == (True, (4, 2), 4, 6)
    assert o.positions[3] == ((1, 2), (2, 2)) and len(o.positions) == 7


def test_goal_not_reached_is_one_event_per_agent_at_the_end():
    o = played(CROSS, plan("D", "DDLL"))
    assert o.events == (Event(F.GOAL_NOT_REACHED, 4, (0,), (1, 0)),)
    assert (o.failure, o.failure_time) == (F.GOAL_NOT_REACHED, 4)
    assert (o.arrivals, o.makespan, o.soc, o.isr) == ((None, 4), None, None, 0.5)
    assert o.message == "goal_not_reached: agent 0 ends at (1,0), not its goal (2,2), t=4"


def test_empty_lists_are_legal_and_end_at_time_zero():
    o = played(CROSS, plan("", ""))
    assert o.positions == (((0, 0), (0, 2)),)
    assert [(e.type, e.time, e.agents, e.cell) for e in o.events] == [
        (F.GOAL_NOT_REACHED, 0, (0,), (0, 0)), (F.GOAL_NOT_REACHED, 0, (1,), (0, 2))]


def test_optimal_flags_compare_with_the_labels():
    best = plan("DDRR", "LLDD")  # makespan 4, soc 8; the agents never meet
    labelled = CROSS.with_labels(opt_soc=8, opt_makespan=4, needs_wait=False, reference_plan=best)
    o = played(labelled, best)
    assert (o.valid, o.optimal, o.soc_optimal) == (True, True, True)
    assert o.message == "valid: makespan 4, soc 8 (optimal makespan 4, optimal soc 8)"
    o = played(labelled, plan("DDRR", "WLLDD"))  # soc 9, makespan 5
    assert (o.valid, o.optimal, o.soc_optimal) == (True, False, False)
    o = played(labelled.model_copy(update={"opt_makespan": 5}), plan("DDRR", "WLLDD"))
    assert (o.optimal, o.soc_optimal) == (True, False)
    o = played(CROSS, best)  # unlabelled
    assert (o.valid, o.optimal, o.soc_optimal) == (True, False, False)


def test_isr_is_the_share_of_agents_that_end_on_their_goal():
    board = Instance(size=3, holes=(), starts=((0, 0), (1, 0), (2, 0)), goals=((0, 1), (1, 1), (2, 2)))
    assert played(board, plan("R", "R", "R")).isr == 2 / 3
    assert played(board, plan("", "", "")).isr == 0.0


def test_outcome_round_trips_through_json():
    for o in (played(CROSS, plan("UR", "WL")), score(CROSS, Parsed(None, F.PARSE_ERROR, "no agent lines")),
              played(CROSS, plan("DDRR", "LLDD"))):
        d = json.loads(json.dumps(o.to_dict()))
        assert d == o.to_dict()
        assert Outcome.from_dict(d) == o


def test_score_answer_reads_the_text_with_the_parser():
    o = score_answer(CROSS, "Let me think.\n<answer>\nAgent 0: D D R R\nAgent 1: LEFT LEFT DOWN DOWN\n</answer>")
    assert (o.valid, o.makespan, o.soc) == (True, 4, 8)
    o = score_answer(CROSS, "Agent 0: D D R R")
    assert (o.failure, o.failure_time, o.message) == (F.WRONG_AGENT_COUNT, 0, "no plan for agent 1")


# ---------------------------------------------------------------- the batch path


def test_batch_of_nothing_and_of_mismatched_lengths():
    b = score_batch([], [])
    assert b.valid.shape == (0,) and b.agent_steps == 0
    with pytest.raises(ValueError, match="1 instances but 0 plans"):
        score_batch([CROSS], [])


def test_batch_keeps_the_given_order_across_agent_counts_and_lengths():
    single = Instance.from_str("A.\n.a")
    episodes = [(CROSS, plan("DDRR", "LLDD")), (single, plan("RD")), (CROSS, plan("UR", "WL")), (single, plan(""))]
    b = score_batch([e[0] for e in episodes], [e[1] for e in episodes])
    assert b.failure.tolist() == [-1, -1, list(F).index(F.ILLEGAL_MOVE), list(F).index(F.GOAL_NOT_REACHED)]
    assert b.makespan.tolist() == [4, 2, -1, -1]
    assert b.agent_steps == 2 * 4 + 1 * 2 + 2 * 2 + 0


@st.composite
def episodes(draw: st.DrawFn) -> tuple[Instance, Plan]:
    """A random well-formed board (sizes 2..6, 1..5 agents) and a random plan for it: random words or
    shuffled walks towards the goals; sometimes a list at or just over the horizon, an unknown word, or a
    list missing; labels random, missing, or (half the time) the plan's own makespan and soc."""
    size = draw(st.integers(2, 6))
    cells = [(r, c) for r in range(size) for c in range(size)]
    k = draw(st.integers(1, min(5, len(cells) - 1)))
    starts = draw(st.permutations(cells))[:k]
    goals = draw(st.permutations(cells))[:k]
    for i in range(k):  # move a goal that sits on its own start to a cell no one uses
        if goals[i] == starts[i]:
            goals[i] = next(c for c in cells if c not in goals and c != starts[i])
    free = [c for c in cells if c not in starts and c not in goals]
    holes = draw(st.lists(st.sampled_from(free), unique=True, max_size=len(free) // 2)) if free else []
    instance = Instance(size=size, holes=tuple(sorted(holes)), starts=tuple(starts), goals=tuple(goals),
                        opt_makespan=draw(st.none() | st.integers(1, 6)), opt_soc=draw(st.none() | st.integers(1, 12)))
    lists = []
    for (sr, sc), (gr, gc) in zip(starts, goals, strict=True):
        if draw(st.booleans()):
            lists.append(draw(st.lists(st.sampled_from(ACTIONS), max_size=12)))
        else:
            walk = ["DOWN" if gr > sr else "UP"] * abs(gr - sr) + ["RIGHT" if gc > sc else "LEFT"] * abs(gc - sc)
            lists.append(draw(st.permutations(walk + ["WAIT"] * draw(st.integers(0, 2)))))
    twist = draw(st.integers(0, 19))
    if twist == 0:
        lists[0] = list(lists[0]) + ["WAIT"] * (horizon(size) + draw(st.integers(0, 1)) - len(lists[0]))
    elif twist == 1 and lists[-1]:
        lists[-1] = list(lists[-1][:-1]) + ["up"]
    elif twist == 2:
        lists = lists[:-1]
    p = tuple(tuple(actions) for actions in lists)
    if draw(st.booleans()):  # labels that the plan meets, so that the optimal flags are often true
        own = score(instance, p)
        instance = instance.model_copy(update={"opt_makespan": own.makespan, "opt_soc": own.soc})
    return instance, p


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(episodes(), min_size=1, max_size=4))
def test_batch_agrees_with_score(batch):
    instances, plans = [e[0] for e in batch], [e[1] for e in batch]
    assert batch_views(instances, plans) == [outcome_view(score(i, p)) for i, p in batch]
    readable = [(i, p) for i, p in batch if len(p) == i.num_agents and all(a in ACTIONS for x in p for a in x)]
    assert score_batch(instances, plans).agent_steps == sum(i.num_agents * max(map(len, p)) for i, p in readable)
