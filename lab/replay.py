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

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from envsim.instance import Instance
from envsim.rules import Failure
from envsim.scoring import Event, Outcome, score

# Drawing words shared with the page's Plotly figures (lab.pages.figures), so a GIF and a replay agree. Each agent's
# colour has a WCAG contrast ratio of at least 3:1 against both cell colours (ice and hole) and against the white
# number on its disc; hues apart (no brown beside the orange), so five agents read at a glance.
AGENT_COLOURS = ("#2a7fc1", "#d35f00", "#2e8b2e", "#9a5fc8", "#cc4a99", "#008a7a", "#858a00", "#7f7f7f")
ICE, HOLE, EVENT = "#eaf4fb", "#1d2b4a", "#d62728"


def colour(agent: int) -> str:
    return AGENT_COLOURS[agent % len(AGENT_COLOURS)]


def last_step(outcome: Outcome | None) -> int:
    return 0 if outcome is None else len(outcome.positions) - 1


def agents_named(agents: tuple[int, ...]) -> str:
    """`agent 0`, `agents 0 and 1`, `agents 0, 1 and 2`."""
    if len(agents) == 1:
        return f"agent {agents[0]}"
    return "agents " + ", ".join(map(str, agents[:-1])) + f" and {agents[-1]}"


# What each failure says, as a sentence a person reads in a caption (the cell is the event's; docs/rules.md).
SENTENCES = {
    Failure.PARSE_ERROR: "the answer cannot be read as a plan",
    Failure.WRONG_AGENT_COUNT: "the plan's agents are not the board's",
    Failure.TOO_LONG: "{who}'s plan runs past the horizon",
    Failure.ILLEGAL_MOVE: "{who} moves off the board at {cell}",
    Failure.HOLE: "{who} falls into the hole at {cell}",
    Failure.VERTEX_CONFLICT: "{who} collide at {cell}",
    Failure.EDGE_CONFLICT: "{who} swap cells, crossing into {cell}",
    Failure.GOAL_NOT_REACHED: "{who} ends at {cell}, off its goal",
}


def sentence(event: Event) -> str:
    """What happened, in words: `agents 0 and 1 collide at (1, 1)`."""
    cell = "" if event.cell is None else f"({event.cell[0]}, {event.cell[1]})"
    return SENTENCES[event.type].format(who=agents_named(event.agents) if event.agents else "the plan", cell=cell)


def describe(event: Event) -> str:
    return f"t={event.time}: {sentence(event)}"


def step_caption(outcome: Outcome | None, step: int) -> str:
    """One line for the figure's title: the time and what happens at it."""
    if outcome is None:
        return "the board (no plan yet)"
    now = [e for e in outcome.events if e.time == step]
    text = f"t = {step} / {last_step(outcome)}"
    if now:
        text += ": " + "; ".join(sentence(e) for e in now)
    elif step == last_step(outcome):
        if outcome.valid:
            text += ": the end, valid"
        elif outcome.failure:
            earlier = [e for e in outcome.events if e.time < step]
            text += ": the end" + (f" (t={earlier[0].time}: {sentence(earlier[0])})" if earlier else "")
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
    image.putpalette([v for colour in PALETTE for v in _rgb(colour)])
    draw = ImageDraw.Draw(image)
    half, gap = cell_px // 2, max(1, cell_px // 24)
    for row in range(instance.size):
        for col in range(instance.size):
            x, y = cell_centre((row, col), cell_px)
            fill = HOLE if (row, col) in instance.hole_set else ICE
            draw.rectangle((x - half + gap, y - half + gap, x + half - gap, y + half - gap), fill=_ink(fill))
    for i, goal in enumerate(instance.goals):
        x, y = cell_centre(goal, cell_px)
        draw.rectangle(_box((x, y), half - 3 * gap), outline=_ink(colour(i)), width=max(2, cell_px // 16))
    return image


def _goal_numbers(draw: ImageDraw.ImageDraw, instance: Instance, cell_px: int) -> None:
    """Each goal's agent, in its square's lower right corner, outlined in white: drawn over the agents, so that
    discs crowding the cell never hide whose goal it is."""
    half, gap = cell_px // 2, max(1, cell_px // 24)
    font = ImageFont.load_default(size=max(8, cell_px // 4))
    for i, goal in enumerate(instance.goals):
        x, y = cell_centre(goal, cell_px)
        draw.text((x + half - 4 * gap, y + half - 4 * gap), str(i), fill=_ink(colour(i)), font=font, anchor="rb",
                  stroke_width=max(1, cell_px // 32), stroke_fill=_ink(WHITE))


def ghost_positions(instance: Instance) -> tuple[tuple[tuple[int, int], ...], ...] | None:
    """Where the solver's reference plan puts every agent at each time (None for an unlabelled board)."""
    if instance.reference_plan is None:
        return None
    return score(instance, instance.reference_plan).positions


def _legend(draw: ImageDraw.ImageDraw, instance: Instance, top: int, cell_px: int, font: Any, ghost: bool,
            width: int) -> None:
    """Under the caption: each agent's disc and number, then what a square, a ring and a red ring mean; on one
    line where the image is wide enough, else the words on a second line (`legend_lines`)."""
    x, radius = cell_px // 2, _radius(font)
    for i in range(instance.num_agents):
        draw.ellipse(_box((x + radius, top + radius), radius), fill=_ink(colour(i)))
        draw.text((x + 2 * radius + 3, top + radius), f"agent {i}", fill=_ink(TEXT), font=font, anchor="lm")
        x += 2 * radius + 8 + int(draw.textlength(f"agent {i}", font=font)) + 10
    if legend_lines(instance, cell_px, font, ghost, width) == 2:
        x, top = cell_px // 2, top + _line(font)
    draw.text((x, top + radius), _legend_words(ghost), fill=_ink(TEXT), font=font, anchor="lm")


def _legend_words(ghost: bool) -> str:
    return "square: its goal" + ("; ring: the solver's plan" if ghost else "") + "; red: what went wrong"


def _radius(font: Any) -> int:
    """A legend disc's radius: as tall as the legend's text."""
    return max(4, int(getattr(font, "size", 10)) // 2)


def _legend_widths(instance: Instance, font: Any, ghost: bool) -> tuple[int, int]:
    """The legend's agents and its words, each's width in pixels."""
    draw = ImageDraw.Draw(Image.new("P", (1, 1)))
    radius = _radius(font)
    agents = sum(2 * radius + 18 + int(draw.textlength(f"agent {i}", font=font)) for i in range(instance.num_agents))
    return agents, int(draw.textlength(_legend_words(ghost), font=font))


def legend_width(instance: Instance, cell_px: int, font: Any, ghost: bool, lines: int = 1) -> int:
    """The legend's width in pixels, on one line or on two (the agents, then the words)."""
    agents, words = _legend_widths(instance, font, ghost)
    return cell_px // 2 + (agents + words if lines == 1 else max(agents, words)) + cell_px // 2


def legend_lines(instance: Instance, cell_px: int, font: Any, ghost: bool, width: int) -> int:
    """1 where the legend fits on one line of an image `width` wide, else 2."""
    return 1 if legend_width(instance, cell_px, font, ghost) <= width else 2


def _frame(board: Image.Image, instance: Instance, outcome: Outcome, step: int, cell_px: int,
           font: ImageFont.FreeTypeFont | ImageFont.ImageFont,
           ghost: Sequence[Sequence[tuple[int, int]]] | None = None) -> Image.Image:
    image = board.copy()
    draw = ImageDraw.Draw(image)
    n = instance.size
    if ghost is not None:  # the solver's plan at this step: a ring in the agent's colour
        for i, cell in enumerate(ghost[min(step, len(ghost) - 1)]):
            draw.ellipse(_box(cell_centre(cell, cell_px), cell_px * 0.4), outline=_ink(colour(i)),
                         width=max(1, cell_px // 20))
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
        here = [i for i, position in enumerate(now) if position == cell]
        x, y = cell_centre(cell, cell_px)
        radius = cell_px * 0.3 / len(here) ** 0.5
        number = ImageFont.load_default(size=max(7, int(radius * 1.1)))
        for slot, i in enumerate(here):  # side by side, centred on the cell
            dx = (slot - (len(here) - 1) / 2) * 2.1 * radius
            draw.ellipse(_box((x + dx, y), radius), fill=_ink(colour(i)), outline=_ink(WHITE), width=1)
            draw.text((x + dx, y - radius * 0.15), str(i), fill=_ink(WHITE), font=number, anchor="mm")
    _goal_numbers(draw, instance, cell_px)
    draw.text((cell_px // 2, (n + 1) * cell_px), step_caption(outcome, step), fill=_ink(TEXT), font=font)
    _legend(draw, instance, (n + 1) * cell_px + _line(font), cell_px, font, ghost is not None, image.width)
    return image


def _line(font: Any) -> int:
    """The height of one line of text in `font`, with a little space under it."""
    return int(font.size * 1.5) if hasattr(font, "size") else 16


GIF_WIDTHS = (480, 720, 960)  # the widths the page offers, in pixels: a slide needs at least the first


def replay_gif(instance: Instance, outcome: Outcome, path: str | Path, *, cell_px: int = 48,
               ms_per_step: int = 500, width_px: int | None = None, ghost: bool = False) -> Path:
    """Write the episode `outcome` of `instance` as an animated GIF at `path`, one frame per step
    (`last_step(outcome) + 1` frames), looping; the last frame is held three times as long. With `width_px`
    the cells are sized so that the image is about that wide (a small board stays legible on a slide). With
    `ghost`, the solver's plan is drawn too (a ring per agent), where the board has one."""
    if width_px is not None:
        cell_px = max(8, width_px // (instance.size + 1))
    if cell_px < 8:
        raise ValueError(f"cell_px = {cell_px}: a cell needs at least 8 pixels")
    steps = range(last_step(outcome) + 1)
    plan = ghost_positions(instance) if ghost else None
    measure = ImageDraw.Draw(Image.new("P", (1, 1)))
    font_px = max(10, cell_px // 3)
    lines = 1
    while True:  # with `width_px`, the captions shrink to fit that width (a large board's cells would not), and
        font = ImageFont.load_default(size=font_px)  # at the smallest font the legend takes two lines
        text_px = max(*(measure.textlength(step_caption(outcome, t), font=font) for t in steps),
                      legend_width(instance, cell_px, font, plan is not None, lines) - cell_px // 2)
        if width_px is None or text_px + cell_px // 2 <= width_px or (font_px == 10 and lines == 2):
            break
        if font_px == 10:
            lines = 2
        else:
            font_px -= 1
    width = max((instance.size + 1) * cell_px, int(text_px) + cell_px // 2 if width_px else int(text_px) + cell_px,
                width_px or 0)
    height = (instance.size + 1) * cell_px + (1 + legend_lines(instance, cell_px, font, plan is not None, width)) \
        * _line(font) + max(4, cell_px // 4)
    board = _board(instance, cell_px, (width, height))
    frames = [_frame(board, instance, outcome, t, cell_px, font, plan) for t in steps]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    durations = [ms_per_step] * (len(frames) - 1) + [3 * ms_per_step]
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=durations, loop=0)
    return path
