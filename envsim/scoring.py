"""Scoring: play a joint plan under docs/rules.md and say how the episode went.

Two paths share one set of rules. `score` steps one episode and records every event, which is what a
replay and the database need. `score_batch` plays many episodes at once on numpy arrays for rewards and
evaluation. Those need only the episode's first failure, and until then every agent is on the board and no
two share a cell, so the batch path finds conflicts by writing each agent's index into a grid of cells and a
grid of edges and reading it back, instead of comparing every pair of agents. A property test holds the
batch path to `score`, field by field.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter, itemgetter
from typing import Any

import numpy as np

from envsim.instance import Instance
from envsim.parser import Parsed, Plan
from envsim.rules import ACTION_CODE, ACTIONS, DELTAS, FAILURE_ORDER, WAIT, Cell, Failure, horizon


@dataclass(frozen=True)
class Event:
    """One rule broken at one time; `cell` is where (the off-grid target, the hole, the shared cell, or
    for an edge conflict the cell the lower-indexed agent moves into); None for plan-level failures."""

    type: Failure
    time: int
    agents: tuple[int, ...]
    cell: Cell | None = None

    def sort_key(self) -> tuple[int, int, tuple[int, ...]]:
        return self.time, FAILURE_ORDER[self.type], self.agents

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type.value, "time": self.time, "agents": list(self.agents),
                "cell": None if self.cell is None else list(self.cell)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Event:
        cell = None if d["cell"] is None else tuple(d["cell"])
        return cls(Failure(d["type"]), d["time"], tuple(d["agents"]), cell)


@dataclass(frozen=True)
class Outcome:
    """Everything about one episode: the verdict, every event (for the replay) and the scores."""

    valid: bool
    optimal: bool
    soc_optimal: bool
    failure: Failure | None
    failure_time: int | None
    failure_agents: tuple[int, ...]
    events: tuple[Event, ...]
    arrivals: tuple[int | None, ...]
    makespan: int | None
    soc: int | None
    isr: float
    positions: tuple[tuple[Cell, ...], ...]  # positions[t][i], t = 0..T
    message: str

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types only, so `from_dict(json.loads(json.dumps(o.to_dict()))) == o`."""
        return {
            "valid": self.valid, "optimal": self.optimal, "soc_optimal": self.soc_optimal,
            "failure": None if self.failure is None else self.failure.value,
            "failure_time": self.failure_time, "failure_agents": list(self.failure_agents),
            "events": [e.to_dict() for e in self.events], "arrivals": list(self.arrivals),
            "makespan": self.makespan, "soc": self.soc, "isr": self.isr,
            "positions": [[list(cell) for cell in row] for row in self.positions], "message": self.message,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Outcome:
        return cls(
            valid=d["valid"], optimal=d["optimal"], soc_optimal=d["soc_optimal"],
            failure=None if d["failure"] is None else Failure(d["failure"]), failure_time=d["failure_time"],
            failure_agents=tuple(d["failure_agents"]), events=tuple(Event.from_dict(e) for e in d["events"]),
            arrivals=tuple(d["arrivals"]), makespan=d["makespan"], soc=d["soc"], isr=d["isr"],
            positions=tuple(tuple(tuple(cell) for cell in row) for row in d["positions"]),
            message=d["message"],
        )


@dataclass(frozen=True)
class Tally:
    """Counts over scored episodes: how many, how many valid, how many optimal, and failures per type.

    The rates are defined here and nowhere else (docs/results.md): `valid_rate` = valid episodes / episodes,
    `optimal_rate` = optimal episodes / episodes, 0 for no episodes. A stage's rate at one map size is its
    tally at that size; its pooled rate is the tally of all its episodes, `Tally.total(per_size.values())`.
    """

    episodes: int = 0
    valid: int = 0
    optimal: int = 0
    failures: dict[str, int] = field(default_factory=dict)  # failure type -> episodes; types with none left out

    @property
    def valid_rate(self) -> float:
        return self.valid / self.episodes if self.episodes else 0.0

    @property
    def optimal_rate(self) -> float:
        return self.optimal / self.episodes if self.episodes else 0.0

    @classmethod
    def of(cls, outcomes: Iterable[Outcome]) -> Tally:
        outcomes = list(outcomes)
        failures = Counter(o.failure.value for o in outcomes if o.failure is not None)
        return cls(len(outcomes), sum(o.valid for o in outcomes), sum(o.optimal for o in outcomes),
                   dict(sorted(failures.items())))

    @classmethod
    def total(cls, tallies: Iterable[Tally]) -> Tally:
        """One tally of all the episodes that `tallies` count (the pooled counts of a stage's sizes)."""
        tallies = list(tallies)
        failures: Counter[str] = Counter()
        for t in tallies:
            failures.update(t.failures)  # in place: a sum of Counters copies one per tally
        return cls(sum(t.episodes for t in tallies), sum(t.valid for t in tallies), sum(t.optimal for t in tallies),
                   dict(sorted((k, n) for k, n in failures.items() if n > 0)))


# ---------------------------------------------------------------- one episode, every event


def score(instance: Instance, plan: Plan | Parsed) -> Outcome:
    """Play `plan` on `instance` step by step and record every event (docs/rules.md)."""
    if isinstance(plan, Parsed):
        if plan.plan is None:
            return _unread(instance, plan.failure or Failure.PARSE_ERROR, plan.message)
        plan = plan.plan
    problem = _plan_problem(instance, plan)
    if problem is not None:
        return _unread(instance, *problem)

    positions, events = _play(instance, plan)
    final = positions[-1]
    on_goal = [cell == goal for cell, goal in zip(final, instance.goals, strict=True)]
    if not events and not all(on_goal):
        events = [Event(Failure.GOAL_NOT_REACHED, len(positions) - 1, (i,), final[i])
                  for i, on in enumerate(on_goal) if not on]
    arrivals = tuple(_arrival(positions, i, goal) if on else None
                     for i, (goal, on) in enumerate(zip(instance.goals, on_goal, strict=True)))
    makespan = max(arrivals) if all(on_goal) else None
    soc = sum(arrivals) if all(on_goal) else None
    valid = not events
    first = events[0] if events else None
    return Outcome(
        valid=valid,
        optimal=valid and makespan == instance.opt_makespan,
        soc_optimal=valid and soc == instance.opt_soc,
        failure=first.type if first else None, failure_time=first.time if first else None,
        failure_agents=first.agents if first else (),
        events=tuple(events), arrivals=arrivals, makespan=makespan, soc=soc,
        isr=sum(on_goal) / len(on_goal), positions=tuple(positions),
        message=_summary(instance, plan, events, makespan, soc),
    )


def score_answer(instance: Instance, text: str) -> Outcome:
    """Read a free-form answer with the project's parser, then score it."""
    from envsim.parser import parse

    return score(instance, parse(text, instance.num_agents))


def _plan_problem(instance: Instance, plan: Plan) -> tuple[Failure, str] | None:
    """A plan handed in directly (not through the parser) gets the parser's two checks."""
    for i, actions in enumerate(plan):
        for n, word in enumerate(actions):
            if word not in ACTION_CODE:
                return Failure.PARSE_ERROR, (f"parse_error: agent {i}'s action {n} is {word!r}, "
                                             f"not one of {', '.join(ACTIONS)}")
    if len(plan) != instance.num_agents:
        return Failure.WRONG_AGENT_COUNT, (f"wrong_agent_count: {len(plan)} action lists "
                                           f"for {instance.num_agents} agents")
    return None


def _unread(instance: Instance, failure: Failure, message: str) -> Outcome:
    """An answer that is not a plan: one event at time 0, nobody moves."""
    k = instance.num_agents
    return Outcome(valid=False, optimal=False, soc_optimal=False, failure=failure, failure_time=0,
                   failure_agents=(), events=(Event(failure, 0, ()),), arrivals=(None,) * k, makespan=None,
                   soc=None, isr=0.0, positions=(instance.starts,), message=message)


def _play(instance: Instance, plan: Plan) -> tuple[list[tuple[Cell, ...]], list[Event]]:
    """Every position from t = 0 to T and every event before the end, sorted."""
    n, holes, k = instance.size, instance.hole_set, instance.num_agents
    events = [Event(Failure.TOO_LONG, 0, (i,)) for i, actions in enumerate(plan) if len(actions) > horizon(n)]
    pos = list(instance.starts)
    fallen = [False] * k
    positions = [tuple(pos)]
    for t in range(1, max(map(len, plan), default=0) + 1):
        before = positions[-1]
        for i, actions in enumerate(plan):
            if fallen[i] or t > len(actions):
                continue
            dr, dc = DELTAS[ACTION_CODE[actions[t - 1]]]
            cell = (pos[i][0] + dr, pos[i][1] + dc)
            if not (0 <= cell[0] < n and 0 <= cell[1] < n):
                events.append(Event(Failure.ILLEGAL_MOVE, t, (i,), cell))  # the edge stops it
                continue
            pos[i] = cell
            if cell in holes:
                fallen[i] = True  # out of the episode from this step on: in no conflict
                events.append(Event(Failure.HOLE, t, (i,), cell))
        on_board = [i for i in range(k) if not fallen[i]]
        for a, i in enumerate(on_board):
            for j in on_board[a + 1:]:
                if pos[i] == pos[j]:
                    events.append(Event(Failure.VERTEX_CONFLICT, t, (i, j), pos[i]))
                elif pos[i] == before[j] and pos[j] == before[i]:
                    events.append(Event(Failure.EDGE_CONFLICT, t, (i, j), pos[i]))
        positions.append(tuple(pos))
    events.sort(key=Event.sort_key)
    return positions, events


def _arrival(positions: list[tuple[Cell, ...]], i: int, goal: Cell) -> int:
    """The first time from which agent `i` stays on `goal` to the end (it ends there)."""
    t = len(positions) - 1
    while t > 0 and positions[t - 1][i] == goal:
        t -= 1
    return t


def _cell(cell: Cell) -> str:
    return f"({cell[0]},{cell[1]})"


def _summary(instance: Instance, plan: Plan, events: list[Event], makespan: int | None,
             soc: int | None) -> str:
    """One line for a person: the first event (and how many follow), or the scores of a valid plan."""
    if not events:
        line = f"valid: makespan {makespan}, soc {soc}"
        if instance.labelled:
            line += f" (optimal makespan {instance.opt_makespan}, optimal soc {instance.opt_soc})"
        return line
    e = events[0]
    i = e.agents[0]
    if e.type is Failure.TOO_LONG:
        what = f"agent {i}'s list has {len(plan[i])} actions, over the horizon of {horizon(instance.size)}"
    elif e.type is Failure.ILLEGAL_MOVE:
        what = f"agent {i} moves off the grid to {_cell(e.cell)}"
    elif e.type is Failure.HOLE:
        what = f"agent {i} falls into the hole at {_cell(e.cell)}"
    elif e.type is Failure.VERTEX_CONFLICT:
        what = f"agents {i} and {e.agents[1]} at {_cell(e.cell)}"
    elif e.type is Failure.EDGE_CONFLICT:
        what = f"agents {i} and {e.agents[1]} swap cells, agent {i} moving into {_cell(e.cell)}"
    else:
        what = f"agent {i} ends at {_cell(e.cell)}, not its goal {_cell(instance.goals[i])}"
    more = f" (+{len(events) - 1} more events)" if len(events) > 1 else ""
    return f"{e.type.value}: {what}, t={e.time}{more}"


# ---------------------------------------------------------------- many episodes, first failure only

_CODE = {f: np.int8(i) for f, i in FAILURE_ORDER.items()}
_UNKNOWN = len(ACTIONS)  # the code of a word that is not an action


class _Codes(dict):
    """Action word -> code, anything else -> `_UNKNOWN`, so one C-level `map` encodes a whole batch."""

    def __missing__(self, key: object) -> int:
        return _UNKNOWN


_WORD_CODES = _Codes(ACTION_CODE)


@dataclass(frozen=True)
class BatchScores:
    """Per-episode scores as numpy arrays, in the order the episodes were given.

    `failure` is the index of the failure in `Failure` (-1: none); `failure_time`, `makespan` and `soc` are -1
    where undefined. `agent_steps` counts the agent-steps the rules play (the sum of K * T).
    """

    valid: np.ndarray
    optimal: np.ndarray
    soc_optimal: np.ndarray
    failure: np.ndarray
    failure_time: np.ndarray
    makespan: np.ndarray
    soc: np.ndarray
    isr: np.ndarray
    agent_steps: int


def score_batch(instances: Sequence[Instance], plans: Sequence[Plan]) -> BatchScores:
    """Score every (instance, plan) pair at once; agrees with `score` on every field it has.

    Plans are not padded: all lists go into one stream of action codes, each list followed by a WAIT that
    its agent reads once the list has ended, so one very long list costs its own length and no more.
    Episodes are grouped by agent count and sorted longest first, so step t of a group plays one prefix of
    its arrays. Arrays are agent-major ([K, episodes]): a reduction over agents is then a fast one.
    """
    b = len(instances)
    if len(plans) != b:
        raise ValueError(f"{b} instances but {len(plans)} plans")
    rows = list(map(_FIELDS, instances))  # one pass over the objects is cheaper than one per field
    size_of, starts, goals, holes, opt_makespan, opt_soc = (list(map(itemgetter(f), rows)) for f in range(6))
    sizes = np.fromiter(size_of, np.intp, b)
    k_of = np.fromiter(map(len, starts), np.intp, b)
    slot0 = np.concatenate([[0], np.cumsum(k_of)])  # episode e's agents are slots slot0[e] .. slot0[e+1]-1
    slot_episode = np.repeat(np.arange(b), k_of)

    stream, lengths, stop, first_list, unknown = _stream(plans)
    miscounted = np.fromiter(map(len, plans), np.intp, b) != k_of
    readable = ~unknown & ~miscounted

    # Agent slot -> its list; a plan that is not read gets an empty list per agent (nothing is played).
    agent_of_slot = np.arange(slot0[-1]) - slot0[slot_episode]
    slot_list = np.where(readable[slot_episode], first_list[slot_episode] + agent_of_slot, len(lengths))
    slot_len = np.append(lengths, 0)[slot_list]
    slot_stop = np.append(stop, 0)[slot_list]
    steps = _per_episode_max(slot_len, slot0)

    failure = np.full(b, -1, np.int8)
    failure[miscounted] = _CODE[Failure.WRONG_AGENT_COUNT]
    failure[unknown] = _CODE[Failure.PARSE_ERROR]
    too_long = _per_episode_max(slot_len - horizon(sizes[slot_episode]), slot0) > 0
    failure[readable & too_long] = _CODE[Failure.TOO_LONG]
    failure_time = np.where(failure >= 0, 0, -1)

    # Episodes in playing order: by agent count, longest first within one.
    order = np.lexsort((-steps, k_of))
    grids, start_at, goal_at = _laid_out(order, sizes, holes, starts, goals, slot_episode, stream)

    makespan = np.full(b, -1, np.intp)
    soc = np.full(b, -1, np.intp)
    isr = np.zeros(b)
    bounds = np.flatnonzero(np.diff(k_of[order], prepend=-1, append=-1))
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        ep = order[lo:hi]
        k = int(k_of[ep[0]])
        slots = slot0[ep] + np.arange(k)[:, None]  # [K, episodes]
        fail, when = failure[ep], failure_time[ep]
        on_goal, arrival = grids.play(start_at[slots], goal_at[slots], slot_stop[slots] - slot_len[slots],
                                      slot_stop[slots], steps[ep], fail, when)
        home = on_goal.all(0)
        short = (fail < 0) & ~home
        fail[short], when[short] = _CODE[Failure.GOAL_NOT_REACHED], steps[ep][short]
        failure[ep], failure_time[ep] = fail, when
        makespan[ep] = np.where(home, arrival.max(0), -1)
        soc[ep] = np.where(home, arrival.sum(0), -1)
        isr[ep] = on_goal.sum(0) / k

    valid = failure < 0
    return BatchScores(valid=valid, optimal=valid & (makespan == np.array(opt_makespan, float)),  # None: nan
                       soc_optimal=valid & (soc == np.array(opt_soc, float)), failure=failure,
                       failure_time=failure_time, makespan=makespan, soc=soc, isr=isr,
                       agent_steps=int((k_of * steps).sum()))


def _stream(plans: Sequence[Plan]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every plan's lists as one stream of action codes, read in one C-level pass over the words, each list
    followed by a WAIT; then each list's length, the stream index of its closing WAIT, each plan's first list, and
    which plans hold a word that is not an action."""
    n_lists = np.fromiter(map(len, plans), np.intp, len(plans))
    lists = list(chain.from_iterable(plans))
    lengths = np.fromiter(map(len, lists), np.intp, len(lists))
    codes = np.frombuffer(bytes(map(_WORD_CODES.__getitem__, chain.from_iterable(lists))), np.int8)
    list_end = np.cumsum(lengths)
    lists_before = np.cumsum(n_lists)
    odd_lists = np.searchsorted(list_end, np.flatnonzero(codes == _UNKNOWN), side="right")
    unknown = np.zeros(len(plans), bool)
    unknown[np.searchsorted(lists_before, odd_lists, side="right")] = True
    stream = np.insert(codes, list_end, WAIT)
    return stream, lengths, list_end + np.arange(len(lists)), lists_before - n_lists, unknown


def _laid_out(order: np.ndarray, sizes: np.ndarray, holes: list, starts: list, goals: list,
              slot_episode: np.ndarray, stream: np.ndarray) -> tuple[_Grids, np.ndarray, np.ndarray]:
    """The grids the episodes play on, and each agent slot's start and goal in them.

    Every board padded with a one-cell border to one width and laid out flat, one area per episode: a position is
    an index into it, a move one addition, and a move off the grid lands on a cell marked _OFF. Areas go in playing
    order (`order`), so the episodes a step plays share one stretch of memory."""
    b = len(order)
    rank = np.empty(b, np.intp)
    rank[order] = np.arange(b)
    width = int(sizes.max(initial=0)) + 2
    area = width * width
    board = _boards(sizes[order], width)
    hole_episode = np.repeat(np.arange(b), np.fromiter(map(len, holes), np.intp, b))
    board[rank[hole_episode] * area + _flat(_cells(holes), width)] = _HOLE
    start_at = rank[slot_episode] * area + _flat(_cells(starts), width)
    goal_at = rank[slot_episode] * area + _flat(_cells(goals), width)
    offsets = [dr * width + dc for dr, dc in DELTAS] + [0]  # by code; unknown words are never played
    # Crossing an edge from cell `now` writes key 2 * now + cross_of[code], which is 2 * (the lower cell), + 1
    # for a vertical move: two agents write the same key only if they swap across one edge or share a cell
    # (at t or t-1), and a shared cell is a vertex conflict, which comes first in the failure order.
    cross_of = [2 * min(d, 0) + (abs(d) > 1) for d in offsets]
    grids = _Grids(board, np.zeros(b * area, np.int8), np.zeros(2 * b * area, np.int8),
                   np.array(offsets, np.int8)[stream], np.array(cross_of, np.int8)[stream])
    return grids, start_at, goal_at


_FIELDS = attrgetter("size", "starts", "goals", "holes", "opt_makespan", "opt_soc")
_ICE, _HOLE, _OFF = 0, 1, 2  # kinds of board cells; _OFF is the border and beyond a smaller board's edge


def _per_episode_max(values: np.ndarray, slot0: np.ndarray) -> np.ndarray:
    """The largest value over each episode's agent slots (every episode has at least one agent)."""
    return np.maximum.reduceat(values, slot0[:-1]) if len(values) else np.zeros(0, np.intp)


def _cells(cells: list[tuple[Cell, ...]]) -> np.ndarray:
    """Each episode's cells, flattened to an [N, 2] array of (row, col)."""
    return np.fromiter(chain.from_iterable(chain.from_iterable(cells)), np.intp).reshape(-1, 2)


def _flat(rc: np.ndarray, width: int) -> np.ndarray:
    """(row, col) -> index within an episode's bordered board."""
    return (rc[:, 0] + 1) * width + rc[:, 1] + 1


def _boards(sizes: np.ndarray, width: int) -> np.ndarray:
    """Each episode's board as `_ICE` inside its own size and `_OFF` around it, laid out flat."""
    kinds, which = np.unique(sizes, return_inverse=True)
    line = np.arange(width)
    inside = (line >= 1) & (line <= kinds[:, None])
    template = np.where(inside[:, :, None] & inside[:, None, :], _ICE, _OFF).astype(np.int8)
    return template.reshape(len(kinds), width * width)[which].reshape(-1)


@dataclass(frozen=True)
class _Grids:
    """The flat boards, the two grids agents write into, and per stream entry its move and crossing offset."""

    board: np.ndarray
    occupant: np.ndarray  # per cell: the last agent written there this step
    crossing: np.ndarray  # per edge key: the last agent written there this step
    moves: np.ndarray
    crossings: np.ndarray

    def play(self, pos: np.ndarray, goal: np.ndarray, read_from: np.ndarray, read_stop: np.ndarray,
             steps: np.ndarray, failure: np.ndarray, failure_time: np.ndarray,
             ) -> tuple[np.ndarray, np.ndarray]:
        """Play one group of episodes with K agents each, sorted by `steps`, longest first ([K, n] arrays).

        Updates `failure` and `failure_time` in place with each episode's first event before the end and
        returns (on_goal, arrival) per agent. Each step every agent writes its index into the cell it enters
        and into the key of the edge it crosses, and reads them back: a different index means a shared cell
        or a swap. That is exact while an episode has no failure yet (everyone on the board, no two agents
        in one cell), which is all the first failure needs; so after a fall the agent is not held in its
        hole here, only kept off its goal.
        """
        k, n = pos.shape
        agent = np.arange(k, dtype=np.int8)[:, None]
        fell = np.zeros((k, n), bool)
        last_off = np.zeros((k, n), np.intp)  # the last time each agent was off its goal
        active = np.searchsorted(-steps, -np.arange(int(steps.max(initial=0)) + 1), side="right")
        for t in range(1, len(active)):
            m = active[t]  # episodes still playing at step t
            now = pos[:, :m]
            at = np.minimum(read_from[:, :m] + (t - 1), read_stop[:, :m])
            target = now + self.moves[at]
            kind = self.board[target]
            off = kind == _OFF
            np.copyto(target, now, where=off)  # the grid's edge stops the agent
            hole = kind == _HOLE
            fell[:, :m] |= hole
            self.occupant[target] = agent
            shared = self.occupant[target] != agent
            key = 2 * now + self.crossings[at]
            self.crossing[key] = agent
            swap = self.crossing[key] != agent
            event = np.where(swap.any(0), _CODE[Failure.EDGE_CONFLICT], -1)
            event = np.where(shared.any(0), _CODE[Failure.VERTEX_CONFLICT], event)
            event = np.where(hole.any(0), _CODE[Failure.HOLE], event)
            event = np.where(off.any(0), _CODE[Failure.ILLEGAL_MOVE], event)
            first = (failure[:m] < 0) & (event >= 0)
            np.copyto(failure[:m], event, where=first)
            np.copyto(failure_time[:m], t, where=first)
            np.copyto(last_off[:, :m], t, where=target != goal[:, :m])
            now[...] = target
        return (pos == goal) & ~fell, last_off + 1
