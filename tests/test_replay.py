"""Replays as GIFs: one frame per step, each agent's colour exactly where the scorer puts the agent."""

import itertools
from pathlib import Path

import pytest
from PIL import Image, ImageSequence

from envsim.scoring import score_answer
from envsim.solver import label
from lab.cli import main
from lab.replay import TEXT, cell_centre, colour, replay_gif
from tests.boards import CROSSING, OPEN

CELL_PX = 40
# OPEN: agent 0 goes (0,0) -> (2,2) along the top and right edges; agent 1 waits once, then (2,0) -> (0,2)
# behind it along the left and top edges. No conflict, 6 steps.
PLAN = "Agent 0: R R D D\nAgent 1: W U U R R"
POSITIONS = (((0, 0), (2, 0)), ((0, 1), (2, 0)), ((0, 2), (1, 0)), ((1, 2), (0, 0)), ((2, 2), (0, 1)),
             ((2, 2), (0, 2)))


def _frames(path: Path) -> list[Image.Image]:
    with Image.open(path) as gif:
        return [frame.convert("RGB") for frame in ImageSequence.Iterator(gif)]


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))


@pytest.mark.parametrize(("board", "answer", "steps"), [
    (OPEN, PLAN, 5),
    (CROSSING, "Agent 0: D D\nAgent 1: R R", 2),  # a vertex conflict at t=1
    (OPEN, "Agent 0: U\nAgent 1: D D D", 3),  # moves off the grid
    (OPEN, "no idea", 0),  # a parse error: the board alone
])
def test_a_gif_has_one_frame_per_step(tmp_path: Path, board, answer, steps):
    outcome = score_answer(board, answer)
    assert len(outcome.positions) == steps + 1
    frames = _frames(replay_gif(board, outcome, tmp_path / "replay.gif", cell_px=CELL_PX))
    assert len(frames) == steps + 1


def test_each_agent_is_drawn_on_the_cell_the_scorer_reports_and_nowhere_else(tmp_path: Path):
    board = label(OPEN)
    outcome = score_answer(board, PLAN)
    assert outcome.valid and outcome.positions == POSITIONS
    frames = _frames(replay_gif(board, outcome, tmp_path / "replay.gif", cell_px=CELL_PX))
    agents = {_rgb(colour(i)): i for i in range(board.num_agents)}
    for t, frame in enumerate(frames):
        seen = {}
        for r in range(board.size):
            for c in range(board.size):
                x, y = cell_centre((r, c), CELL_PX)
                pixel = frame.getpixel((x, y + CELL_PX // 5))  # the disc below its number
                if pixel in agents:
                    seen[agents[pixel]] = (r, c)
        assert seen == dict(enumerate(POSITIONS[t])), f"frame {t}"


def test_agents_that_share_a_cell_are_both_drawn_in_it(tmp_path: Path):
    outcome = score_answer(CROSSING, "Agent 0: D D\nAgent 1: R R")
    assert outcome.positions[1] == ((1, 1), (1, 1))
    frame = _frames(replay_gif(CROSSING, outcome, tmp_path / "replay.gif", cell_px=CELL_PX))[1]
    x, y = cell_centre((1, 1), CELL_PX)
    inside = {frame.getpixel((x + dx, y + dy)) for dx in range(-CELL_PX // 2, CELL_PX // 2)
              for dy in range(-CELL_PX // 2, CELL_PX // 2)}
    assert {_rgb(colour(0)), _rgb(colour(1))} <= inside


def test_show_writes_the_gif_of_a_plan(tmp_path: Path, capsys):
    boards = tmp_path / "boards.jsonl"
    boards.write_text(label(OPEN).to_json() + "\n")
    out = tmp_path / "slides" / "open.gif"
    assert main(["show", "--instances", str(boards), "--plan", PLAN, "--gif", str(out)]) == 0
    assert capsys.readouterr().out.rstrip().endswith(f"replay: {out} (6 frames)")
    assert len(_frames(out)) == 6
    assert main(["show", "--instances", str(boards), "--gif", str(out)]) == 2
    assert capsys.readouterr().err.strip() == "envlab show: --gif replays a plan: give --plan or --reference"


def test_each_failure_reads_as_a_sentence():
    from envsim.rules import Failure
    from envsim.scoring import Event
    from lab.replay import describe

    said = {f: describe(Event(f, 3, agents, cell)) for f, agents, cell in [
        (Failure.VERTEX_CONFLICT, (0, 1), (1, 1)), (Failure.EDGE_CONFLICT, (2, 4), (0, 3)),
        (Failure.HOLE, (3,), (2, 2)), (Failure.ILLEGAL_MOVE, (0,), (-1, 0)), (Failure.GOAL_NOT_REACHED, (1,), (4, 4)),
        (Failure.TOO_LONG, (2,), None), (Failure.PARSE_ERROR, (), None), (Failure.WRONG_AGENT_COUNT, (), None)]}
    assert said == {
        Failure.VERTEX_CONFLICT: "t=3: agents 0 and 1 collide at (1, 1)",
        Failure.EDGE_CONFLICT: "t=3: agents 2 and 4 swap cells, crossing into (0, 3)",
        Failure.HOLE: "t=3: agent 3 falls into the hole at (2, 2)",
        Failure.ILLEGAL_MOVE: "t=3: agent 0 moves off the board at (-1, 0)",
        Failure.GOAL_NOT_REACHED: "t=3: agent 1 ends at (4, 4), off its goal",
        Failure.TOO_LONG: "t=3: agent 2's plan runs past the horizon",
        Failure.PARSE_ERROR: "t=3: the answer cannot be read as a plan",
        Failure.WRONG_AGENT_COUNT: "t=3: the plan's agents are not the board's"}


def test_the_ghost_rings_the_solvers_cells_and_each_goal_and_agent_carries_its_number(tmp_path: Path):
    board = label(OPEN)
    outcome = score_answer(board, "Agent 0: W\nAgent 1: R")  # both off the solver's cells (0,1) and (1,0) at t=1
    plain, ringed = (_frames(replay_gif(board, outcome, tmp_path / f"{g}.gif", cell_px=CELL_PX, ghost=g))
                     for g in (False, True))
    ghost = score_answer(board, " \n".join(f"Agent {i}: {' '.join(a)}" for i, a in enumerate(board.reference_plan)))
    for i in range(board.num_agents):
        x, y = cell_centre(ghost.positions[1][i], CELL_PX)
        left = (x - int(0.4 * CELL_PX) + 1, y)  # the ring's leftmost point, outside any disc
        assert (ringed[1].getpixel(left), plain[1].getpixel(left)) == (_rgb(colour(i)), _rgb("#eaf4fb")), i
    for i, goal in enumerate(board.goals):  # the number in the goal square's corner, in the agent's colour
        x, y = cell_centre(goal, CELL_PX)
        corner = {plain[0].getpixel((x + dx, y + dy)) for dx in range(4, CELL_PX // 2) for dy in range(4, CELL_PX // 2)}
        assert _rgb(colour(i)) in corner
    for t, frame in enumerate(plain):  # a white number on each disc
        for i, cell in enumerate(outcome.positions[t]):
            x, y = cell_centre(cell, CELL_PX)
            disc = {frame.getpixel((x + dx, y + dy)) for dx in range(-4, 5) for dy in range(-6, 3)}
            assert _rgb("#ffffff") in disc and _rgb(colour(i)) in disc


def test_show_writes_a_gif_of_the_width_asked_and_refuses_one_too_narrow(tmp_path: Path, capsys):
    boards = tmp_path / "boards.jsonl"
    boards.write_text(label(CROSSING).to_json() + "\n")
    out = tmp_path / "clash.gif"
    assert main(["show", "--instances", str(boards), "--plan", "Agent 0: D D\nAgent 1: R R", "--gif", str(out),
                 "--gif-width", "720", "--ghost"]) == 0
    printed = capsys.readouterr().out
    assert "t=1: agents 0 and 1 collide at (1, 1)" in printed
    with Image.open(out) as gif:
        assert gif.size[0] == 720
    assert main(["show", "--instances", str(boards), "--reference", "--gif", str(out), "--gif-width", "50"]) == 2
    assert "50 is less than 120: a replay narrower than that is unreadable" in capsys.readouterr().err


@pytest.mark.parametrize("width, lines", [(480, 2), (960, 1)])
def test_a_gif_is_the_width_asked_its_legend_on_two_lines_where_one_does_not_fit(tmp_path: Path, width, lines):
    """A 2-agent clash with the ghost at 480 px: at the smallest caption font the legend is wider than the image, so
    its words go on a second line and the image stays 480 wide (it was 561); at 960 it fits on one."""
    board = label(CROSSING)
    outcome = score_answer(board, "Agent 0: D D\nAgent 1: R R")
    with Image.open(replay_gif(board, outcome, tmp_path / "g.gif", width_px=width, ghost=True)) as gif:
        assert gif.width == width
        frame, below_board = gif.convert("RGB"), (board.size + 1) * (width // (board.size + 1))
        text_rows = [y for y in range(below_board, gif.height)
                     if any(frame.getpixel((x, y)) == _rgb(TEXT) for x in range(gif.width))]
    bands = 1 + sum(b - a > 3 for a, b in itertools.pairwise(text_rows))  # runs of rows holding text
    assert bands == 1 + lines  # the caption, then the legend's lines


def test_a_goals_number_stays_readable_under_agents_crowding_its_cell(tmp_path: Path):
    """Agents 1 and 2 collide on agent 0's goal: their discs share the cell, and the goal's number is drawn over
    them, in agent 0's colour."""
    from envsim.instance import Instance

    board = Instance.from_str("""
.B.
AaC
bc.
""")
    outcome = score_answer(board, "Agent 0: W R\nAgent 1: D\nAgent 2: L")
    assert outcome.positions[1] == ((1, 0), (1, 1), (1, 1))
    alone, crowded = _frames(replay_gif(board, outcome, tmp_path / "crowd.gif", cell_px=CELL_PX))[:2]
    x, y = cell_centre((1, 1), CELL_PX)
    corner = [(x + dx, y + dy) for dx in range(6, 15) for dy in range(6, 15)]  # the number, inside the square
    number = [xy for xy in corner if alone.getpixel(xy) == _rgb(colour(0))]  # t = 0: nobody on the goal
    assert len(number) >= 10
    assert [crowded.getpixel(xy) for xy in number] == [_rgb(colour(0))] * len(number)  # t = 1: all of it shows
    assert _rgb(colour(2)) in {crowded.getpixel(xy) for xy in corner}  # beside agent 2's disc
