"""Replays as animated GIFs, for slides: one frame per time step of an episode, drawn with Pillow.

The page and `lab.pages.figures.replay_figure` replay an episode in Plotly; a GIF plays anywhere (a slide, a
chat, a README) without a browser. Frame `t` shows the board (ice, holes, each goal as a square outline in
its agent's colour), every agent's marker (a disc in `colour(i)`, so the GIF and the Plotly
replay agree) at the cell the scorer reports at step `t`, the events up to `t` as red rings (those at `t`
thick), and a caption (`step_caption`). Agents that share a cell (a vertex conflict) are drawn
side by side in it; an event off the grid (an illegal move) is drawn on the margin it ran into.

Frames are drawn in palette mode with a fixed palette, so every pixel holds exactly one of the colours
below: nothing is dithered or quantised, and a pixel's colour can be checked exactly. Each caption names
its step, so no two consecutive frames are identical and Pillow never merges two of them: a GIF of an
outcome with T steps has exactly T + 1 frames.
"""

from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from envsim.instance import Instance
from envsim.scoring import Event, Outcome

# Drawing words shared with the page's Plotly figures (lab.pages.figures), so a GIF and a replay agree.
AGENT_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
ICE, HOLE, EVENT = "#eaf4fb", "#1d2b4a", "#d62728"


def colour(agent: int) -> str:
    return AGENT_COLOURS[agent % len(AGENT_COLOURS)]


def last_step(outcome: Outcome | None) -> int:
    return 0 if outcome is None else len(outcome.positions) - 1


def describe(event: Event) -> str:
    who = " and ".join(f"agent {a}" for a in event.agents) or "the plan"
    where = f" at ({event.cell[0]},{event.cell[1]})" if event.cell is not None else ""
    return f"t={event.time}: {event.type.value}, {who}{where}"


def step_caption(outcome: Outcome | None, step: int) -> str:
    """One line for the figure's title: the time and what happens at it."""
    if outcome is None:
        return "the board (no plan yet)"
    now = [e for e in outcome.events if e.time == step]
    text = f"t = {step} / {last_step(outcome)}"
    if now:
        text += ": " + "; ".join(f"{e.type.value} ({', '.join(map(str, e.agents)) or 'plan'})" for e in now)
    elif step == last_step(outcome):
        if outcome.valid:
            text += ": the end, valid"
        elif outcome.failure:
            earlier = [e.time for e in outcome.events if e.time < step]
            text += f": the end ({outcome.failure.value}" + (f" at t={earlier[0]})" if earlier else ")")
    return text



WHITE, TEXT = "#ffffff", "#1d2b4a"
PALETTE = (WHITE, ICE, HOLE, EVENT, TEXT, *AGENT_COLOURS)


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))


def _ink(hex_colour: str) -> int:
    """The palette index of one of `PALETTE`'s colours (what ImageDraw fills with in mode "P")."""
    return PALETTE.index(hex_colour)


def cell_centre(cell: tuple[int, int], cell_px: int) -> tuple[int, int]:
    """The pixel `(x, y)` at the centre of board cell `(row, col)` in every frame (a margin of half a cell
    surrounds the board, for events off the grid)."""
    margin = cell_px // 2
    return margin + cell[1] * cell_px + cell_px // 2, margin + cell[0] * cell_px + cell_px // 2


def _box(centre: tuple[float, float], radius: float) -> tuple[float, float, float, float]:
    return centre[0] - radius, centre[1] - radius, centre[0] + radius, centre[1] + radius


def _board(instance: Instance, cell_px: int, size: tuple[int, int]) -> Image.Image:
    """The frame's still part: ice, holes and goals on a white canvas."""
    image = Image.new("P", size, _ink(WHITE))
    image.putpalette([v for c in PALETTE for v in _rgb(c)])
    draw = ImageDraw.Draw(image)
    half, gap = cell_px // 2, max(1, cell_px // 24)
    for r in range(instance.size):
        for c in range(instance.size):
            x, y = cell_centre((r, c), cell_px)
            fill = HOLE if (r, c) in instance.hole_set else ICE
            draw.rectangle((x - half + gap, y - half + gap, x + half - gap, y + half - gap), fill=_ink(fill))
    for i, goal in enumerate(instance.goals):
        draw.rectangle(_box(cell_centre(goal, cell_px), half - 3 * gap), outline=_ink(colour(i)),
                       width=max(2, cell_px // 16))
    return image


def _frame(board: Image.Image, instance: Instance, outcome: Outcome, step: int, cell_px: int,
           font: ImageFont.FreeTypeFont | ImageFont.ImageFont) -> Image.Image:
    image = board.copy()
    draw = ImageDraw.Draw(image)
    n = instance.size
    for event in outcome.events:
        if event.cell is None or event.time > step:
            continue
        on_board = tuple(min(max(v, -0.5), n - 0.5) for v in event.cell)  # an off-grid move: the edge it hit
        x, y = cell_centre((0, 0), cell_px)
        centre = (x + on_board[1] * cell_px, y + on_board[0] * cell_px)
        width = max(2, cell_px // 10) if event.time == step else max(1, cell_px // 24)
        draw.ellipse(_box(centre, cell_px * 0.45), outline=_ink(EVENT), width=width)
    now = outcome.positions[step]
    for cell in dict.fromkeys(now):
        here = [i for i, c in enumerate(now) if c == cell]
        x, y = cell_centre(cell, cell_px)
        radius = cell_px * 0.3 / len(here) ** 0.5
        for slot, i in enumerate(here):  # side by side, centred on the cell
            dx = (slot - (len(here) - 1) / 2) * 2.1 * radius
            draw.ellipse(_box((x + dx, y), radius), fill=_ink(colour(i)), outline=_ink(WHITE), width=1)
    draw.text((cell_px // 2, (n + 1) * cell_px), step_caption(outcome, step), fill=_ink(TEXT), font=font)
    return image


GIF_WIDTHS = (480, 720, 960)  # the widths the page offers, in pixels: a slide needs at least the first


def replay_gif(instance: Instance, outcome: Outcome, path: str | Path, *, cell_px: int = 48,
               ms_per_step: int = 500, width_px: int | None = None) -> Path:
    """Write the episode `outcome` of `instance` as an animated GIF at `path`, one frame per step
    (`last_step(outcome) + 1` frames), looping; the last frame is held three times as long. With `width_px`
    the cells are sized so that the image is about that wide (a small board stays legible on a slide)."""
    if width_px is not None:
        cell_px = max(8, width_px // (instance.size + 1))
    if cell_px < 8:
        raise ValueError(f"cell_px = {cell_px}: a cell needs at least 8 pixels")
    steps = range(last_step(outcome) + 1)
    measure = ImageDraw.Draw(Image.new("P", (1, 1)))
    font_px = max(10, cell_px // 3)
    while True:  # with `width_px`, the captions shrink to fit that width (a large board's cells would not)
        font = ImageFont.load_default(size=font_px)
        text_px = max(measure.textlength(step_caption(outcome, t), font=font) for t in steps)
        if width_px is None or font_px == 10 or text_px + cell_px // 2 <= width_px:
            break
        font_px -= 1
    width = max((instance.size + 1) * cell_px, int(text_px) + cell_px // 2 if width_px else int(text_px) + cell_px,
                width_px or 0)
    height = (instance.size + 1) * cell_px + max(16, cell_px // 2)
    board = _board(instance, cell_px, (width, height))
    frames = [_frame(board, instance, outcome, t, cell_px, font) for t in steps]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    durations = [ms_per_step] * (len(frames) - 1) + [3 * ms_per_step]
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=durations, loop=0)
    return path
