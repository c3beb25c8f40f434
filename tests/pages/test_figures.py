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
    assert cells(now) == [(1, 1)] and now["marker"]["line"]["width"] == [4] and now["marker"]["opacity"] == [1.0]
    assert now["hovertext"] == ["t=1: agents 0 and 1 collide at (1, 1)"]
    later = traces(figures.board_figure(crossing, outcome, 2))["events"]
    assert cells(later) == [(1, 1)] and later["marker"]["line"]["width"] == [2]  # past events stay, drawn thinner
    assert later["marker"]["opacity"] == [0.5]


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
    assert cells(t["goals"]) == [(0, 3), (3, 3)]  # the squares, on the goals
    # each number at a corner of its own cell: a start's top left, a goal's bottom right
    assert cells(t["starts"]) == [(-0.44, -0.44), (2.56, -0.44)] and t["starts"]["text"] == ["0", "1"]
    assert cells(t["goal numbers"]) == [(0.44, 3.44), (3.44, 3.44)] and t["goal numbers"]["text"] == ["0", "1"]
    assert t["starts"]["hovertext"] == ["start of agent 0 (0, 0)", "start of agent 1 (3, 0)"]
    assert t["goal numbers"]["hovertext"] == ["goal of agent 0 (0, 3)", "goal of agent 1 (3, 3)"]
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


MARKS = ["goals", "starts", "goal numbers"]


def test_starts_and_goals_are_named_over_the_agents(crossing):
    """The goal squares and the start and goal numbers come after the agents (Plotly draws later traces on top), each
    number with a shadow, so a disc on a start or a goal never hides whose it is; in a replay too."""
    outcome = score_answer(crossing, CLASH)
    names = [t["name"] for t in figures.board_figure(crossing, outcome, 0).to_plotly_json()["data"]]
    assert names[-3:] == MARKS and names.index("agent 1") < names.index("goals")
    replay = figures.replay_figure(crossing, outcome)
    assert [t["name"] for t in replay["data"]][-3:] == MARKS
    assert {(t["textfont"]["shadow"], t["cliponaxis"]) for t in replay["data"][-2:]} == {("auto", False)}
    assert all(t["name"] not in MARKS for frame in replay["frames"] for t in frame["data"])


# Five agents as the issue saw them: starts 1 and 4 side by side (their names, written up and left of each start,
# printed over each other) and agent 2's start up and left of agent 0's (whose name sat on agent 2).
FIVE = Instance.from_str("""
.....
.C...
..AEB
D....
abcde
""")


def _corner_box(point: tuple[float, float], position: str) -> tuple[float, float, float, float]:
    """The third of a cell a number anchored at `point` is written into, as (top, left, bottom, right)."""
    (y, x), (dy, dx) = point, (0.3 if "bottom" in position else -0.3, 0.3 if "right" in position else -0.3)
    return min(y, y + dy), min(x, x + dx), max(y, y + dy), max(x, x + dx)


def test_five_agents_numbers_sit_in_their_own_cells_apart_from_each_other():
    """Each start's and goal's number is written into a corner of its own cell (a start's top left, a goal's bottom
    right), so no two numbers touch and none spills into a cell where another agent stands."""
    board = label(FIVE)
    t = traces(figures.board_figure(board, score(board, board.reference_plan), 0))
    boxes = []
    for name, cells_of in (("starts", board.starts), ("goal numbers", board.goals)):
        assert t[name]["text"] == ["0", "1", "2", "3", "4"] and t[name]["textfont"]["size"] == figures.LABEL_PX
        for point, cell in zip(cells(t[name]), cells_of, strict=True):
            top, left, bottom, right = box = _corner_box(point, t[name]["textposition"])
            assert cell[0] - 0.5 <= top < bottom <= cell[0] + 0.5 and cell[1] - 0.5 <= left < right <= cell[1] + 0.5
            boxes.append(box)
    assert not [(a, b) for k, a in enumerate(boxes) for b in boxes[k + 1:]  # no two of the ten touch
                if a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]]
    assert [tuple(round(v, 2) for v in box) for box in sorted(boxes)[:2]] == [(0.56, 0.56, 0.86, 0.86),
                                                                             (1.56, 1.56, 1.86, 1.86)]


def test_an_event_rings_the_agents_under_it_and_the_ghost_ring_shows():
    """At a collision of five agents' board the event is a red ring around the cell, drawn before (under) every agent
    and wider than the ghost's ring, which is wider than a disc with its rim: the three never cover each other."""
    board = label(FIVE)
    outcome = score_answer(board, "Agent 0: UP LEFT\nAgent 1: WAIT\nAgent 2: WAIT\nAgent 3: WAIT\nAgent 4: WAIT")
    assert [e.cell for e in outcome.events] == [(1, 1)]  # agent 0 runs into agent 2's cell at t = 2
    data = [t["name"] for t in figures.board_figure(board, outcome, 2).to_plotly_json()["data"]]
    t = traces(figures.board_figure(board, outcome, 2))
    assert cells(t["events"]) == [(1, 1)] and t["events"]["marker"]["symbol"] == "circle-open"
    assert data.index("events") < min(data.index(f"agent {i}") for i in range(5))
    assert data.index("solver's plan") > max(data.index(f"agent {i}") for i in range(5))
    ghost = t["solver's plan"]["marker"]
    assert (ghost["symbol"], ghost["line"]["width"], t["solver's plan"]["opacity"]) == ("circle-open", 3, 0.9)
    rim = 2  # the white line around a disc
    assert figures.DISC_PX + 2 * rim < ghost["size"] - ghost["line"]["width"]  # the ghost's ring clears a disc
    assert ghost["size"] + ghost["line"]["width"] < figures.EVENT_PX - 4  # the event's ring clears the ghost's
    assert t["events"]["marker"]["size"] == [figures.EVENT_PX]


def _luminance(hex_colour: str) -> float:
    """WCAG 2's relative luminance of an sRGB colour."""
    channels = [int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    r, g, b = (c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: str, b: str) -> float:
    """WCAG 2's contrast ratio, from 1 (the same) to 21 (black on white)."""
    light, dark = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


def test_contrast_is_computed_as_wcag_defines_it():
    assert round(contrast("#000000", "#ffffff"), 2) == 21.0 and contrast("#777777", "#777777") == 1.0
    assert round(contrast("#767676", "#ffffff"), 2) == 4.54  # the usual grey text on white


@pytest.mark.parametrize("agent", range(len(figures.AGENT_COLOURS)))
def test_every_agent_colour_stands_out_on_ice_and_on_a_hole(agent):
    """An agent's colour (its number, its path, its rings) has a contrast ratio of at least 3:1 (WCAG's bound for
    graphics and large text) against both cells of the board, and its disc against its white number."""
    c = figures.colour(agent)
    assert min(contrast(c, figures.ICE), contrast(c, figures.HOLE), contrast(c, "#ffffff")) >= 3.0, c


def test_a_large_board_is_drawn_tall_enough_for_its_cells():
    """A board's figure is 460 px tall, or taller where its cells need `CELL_PX` each (10x10: 610 px), in a replay
    too (60 px more, for the play button and the slider)."""
    ten = Instance.from_str("A" + "." * 9 + "\n" + ("." * 10 + "\n") * 8 + "." * 9 + "a")
    assert [figures.board_figure(b).layout.height for b in (OPEN, label(FIVE), ten)] == [460, 460, 610]
    assert figures.replay_figure(ten, score_answer(ten, "Agent 0: DOWN"))["layout"]["height"] == 670
