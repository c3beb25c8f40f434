"""Figures draw exactly what the rules say: agents' cells at a given step, the solver's ghost, event markers.

Boards put cell (row, col) at x = col, y = row, so a trace's point reads back as `(y, x)`.
"""

from __future__ import annotations

import pytest

from envsim.instance import Instance
from envsim.scoring import Tally, score, score_answer
from envsim.solver import label
from lab.pages import figures
from lab.results import StageSummary
from tests.boards import CROSSING, OPEN

CLASH = "Agent 0: DOWN DOWN\nAgent 1: RIGHT RIGHT"  # both agents enter (1,1) at t=1
HOLEY = Instance.from_str("""
A..a
.HH.
....
B..b
""")


@pytest.fixture(scope="module")
def crossing() -> Instance:
    return label(CROSSING)


def traces(fig) -> dict:
    data = fig["data"] if isinstance(fig, dict) else [t.to_plotly_json() for t in fig.data]
    return {t["name"]: t for t in data}


def cells(trace) -> list[tuple[float, float]]:
    return list(zip(trace["y"], trace["x"], strict=True))


@pytest.mark.parametrize(("step", "agent0", "agent1"), [(0, (0, 1), (1, 0)), (1, (1, 0.82), (1, 1.18)),
                                                       (2, (2, 1), (1, 2))])
def test_agents_are_drawn_where_the_rules_put_them_at_each_step(crossing, step, agent0, agent1):
    """At t = 1 both agents are in (1, 1): drawn side by side in it, smaller, neither hiding the other."""
    fig = figures.board_figure(crossing, score_answer(crossing, CLASH), step)
    t = traces(fig)
    assert cells(t["agent 0"]) == [agent0] and cells(t["agent 1"]) == [agent1]
    sizes = [t[f"agent {i}"]["marker"]["size"] for i in (0, 1)]
    assert sizes == ([17, 17] if step == 1 else [figures.DISC_PX] * 2)
    if step == 1:  # the cell it is in, said exactly
        assert t["agent 1"]["hovertext"] == ["agent 1 at (1,1), t=1"]
    assert t["agent 0"]["marker"]["color"] == figures.colour(0) != t["agent 1"]["marker"]["color"]


def test_a_path_runs_from_the_start_to_the_current_cell(crossing):
    t = traces(figures.board_figure(crossing, score_answer(crossing, CLASH), 2))
    d = figures._offset(0, 2)  # paths are drawn slightly apart
    assert cells(t["path 0"]) == [(0 + d, 1 + d), (1 + d, 1 + d), (2 + d, 1 + d)]
    assert len(cells(traces(figures.board_figure(crossing, score_answer(crossing, CLASH), 1))["path 1"])) == 2


def test_the_vertex_conflict_is_marked_where_and_when_it_happens(crossing):
    outcome = score_answer(crossing, CLASH)
    assert cells(traces(figures.board_figure(crossing, outcome, 0))["events"]) == []
    now = traces(figures.board_figure(crossing, outcome, 1))["events"]
    assert cells(now) == [(1, 1)] and now["marker"]["size"] == [26]
    assert now["hovertext"] == ["t=1: agents 0 and 1 collide at (1, 1)"]
    later = traces(figures.board_figure(crossing, outcome, 2))["events"]
    assert cells(later) == [(1, 1)] and later["marker"]["size"] == [14]  # past events stay, drawn smaller


def test_a_fall_into_a_hole_is_marked_at_the_hole():
    board = label(HOLEY)
    outcome = score_answer(board, "Agent 0: DOWN RIGHT\nAgent 1: RIGHT")
    assert cells(traces(figures.board_figure(board, outcome, 1))["events"]) == []
    t = traces(figures.board_figure(board, outcome, 2))
    assert cells(t["events"]) == [(1, 1)] and cells(t["agent 0"]) == [(1, 1)]
    assert figures.step_caption(outcome, 2) == "t = 2 / 2: agent 0 falls into the hole at (1, 1)"


def test_a_move_off_the_grid_is_marked_on_the_edge_it_hits():
    outcome = score_answer(OPEN, "Agent 0: UP RIGHT\nAgent 1: DOWN")
    t = traces(figures.board_figure(OPEN, outcome, 1, ghost=False))
    assert cells(t["events"]) == [(-0.5, 0), (2.5, 0)]  # agent 0 up from (0,0), agent 1 down from (2,0)
    assert cells(t["agent 0"]) == [(0, 0)]  # the edge stops it
    assert "solver's plan" not in t


def test_the_ghost_follows_the_solvers_plan_and_stays_on_the_goals(crossing):
    plan = score(crossing, crossing.reference_plan).positions
    long = "Agent 0: WAIT WAIT WAIT WAIT WAIT\nAgent 1: WAIT"
    for step in range(6):
        t = traces(figures.board_figure(crossing, score_answer(crossing, long), step))
        assert cells(t["solver's plan"]) == list(plan[min(step, 3)])
    t = traces(figures.board_figure(crossing, score_answer(crossing, CLASH)))
    assert cells(t["ghost path 0"]) == [(0, 1), (0, 1), (1, 1), (2, 1)]  # waits once, then goes down
    assert "ghost path 0" not in traces(figures.board_figure(CROSSING, score_answer(CROSSING, CLASH)))  # unlabelled


def test_the_board_shows_holes_starts_and_goals(crossing):
    board = label(HOLEY)
    t = traces(figures.board_figure(board))
    assert t["board"]["z"][1] == [0, 1, 1, 0] and t["board"]["z"][0] == [0, 0, 0, 0]
    assert cells(t["starts"]) == [(0, 0), (3, 0)] and t["starts"]["text"] == ["start 0", "start 1"]
    assert cells(t["goals"]) == [(0, 3), (3, 3)] and t["goals"]["text"] == ["goal 0", "goal 1"]
    assert cells(t["agent 1"]) == [(3, 0)]


def test_steps_outside_the_episode_are_clamped(crossing):
    outcome = score_answer(crossing, CLASH)
    fig = figures.board_figure(crossing, outcome, 99)
    assert fig.layout.title.text == "t = 2 / 2: the end (t=1: agents 0 and 1 collide at (1, 1))"
    assert cells(traces(fig)["agent 1"]) == [(1, 2)]
    assert cells(traces(figures.board_figure(crossing, outcome, -4))["agent 1"]) == [(1, 0)]


def test_a_plan_level_failure_is_written_across_the_board(crossing):
    fig = figures.board_figure(crossing, score_answer(crossing, "Agent 0: FLY"))
    assert fig.layout.annotations[0].text == "t=0: the answer cannot be read as a plan"


def test_the_replay_carries_every_step_as_a_frame(crossing):
    outcome = score_answer(crossing, CLASH)
    fig = figures.replay_figure(crossing, outcome)
    assert [f["name"] for f in fig["frames"]] == ["0", "1", "2"]
    names = [t["name"] for t in fig["data"]]
    for frame in fig["frames"]:
        assert [names[i] for i in frame["traces"]] == [t["name"] for t in frame["data"]]
    one = traces({"data": fig["frames"][1]["data"]})
    assert cells(one["agent 0"]) == [(1, 0.82)] and cells(one["events"]) == [(1, 1)]
    assert fig["frames"][1]["layout"]["title"]["text"] == "t = 1 / 2: agents 0 and 1 collide at (1, 1)"
    assert [s["args"][0] for s in fig["layout"]["sliders"][0]["steps"]] == [["0"], ["1"], ["2"]]
    legend, buttons = fig["layout"]["legend"], fig["layout"]["updatemenus"][0]
    assert (legend["x"], legend["xanchor"]) == (1.02, "left") and buttons["y"] < 0  # right of the board, not under
    assert [b["label"] for b in fig["layout"]["updatemenus"][0]["buttons"]] == ["▶ play", "❚❚ pause"]
    assert traces(fig)["agent 1"] == traces(figures.board_figure(crossing, outcome, 0))["agent 1"]


def test_boards_side_by_side_are_drawn_at_their_end(crossing):
    fig = figures.boards_figure([(crossing, score_answer(crossing, CLASH), "stage 0"),
                                 (crossing, score(crossing, crossing.reference_plan), "stage 1")])
    agents = [cells(t) for t in fig.data if t.name == "agent 1"]
    assert agents == [[(1, 2)], [(1, 2)]]
    assert [t.xaxis for t in fig.data if t.name == "agent 0"] == ["x", "x2"]
    assert [a.text for a in fig.layout.annotations] == ["stage 0", "stage 1"]


def test_rates_curves_failures_and_training():
    rows = {4: Tally(4, 1, 0, {"hole": 3}), 3: Tally(2, 2, 1, {})}
    assert {t.textangle for t in figures.rates_figure(rows).data} == {-90}  # side by side, labels never touch
    rates = traces(figures.rates_figure(rows))
    assert rates["valid rate"]["x"] == ["3x3", "4x4"] and rates["valid rate"]["y"] == [1.0, 0.25]
    assert rates["optimal rate"]["y"] == [0.5, 0.0]
    curves = traces(figures.curves_figure({0: StageSummary(0, rows),
                                           1: StageSummary(1, {**rows, 4: Tally(4, 4, 0, {})})}))
    # the stage's rate is pooled over its episodes: 3 of 6 valid, then 6 of 6 (not the mean over sizes, 62.5%)
    assert curves["pooled valid"]["y"] == [0.5, 1.0] and curves["valid 4x4"]["y"] == [0.25, 1.0]
    assert curves["pooled optimal"]["y"] == [1 / 6, 1 / 6]
    heat = figures.failure_heatmap(rows).data[0]
    assert heat.x == ("hole",) and heat.y == ("3x3", "4x4") and [list(z) for z in heat.z] == [[0], [3]]
    logs = [(1, {"reward": 0.5, "loss": 2.0, "kl": 0.0}), (2, {"reward": 0.75, "loss": 1.5})]
    training = figures.training_figure(logs)
    assert [t.y for t in training.data] == [(0.5, 0.75), (2.0, 1.5), (0.0,)]
    assert training.layout.yaxis.title.text == "reward, 0..2.4"
    assert training.layout.title.text == "not logged: truncated answers (at the length cap), mean answer length"
    no_kl = figures.training_figure([(1, {"reward": 0.5, "loss": 2.0})])  # KL not logged: no empty panel for it
    assert [t.name for t in no_kl.data] == ["reward", "loss"]
    assert no_kl.layout.title.text == "not logged: KL to the reference, truncated answers (at the length cap), " \
        "mean answer length"
    five = figures.training_figure([(1, {"reward": 0.5, "loss": 2.0, "kl": 0.1, "completions/clipped_ratio": 0.25,
                                         "completions/mean_length": 31.0})])
    assert [t.name for t in five.data] == ["reward", "loss", "kl", "completions/clipped_ratio",
                                           "completions/mean_length"]
    assert five.layout.yaxis4.title.text == "share, 0..1" and five.layout.height == 900  # three rows of two
    assert five.layout.xaxis3.domain == five.layout.xaxis1.domain  # the third panel under the first: titles apart


def test_empty_inputs_say_why_they_are_empty():
    assert figures.rates_figure({}).layout.annotations[0].text == "no evaluation yet"
    assert figures.curves_figure({}).layout.annotations[0].text == "no evaluated stage yet"
    no_failures = {3: Tally(2, 2, 2, {})}
    assert figures.failure_heatmap(no_failures).layout.annotations[0].text == "no failures at this stage"
    assert "not trained" in figures.training_figure([]).layout.annotations[0].text
    assert figures.board_figure(OPEN).layout.title.text == "the board (no plan yet)"


def test_starts_and_goals_are_named_over_the_agents(crossing):
    """The goal squares and the start and goal names come after the agents (Plotly draws later traces on top), each
    name with a shadow, so a disc on a start or a goal never hides whose it is; in a replay too."""
    outcome = score_answer(crossing, CLASH)
    names = [t["name"] for t in figures.board_figure(crossing, outcome, 0).to_plotly_json()["data"]]
    assert names[-2:] == ["goals", "starts"] and names.index("agent 1") < names.index("goals")
    replay = figures.replay_figure(crossing, outcome)
    assert [t["name"] for t in replay["data"]][-2:] == ["goals", "starts"]
    assert {(t["textfont"]["shadow"], t["cliponaxis"]) for t in replay["data"][-2:]} == {("auto", False)}
    assert all(t["name"] not in ("goals", "starts") for frame in replay["frames"] for t in frame["data"])
