"""The words of MAPF-FrozenLake: actions, failure types and limits (docs/rules.md is the contract)."""

from __future__ import annotations

from enum import StrEnum

Cell = tuple[int, int]

MIN_SIZE, MAX_SIZE = 2, 32
MIN_AGENTS, MAX_AGENTS = 1, 8

# Action words in their canonical order; the index of a word is its code in numpy arrays.
ACTIONS: tuple[str, ...] = ("UP", "DOWN", "LEFT", "RIGHT", "WAIT")
DELTAS: tuple[Cell, ...] = ((-1, 0), (1, 0), (0, -1), (0, 1), (0, 0))
SHORT: dict[str, str] = {"U": "UP", "D": "DOWN", "L": "LEFT", "R": "RIGHT", "W": "WAIT"}
ACTION_CODE: dict[str, int] = {a: i for i, a in enumerate(ACTIONS)}
WAIT = ACTION_CODE["WAIT"]


class Failure(StrEnum):
    """Failure types, in the order that breaks ties at one timestep."""

    PARSE_ERROR = "parse_error"
    WRONG_AGENT_COUNT = "wrong_agent_count"
    TOO_LONG = "too_long"
    ILLEGAL_MOVE = "illegal_move"
    HOLE = "hole"
    VERTEX_CONFLICT = "vertex_conflict"
    EDGE_CONFLICT = "edge_conflict"
    GOAL_NOT_REACHED = "goal_not_reached"


FAILURE_ORDER: dict[Failure, int] = {f: i for i, f in enumerate(Failure)}


def horizon(size: int) -> int:
    """The longest legal action list on a `size x size` board."""
    return 4 * size * size


def action_between(a: Cell, b: Cell) -> str:
    """The action word that moves an agent from cell `a` to the neighbouring (or same) cell `b`."""
    return ACTIONS[DELTAS.index((b[0] - a[0], b[1] - a[1]))]
