"""The solver's labels against scripted boards and against brute-force joint search on tiny boards."""

import heapq
import itertools
from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from envsim.instance import Instance
from envsim.solver import Solution, Unsolved, solve
from tests.boards import CORRIDOR_DEADLOCK, CROSSING, CUT_OFF, OPEN


def _neighbours(inst: Instance, cell, allow_wait: bool):
    out = [cell] if allow_wait else []
    for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1)):
        r, c = cell[0] + dr, cell[1] + dc
        if 0 <= r < inst.size and 0 <= c < inst.size and (r, c) not in inst.hole_set:
            out.append((r, c))
    return out


def _joint_moves(inst: Instance, pos, options):
    k = len(pos)
    for nxt in itertools.product(*options):
        if len(set(nxt)) < k:
            continue
        if any(nxt[i] == pos[j] and nxt[j] == pos[i] for i in range(k) for j in range(i + 1, k)):
            continue
        yield nxt


def brute_soc(inst: Instance, allow_wait: bool = True) -> int | None:
    """Least sum of costs by Dijkstra over (positions, which agents have committed to stay on their goal)."""
    k, goals = inst.num_agents, inst.goals
    start = (tuple(inst.starts), (False,) * k)
    best = {start: 0}
    heap = [(0, start)]
    while heap:
        d, (pos, done) = heapq.heappop(heap)
        if best[(pos, done)] != d:
            continue
        if all(done):
            return d
        succ = [((pos, done[:i] + (True,) + done[i + 1:]), d) for i in range(k) if not done[i] and pos[i] == goals[i]]
        options = [[pos[i]] if done[i] else _neighbours(inst, pos[i], allow_wait) for i in range(k)]
        step = done.count(False)
        succ += [((nxt, done), d + step) for nxt in _joint_moves(inst, pos, options)]
        for state, nd in succ:
            if nd < best.get(state, 1 << 30):
                best[state] = nd
                heapq.heappush(heap, (nd, state))
    return None


def brute_makespan(inst: Instance) -> int | None:
    """Least makespan by breadth-first search over joint positions."""
    start, goal = tuple(inst.starts), tuple(inst.goals)
    seen = {start: 0}
    queue = deque([start])
    while queue:
        pos = queue.popleft()
        if pos == goal:
            return seen[pos]
        for nxt in _joint_moves(inst, pos, [_neighbours(inst, p, True) for p in pos]):
            if nxt not in seen:
                seen[nxt] = seen[pos] + 1
                queue.append(nxt)
    return None


def test_scripted_labels():
    open_ = solve(OPEN)
    assert (open_.opt_soc, open_.opt_makespan, open_.needs_wait) == (8, 4, False)
    assert open_.plan == (("RIGHT", "DOWN", "DOWN", "RIGHT"), ("UP", "UP", "RIGHT", "RIGHT"))
    crossing = solve(CROSSING)
    assert (crossing.opt_soc, crossing.opt_makespan, crossing.needs_wait) == (5, 3, True)
    assert crossing.plan == (("WAIT", "DOWN", "DOWN"), ("RIGHT", "RIGHT"))


def test_unsolvable_and_over_budget_are_clear_results_not_hangs():
    cut = solve(CUT_OFF)
    assert isinstance(cut, Unsolved) and cut.reason == "no plan exists within the horizon of 36 steps"
    stuck = solve(CORRIDOR_DEADLOCK, budget=50)
    assert isinstance(stuck, Unsolved)
    assert stuck.reason == "unsolved within budget (50 nodes, sum-of-costs search)"
    assert stuck.nodes == 51


def test_same_instance_same_labels():
    assert solve(CROSSING) == solve(CROSSING)


@st.composite
def tiny_boards(draw) -> Instance:
    size = draw(st.integers(2, 4))
    cells = [(r, c) for r in range(size) for c in range(size)]
    k = draw(st.integers(1, min(3, len(cells) // 2)))
    picked = draw(st.lists(st.sampled_from(cells), min_size=2 * k, max_size=2 * k, unique=True))
    free = [c for c in cells if c not in picked]
    holes = draw(st.lists(st.sampled_from(free), unique=True, max_size=len(free))) if free else []
    return Instance(size=size, holes=tuple(sorted(holes)), starts=tuple(picked[:k]), goals=tuple(picked[k:]))


@settings(max_examples=150, deadline=None)
@given(tiny_boards())
def test_labels_equal_brute_force(inst):
    result = solve(inst, budget=2000)
    soc = brute_soc(inst)
    if isinstance(result, Unsolved):
        assert soc is None or "budget" in result.reason
        return
    assert isinstance(result, Solution)
    assert result.opt_soc == soc
    assert result.opt_makespan == brute_makespan(inst)
    no_wait = brute_soc(inst, allow_wait=False)
    assert result.needs_wait == (no_wait is None or no_wait > soc)
    assert sum(len(p) for p in result.plan) == soc
