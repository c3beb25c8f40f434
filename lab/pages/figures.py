"""Figures of the web lab: boards and replays, rates per size, curves across stages, failures, training.

Pure functions of envsim objects, `lab.results` summaries and plain data, so the page, the tests and the
benchmarks draw the same thing. A board puts cell `(row, col)` at `x = col`, `y = row` with the y axis reversed
(row 0 on top, as in docs/rules.md), so a test reads an agent's cell straight off its trace: `(y[0], x[0])`.

Trace names are part of the contract (tests and the browser read them), in the order drawn: `board`,
`ghost path {i}`, then the moving ones `path {i}`, `events`, `agent {i}`, `solver's plan` (the ghost), then
`goals` (the squares), `starts` and `goal numbers` (each agent's number in a corner of its start's and its goal's
cell).

Gradio's `gr.Plot` draws a figure with `Plotly.react(data, layout)` and drops `frames`, so the page steps a
replay on the server (`board_figure(..., step=t)` from a slider); `replay_figure` carries every step as a
Plotly frame with its own slider and play button, for a replay saved as a standalone HTML file.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from envsim.instance import Instance
from envsim.rules import Failure
from envsim.scoring import Outcome, Tally
from lab.replay import (
    AGENT_COLOURS,
    EVENT,
    HOLE,
    ICE,
    colour,
    describe,
    ghost_positions,
    last_step,
    step_caption,
)
from lab.results import StageSummary

__all__ = ["AGENT_COLOURS", "EVENT", "HOLE", "ICE", "colour", "describe", "ghost_positions", "last_step",
           "step_caption"]  # shared

FAILURES = tuple(f.value for f in Failure)
POOLED_VALID, POOLED_OPTIMAL = "pooled valid", "pooled optimal"  # the names of a stage's rates on the page
_FONT = dict(family="system-ui, sans-serif", size=13)


# ---------------------------------------------------------------- one board at one step


def _static_traces(instance: Instance, ghost: Sequence[Sequence[tuple[int, int]]] | None,
                   axes: dict[str, str]) -> list[dict[str, Any]]:
    n, k = instance.size, instance.num_agents
    holes = instance.hole_set
    z = [[1 if (row, col) in holes else 0 for col in range(n)] for row in range(n)]
    hover = [[f"({row},{col}) {'hole' if (row, col) in holes else 'ice'}" for col in range(n)] for row in range(n)]
    traces: list[dict[str, Any]] = [dict(
        type="heatmap", name="board", z=z, x=list(range(n)), y=list(range(n)), zmin=0, zmax=1,
        colorscale=[[0, ICE], [0.5, ICE], [0.5, HOLE], [1, HOLE]], showscale=False, xgap=1, ygap=1,
        hovertext=hover, hoverinfo="text", **axes)]
    if ghost is not None:
        for i in range(k):
            cells = [row[i] for row in ghost]
            traces.append(dict(
                type="scatter", name=f"ghost path {i}", mode="lines", x=[cell[1] for cell in cells],
                y=[cell[0] for cell in cells], line=dict(color=colour(i), width=2, dash="dot"), opacity=0.45,
                hoverinfo="skip", showlegend=False, **axes))
    return traces


LABEL_PX = 12  # the start and goal numbers' font
# Where a start's and a goal's number sit: anchored just inside a corner of its own cell and written into it
# (`START_CORNER` the top left, `GOAL_CORNER` the bottom right, by its square, as in the GIF), so that no number
# spills into another cell (where another number or an agent would be) and the two numbers a cell can hold sit apart.
START_CORNER, GOAL_CORNER = (-0.44, -0.44), (0.44, 0.44)  # (row, col) from the cell's centre
KEY = "corner numbers: an agent's start (top left), its goal (in its square) · red ring: an event"


def _mark_traces(instance: Instance, axes: dict[str, str]) -> list[dict[str, Any]]:
    """Each agent's goal (a square in its colour) and its start and goal numbers, in the corners of their own cells
    (`START_CORNER`, `GOAL_CORNER`): drawn over the agents, each number with a shadow that keeps it readable on a
    disc's edge; the hover names them in words."""
    k = instance.num_agents
    colours = [colour(i) for i in range(k)]
    traces: list[dict[str, Any]] = []
    traces.append(dict(
        type="scatter", name="goals", mode="markers", x=[g[1] for g in instance.goals],
        y=[g[0] for g in instance.goals],
        marker=dict(symbol="square-open", size=30, line=dict(width=3), color=colours),
        hovertext=[f"goal of agent {i} {g}" for i, g in enumerate(instance.goals)], hoverinfo="text",
        showlegend=False, cliponaxis=False, **axes))
    for name, what, cells, (dy, dx), position in (
            ("starts", "start", instance.starts, START_CORNER, "bottom right"),
            ("goal numbers", "goal", instance.goals, GOAL_CORNER, "top left")):
        traces.append(dict(
            type="scatter", name=name, mode="text", x=[c[1] + dx for c in cells], y=[c[0] + dy for c in cells],
            text=[str(i) for i in range(k)], textposition=position,
            textfont=dict(color=colours, size=LABEL_PX, shadow="auto", weight="bold"),
            hovertext=[f"{what} of agent {i} {c}" for i, c in enumerate(cells)], hoverinfo="text",
            showlegend=False, cliponaxis=False, **axes))
    return traces


def _offset(i: int, k: int) -> float:
    """Paths of different agents are drawn a little apart so that shared corridors stay readable."""
    return (i - (k - 1) / 2) * 0.08


def _moving_traces(instance: Instance, outcome: Outcome | None, step: int,
                   ghost: Sequence[Sequence[tuple[int, int]]] | None, axes: dict[str, str],
                   legend: bool = True) -> list[dict[str, Any]]:
    """Paths up to `step`, the events up to `step`, the agents at `step` and the ghost at `step`, in the order they
    are drawn: an event is a red ring around its cell, wider than the ghost's ring and drawn under the agents, so it
    marks the agents involved without hiding any of them."""
    k = instance.num_agents
    positions = outcome.positions if outcome is not None else (instance.starts,)
    now = positions[min(step, len(positions) - 1)]
    traces: list[dict[str, Any]] = []
    for i in range(k):
        cells = [row[i] for row in positions[:step + 1]]
        d = _offset(i, k)
        traces.append(dict(
            type="scatter", name=f"path {i}", mode="lines", x=[cell[1] + d for cell in cells],
            y=[cell[0] + d for cell in cells],
            line=dict(color=colour(i), width=4), opacity=0.7, hoverinfo="skip", showlegend=False, **axes))
    shown = [e for e in (outcome.events if outcome else ()) if e.cell is not None and e.time <= step]
    cells = [_on_board(e.cell, instance.size) for e in shown]
    traces.append(dict(
        type="scatter", name="events", mode="markers", x=[cell[1] for cell in cells], y=[cell[0] for cell in cells],
        marker=dict(symbol="circle-open", color=EVENT, size=[EVENT_PX] * len(shown),
                    line=dict(width=[4 if e.time == step else 2 for e in shown]),
                    opacity=[1.0 if e.time == step else 0.5 for e in shown]),
        hovertext=[describe(e) for e in shown], hoverinfo="text", showlegend=False, **axes))
    for i, (dx, size) in enumerate(_side_by_side(now)):
        traces.append(dict(
            type="scatter", name=f"agent {i}", legendgroup=f"agent {i}", mode="markers+text",
            x=[round(now[i][1] + dx, 3)], y=[now[i][0]], text=[str(i)],
            textfont=dict(color="white", size=13 if size == DISC_PX else 10),
            marker=dict(size=size, color=colour(i), line=dict(color="white", width=2)),
            hovertext=[f"agent {i} at ({now[i][0]},{now[i][1]}), t={step}"], hoverinfo="text",
            showlegend=legend, **axes))
    if ghost is not None:
        at = ghost[min(step, len(ghost) - 1)]
        traces.append(dict(
            type="scatter", name="solver's plan", mode="markers", x=[cell[1] for cell in at],
            y=[cell[0] for cell in at],
            marker=dict(symbol="circle-open", size=GHOST_PX, line=dict(width=3), color=[colour(i) for i in range(k)]),
            opacity=0.9, hovertext=[f"solver's plan: agent {i} at ({cell[0]},{cell[1]})" for i, cell in enumerate(at)],
            hoverinfo="text", showlegend=legend, **axes))
    return traces


DISC_PX = 24  # an agent's disc, alone on its cell (with its white rim, 28 px across)
GHOST_PX = 32  # the solver's ring around a disc, clear of its rim (3 px thick: 29 to 35 px across)
EVENT_PX = 42  # an event's ring around its cell's agents and ghost, clear of both (up to 4 px thick)


def _side_by_side(now: Sequence[tuple[int, int]]) -> list[tuple[float, int]]:
    """Each agent's horizontal shift (in cells) and disc size: agents that share a cell (a collision) are drawn
    side by side in it, smaller, in the order of their numbers, so no disc hides another."""
    out = []
    for i, cell in enumerate(now):
        here = [j for j, other in enumerate(now) if other == cell]
        if len(here) == 1:
            out.append((0.0, DISC_PX))
            continue
        spread = min(0.36, 0.8 / (len(here) - 1))
        out.append(((here.index(i) - (len(here) - 1) / 2) * spread, max(10, round(DISC_PX / len(here) ** 0.5))))
    return out


def _on_board(cell: tuple[int, int], size: int) -> tuple[float, float]:
    """Where to draw an event: its cell, or for a move off the grid the board's edge it ran into."""
    return tuple(min(max(v, -0.5), size - 0.5) for v in cell)


def _board_layout(instance: Instance, title: str, height: int = 460) -> dict[str, Any]:
    n = instance.size
    return dict(
        title=dict(text=title, x=0.02, font=dict(size=15)), height=height, margin=dict(l=30, r=10, t=50, b=30),
        font=_FONT, plot_bgcolor="white", paper_bgcolor="white", hovermode="closest",
        xaxis=dict(range=[-0.5, n - 0.5], dtick=1, showgrid=False, zeroline=False, constrain="domain",
                   side="top", fixedrange=True),
        yaxis=dict(range=[n - 0.5, -0.5], dtick=1, showgrid=False, zeroline=False, scaleanchor="x",
                   constrain="domain", fixedrange=True),
        legend=dict(orientation="h", y=-0.02, yanchor="top", title=dict(text=KEY, side="top", font=dict(size=12))))


CELL_PX = 48  # the least a board's cell takes on the page: a disc, its ghost ring and two corner numbers apart
FRAME_PX = 130  # a board figure's height beside its board: title, axis labels, the legend and its key


def board_height(size: int) -> int:
    """A board figure's height in pixels: 460, or taller where `size` cells need it to take `CELL_PX` each."""
    return max(460, FRAME_PX + CELL_PX * size)


def board_figure(instance: Instance, outcome: Outcome | None = None, step: int | None = None, *,
                 ghost: bool = True, title: str | None = None, height: int | None = None) -> go.Figure:
    """The board at time `step` (default: the end): each agent's path so far and cell now, the solver's
    plan as a ghost, and every event up to `step` (those at `step` drawn thick); `height` by default as tall as
    its cells need (`board_height`)."""
    height = board_height(instance.size) if height is None else height
    step = last_step(outcome) if step is None else max(0, min(step, last_step(outcome)))
    ghosts = ghost_positions(instance) if ghost else None
    axes = dict(xaxis="x", yaxis="y")
    data = (_static_traces(instance, ghosts, axes) + _moving_traces(instance, outcome, step, ghosts, axes)
            + _mark_traces(instance, axes))
    layout = _board_layout(instance, step_caption(outcome, step) if title is None else title, height)
    plan_level = [e for e in (outcome.events if outcome else ()) if e.cell is None]
    if plan_level:
        layout["annotations"] = [dict(text="; ".join(describe(e) for e in plan_level), xref="paper", yref="paper",
                                      x=0.5, y=0.5, showarrow=False, font=dict(color=EVENT, size=15),
                                      bgcolor="rgba(255,255,255,0.85)")]
    return go.Figure(data=data, layout=layout)


def replay_figure(instance: Instance, outcome: Outcome, *, ghost: bool = True) -> dict[str, Any]:
    """Every step of an episode as a Plotly frame, with a time slider and a play/pause button.

    Returned as the plain figure dict Plotly.js reads (`write_replay_html` saves it): building `go.Frame`
    objects validates every property of every frame, five times the cost of the drawing itself. Frames
    carry only the moving traces, the same dicts `board_figure` draws (and validates).
    """
    ghosts = ghost_positions(instance) if ghost else None
    axes = dict(xaxis="x", yaxis="y")
    static = _static_traces(instance, ghosts, axes)
    moving = list(range(len(static), len(static) + 2 * instance.num_agents + 1 + (ghosts is not None)))
    end = last_step(outcome)
    frames = [dict(name=str(t), data=_moving_traces(instance, outcome, t, ghosts, axes), traces=moving,
                   layout=dict(title=dict(text=step_caption(outcome, t)))) for t in range(end + 1)]
    layout = _board_layout(instance, step_caption(outcome, 0), height=board_height(instance.size) + 60)
    layout["margin"]["b"] = 90
    animate = dict(frame=dict(duration=500, redraw=False), transition=dict(duration=0), mode="immediate")
    play = dict(label="▶ play", method="animate", args=[None, {**animate, "fromcurrent": True}])
    still = {**animate, "frame": dict(duration=0, redraw=False)}
    pause = dict(label="❚❚ pause", method="animate", args=[[None], still])
    layout["legend"] = dict(orientation="v", x=1.02, y=1, xanchor="left", yanchor="top",  # clear of the buttons
                            title=dict(text=KEY.replace(": ", ":<br>", 1).replace(", ", ",<br>").replace(" · ", "<br>"),
                                       side="top", font=dict(size=12)))
    layout["updatemenus"] = [dict(type="buttons", direction="left", x=0, y=-0.06, xanchor="left", yanchor="top",
                                  showactive=False, buttons=[play, pause])]
    layout["sliders"] = [dict(active=0, x=0.2, len=0.8, y=-0.04, yanchor="top", currentvalue=dict(prefix="t = "),
                              steps=[dict(label=str(t), method="animate", args=[[str(t)], animate])
                                     for t in range(end + 1)])]
    first = _moving_traces(instance, outcome, 0, ghosts, axes)
    return dict(data=static + first + _mark_traces(instance, axes), layout=layout, frames=frames)


def write_replay_html(figure: dict[str, Any], path: str, title: str = "envlab replay") -> None:
    """A standalone HTML file (Plotly.js inlined, so it opens offline) of a `replay_figure`, with `title` as the
    page's title and heading."""
    page = pio.to_html(figure, include_plotlyjs=True, validate=False, auto_play=False, full_html=True)
    name = html.escape(title)
    page = page.replace("<head>", f"<head><title>{name}</title>", 1).replace(
        "<body>", f'<body><h2 style="font-family: sans-serif; color: #1d2b4a">{name}</h2>', 1)
    Path(path).write_text(page, encoding="utf-8")


def boards_figure(panels: Sequence[tuple[Instance, Outcome | None, str]], *, ghost: bool = False,
                  columns: int = 4, height: int = 300) -> go.Figure:
    """Small boards side by side, each `(instance, outcome or None, title)`, drawn at the episode's end
    (the proposal preview and the "same board across stages" strip)."""
    if not panels:
        return empty_figure("nothing to show")
    columns = min(columns, len(panels))
    rows = -(-len(panels) // columns)
    fig = make_subplots(rows=rows, cols=columns, subplot_titles=[p[2] for p in panels],
                        horizontal_spacing=0.03, vertical_spacing=0.1)
    for n, (instance, outcome, _) in enumerate(panels):
        suffix = "" if n == 0 else str(n + 1)
        axes = dict(xaxis=f"x{suffix}", yaxis=f"y{suffix}")
        ghosts = ghost_positions(instance) if ghost else None
        fig.add_traces(_static_traces(instance, ghosts, axes)
                       + _moving_traces(instance, outcome, last_step(outcome), ghosts, axes, legend=False)
                       + _mark_traces(instance, axes))
        size = instance.size
        fig.update_layout({f"xaxis{suffix}": dict(range=[-0.5, size - 0.5], showticklabels=False, showgrid=False,
                                                  zeroline=False, constrain="domain", fixedrange=True),
                           f"yaxis{suffix}": dict(range=[size - 0.5, -0.5], showticklabels=False, showgrid=False,
                                                  zeroline=False, scaleanchor=f"x{suffix}", constrain="domain",
                                                  fixedrange=True)})
    fig.update_layout(height=height * rows + 30, margin=dict(l=10, r=10, t=70, b=10), font=_FONT, showlegend=False,
                      plot_bgcolor="white")
    fig.update_annotations(font_size=12)
    return fig


# ---------------------------------------------------------------- rates, curves, failures, training


def empty_figure(message: str, height: int = 260) -> go.Figure:
    """A blank figure that says why it is blank (no stage yet, no logs, ...)."""
    return go.Figure(layout=dict(
        height=height, xaxis=dict(visible=False), yaxis=dict(visible=False), plot_bgcolor="white",
        annotations=[dict(text=message, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5,
                          font=dict(size=15, color="#555"))]))


def rates_figure(by_size: Mapping[int, Tally], title: str = "") -> go.Figure:
    """Valid and optimal rate per map size (`lab.results.StageSummary.by_size`)."""
    if not by_size:
        return empty_figure("no evaluation yet")
    sizes = sorted(by_size)
    fig = go.Figure()
    for rate, name, col in (("valid_rate", "valid rate", "#2b8cbe"), ("optimal_rate", "optimal rate", "#31a354")):
        rates = [getattr(by_size[s], rate) for s in sizes]
        fig.add_bar(name=name, x=[f"{s}x{s}" for s in sizes], y=rates, marker_color=col,
                    text=[f"{v:.0%}" for v in rates], textposition="outside", textangle=-90,  # upright, the
                    # labels of two bars side by side ran into each other ("90%90%")
                    customdata=[by_size[s].episodes for s in sizes],
                    hovertemplate="%{x}: %{y:.1%} of %{customdata} episodes<extra>" + name + "</extra>")
    fig.update_layout(title=title, barmode="group", height=320, yaxis=dict(range=[0, 1.2], tickformat=".0%"),
                      margin=dict(l=40, r=10, t=40, b=30), font=_FONT, legend=dict(orientation="h", y=1.12),
                      plot_bgcolor="white")
    return fig


def curves_figure(summaries: Mapping[int, StageSummary]) -> go.Figure:
    """Across stages: the pooled valid and optimal rate (thick; the stage's rate, docs/results.md) and each
    size's valid rate (thin)."""
    stages = sorted(k for k, summary in summaries.items() if summary.by_size)
    if not stages:
        return empty_figure("no evaluated stage yet")
    fig = go.Figure()
    sizes = sorted({size for k in stages for size in summaries[k].by_size})
    for size in sizes:
        xs = [k for k in stages if size in summaries[k].by_size]
        fig.add_scatter(x=xs, y=[summaries[k].by_size[size].valid_rate for k in xs], mode="lines+markers",
                        name=f"valid {size}x{size}", line=dict(width=1), opacity=0.5, legendgroup="sizes")
    for rate, name, col in (("valid_rate", POOLED_VALID, "#2b8cbe"), ("optimal_rate", POOLED_OPTIMAL, "#31a354")):
        ys = [getattr(summaries[k].pooled, rate) for k in stages]
        fig.add_scatter(x=stages, y=ys, mode="lines+markers", name=name, line=dict(width=4, color=col))
    fig.update_layout(height=340, xaxis=dict(title="stage", dtick=1, range=[stages[0] - 0.3, stages[-1] + 0.3]),
                      yaxis=dict(range=[0, 1.02], tickformat=".0%"),
                      margin=dict(l=40, r=10, t=30, b=40), font=_FONT, plot_bgcolor="white")
    return fig


def failure_heatmap(by_size: Mapping[int, Tally]) -> go.Figure:
    """Episodes per (map size, failure type) (`lab.results.StageSummary.by_size`)."""
    if not by_size:
        return empty_figure("no evaluation yet")
    sizes = sorted(by_size)
    kinds = [f for f in FAILURES if any(by_size[s].failures.get(f) for s in sizes)]
    if not kinds:
        return empty_figure("no failures at this stage")
    z = [[by_size[s].failures.get(f, 0) for f in kinds] for s in sizes]
    fig = go.Figure(go.Heatmap(z=z, x=kinds, y=[f"{s}x{s}" for s in sizes], colorscale="Reds",
                               text=[[str(v) if v else "" for v in line] for line in z], texttemplate="%{text}",
                               hovertemplate="%{y}, %{x}: %{z} episodes<extra></extra>", showscale=False))
    fig.update_layout(height=320, margin=dict(l=50, r=10, t=30, b=40), font=_FONT,
                      yaxis=dict(autorange="reversed", title="map size"))
    return fig


# TRL's log keys per GRPO step: reward and loss, KL, and what the answers cost (their mean length in tokens, and
# the share cut off at the run's completion length: a chat model cut inside its reasoning scores 0).
TRAINING_KEYS = (("reward", "reward (mean per answer)", "reward, 0..2.4"), ("loss", "GRPO loss", "loss"),
                 ("kl", "KL to the reference", "KL, nats"),
                 ("completions/clipped_ratio", "truncated answers (at the length cap)", "share, 0..1"),
                 ("completions/mean_length", "mean answer length", "tokens"))
TRAINING_COLUMNS = 2  # the figure is half the page wide: three panels a row ran their titles into each other


def training_figure(logs: Sequence[tuple[int, Mapping[str, Any]]]) -> go.Figure:
    """Reward, loss, KL, the truncated share and the mean answer length per training step; `logs` is
    `(step, metrics)` in step order. A metric the trainer did not log (KL, when GRPO runs without a KL term) gets
    no panel; the figure's title says so."""
    if not logs:
        return empty_figure("no training logs for this stage (stage 0 is evaluated, not trained)")
    panels = [(key, title, unit, [(step, m[key]) for step, m in logs if isinstance(m.get(key), int | float)])
              for key, title, unit in TRAINING_KEYS]
    missing = [title for _, title, _, points in panels if not points]
    panels = [p for p in panels if p[3]]
    if not panels:
        return empty_figure("no reward, loss or KL in this stage's training logs")
    cols = min(len(panels), TRAINING_COLUMNS)
    rows = -(-len(panels) // cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[title for _, title, _, _ in panels],
                        horizontal_spacing=0.1, vertical_spacing=0.25 if rows > 1 else 0.1)
    for n, (key, _, unit, points) in enumerate(panels):
        where = dict(row=n // cols + 1, col=n % cols + 1)
        fig.add_scatter(x=[p[0] for p in points], y=[p[1] for p in points], mode="lines+markers", name=key,
                        marker=dict(size=4), **where)
        fig.update_yaxes(title_text=unit, **where)
    note = f"not logged: {', '.join(missing)}" if missing else None
    fig.update_layout(height=300 * rows, showlegend=False, margin=dict(l=50, r=10, t=70, b=30), font=_FONT,
                      plot_bgcolor="white", title=dict(text=note, x=0.99, xanchor="right", font=dict(size=11)))
    fig.update_xaxes(title_text="step")
    return fig
