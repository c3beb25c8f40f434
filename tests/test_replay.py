"""Replays as GIFs: one frame per step, each agent's colour exactly where the scorer puts the agent."""

from pathlib import Path

import pytest
from PIL import Image, ImageSequence

from envsim.scoring import score_answer
from envsim.solver import label
from lab.cli import main
from lab.replay import cell_centre, colour, replay_gif
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
                pixel = frame.getpixel(cell_centre((r, c), CELL_PX))
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
