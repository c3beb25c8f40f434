"""Exact labels of an instance by Conflict-Based Search (Sharon et al., 2015).

Three searches share one CBS core and one space-time A*:
- `opt_soc` and a reference plan: CBS on the sum of costs;
- `needs_wait`: the same search with WAIT forbidden before arrival, pruned at `opt_soc` (skipped when the
  reference plan already has no such WAIT);
- `opt_makespan`: CBS ordered by makespan, pruned at the reference plan's makespan (skipped when no
  agent's shortest path is longer than the smallest makespan any agent allows).

Budgets count high-level nodes, never seconds, so labels do not depend on the machine's speed and
the generator stays byte-for-byte deterministic.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from envsim.instance import Instance
from envsim.rules import Cell, action_between, horizon

NODE_BUDGET = 500
CARDINAL_PROBE = 4  # conflicts of a node tried for a cardinal one before splitting

Path = tuple[int, ...]  # cell index at t = 0..arrival
# A constraint forbids agent `agent` to be in `cell` at time `t` (vertex) or to move `prev -> cell`
# arriving at `t` (edge, prev >= 0).
Constraint = tuple[int, int, int, int]  # (agent, prev or -1, cell, t)


@dataclass(frozen=True)
class Solution:
    """The exact labels; `nodes` is the number of high-level nodes all searches expanded."""

    opt_soc: int
    opt_makespan: int
    needs_wait: bool
    plan: tuple[tuple[str, ...], ...]
    nodes: int


@dataclass(frozen=True)
class Unsolved:
    """No labels: `reason` says whether no plan exists or the node budget ran out."""

    reason: str
    nodes: int


class _Grid:
    """Cells as indices `r * size + c`; moves and BFS distances to each agent's goal."""

    def __init__(self, instance: Instance):
        n = self.n = instance.size
        holes = instance.hole_set
        self.horizon = horizon(n)
        self.moves: list[tuple[int, ...]] = []
        for r in range(n):
            for c in range(n):
                nxt = []
                for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1)):
                    rr, cc = r + dr, c + dc
                    if 0 <= rr < n and 0 <= cc < n and (rr, cc) not in holes:
                        nxt.append(rr * n + cc)
                self.moves.append(tuple(nxt))
        self.starts = [r * n + c for r, c in instance.starts]
        self.goals = [r * n + c for r, c in instance.goals]
        self.dist = [self._bfs(g) for g in self.goals]

    def _bfs(self, source: int) -> list[int]:
        inf = 1 << 30
        dist = [inf] * (self.n * self.n)
        dist[source] = 0
        frontier = [source]
        while frontier:
            nxt = []
            for u in frontier:
                for v in self.moves[u]:
                    if dist[v] == inf:
                        dist[v] = dist[u] + 1
                        nxt.append(v)
            frontier = nxt
        return dist

    def cell(self, index: int) -> Cell:
        return divmod(index, self.n)


def _plan_path(grid: _Grid, agent: int, cons: Sequence[Constraint], allow_wait: bool) -> Path | None:
    """Shortest path for one agent under its constraints (space-time A*), or None.

    Past the last constrained time the rest is unconstrained, so the search finishes along the BFS
    gradient at once; this bounds the search to the constrained window.
    """
    dist, goal, moves, limit = grid.dist[agent], grid.goals[agent], grid.moves, grid.horizon
    start = grid.starts[agent]
    inf = 1 << 30
    if dist[start] >= inf:
        return None
    vertex = set()
    edge = set()
    last = 0
    goal_block = -1
    for _, prev, cell, t in cons:
        if prev < 0:
            vertex.add((cell, t))
            if cell == goal and t > goal_block:
                goal_block = t
        else:
            edge.add((prev, cell, t))
        if t > last:
            last = t
    if (start, 0) in vertex:
        return None
    # heap items: (f, -t, cell, t, parent_key); parents map (cell, t) -> previous cell
    parents: dict[tuple[int, int], int] = {(start, 0): -1}
    heap = [(dist[start], 0, start, 0)]
    while heap:
        f, _, u, t = heapq.heappop(heap)
        if t >= last and (u != goal or t > goal_block):
            # unconstrained from here on: walk down the distance gradient
            tail = []
            cur = u
            while cur != goal:
                cur = next(v for v in moves[cur] if dist[v] == dist[cur] - 1)
                tail.append(cur)
            path = [u]
            key = (u, t)
            while parents[key] >= 0:
                prev = parents[key]
                key = (prev, key[1] - 1)
                path.append(prev)
            path.reverse()
            return tuple(path + tail)
        nt = t + 1
        if nt > limit:
            continue
        nexts = moves[u] + (u,) if allow_wait else moves[u]
        for v in nexts:
            dv = dist[v]
            if dv >= inf or (v, nt) in parents or (v, nt) in vertex or (u, v, nt) in edge:
                continue
            if nt + dv > limit:
                continue
            parents[(v, nt)] = u
            heapq.heappush(heap, (nt + dv, -nt, v, nt))
    return None


def _conflicts(paths: Sequence[Path], limit: int) -> tuple[list[tuple], int]:
    """Up to `limit` conflicts in time order (vertex before edge, lower agents first), and the total count."""
    k = len(paths)
    end = max(len(p) for p in paths)
    found: list[tuple] = []
    count = 0
    for t in range(1, end):
        pos = [p[t] if t < len(p) else p[-1] for p in paths]
        prv = [p[t - 1] if t - 1 < len(p) else p[-1] for p in paths]
        for i in range(k):
            for j in range(i + 1, k):
                if pos[i] == pos[j]:
                    count += 1
                    if len(found) < limit:
                        found.append(((i, -1, pos[i], t), (j, -1, pos[i], t)))
                elif pos[i] == prv[j] and pos[j] == prv[i]:
                    count += 1
                    if len(found) < limit:
                        found.append(((i, prv[i], pos[i], t), (j, prv[j], pos[j], t)))
    return found, count


def _cbs(grid: _Grid, allow_wait: bool, by_makespan: bool, bound: int, budget: int) -> tuple[list | None, int, bool]:
    """Best-first CBS. Returns (paths or None, nodes expanded, exhausted).

    Nodes are ordered by (sum of costs, conflicts) or (makespan, sum of costs, conflicts); nodes whose
    primary cost is above `bound` are pruned. `exhausted` is True when the open list ran dry (no plan
    within the bound), False when the budget ran out. A node splits on a cardinal conflict when one of
    its first few has both children costlier (then semi-cardinal, then the earliest), as in ICBS: the
    choice changes how many nodes the search needs, never its answer.
    """
    k = len(grid.starts)
    paths = []
    for a in range(k):
        p = _plan_path(grid, a, (), allow_wait)
        if p is None:
            return None, 0, True
        paths.append(p)

    def key(ps: list[Path], conflicts: int, serial: int) -> tuple:
        soc = sum(len(p) - 1 for p in ps)
        if by_makespan:
            return (max(len(p) - 1 for p in ps), soc, conflicts, serial)
        return (soc, conflicts, serial)

    conflicts, count = _conflicts(paths, CARDINAL_PROBE)
    serial = 0
    open_ = [(key(paths, count, serial), paths, (), conflicts)]
    nodes = 0
    while open_:
        k0, paths, cons, conflicts = heapq.heappop(open_)
        if k0[0] > bound:
            return None, nodes, True
        if not conflicts:
            return paths, nodes, True
        nodes += 1
        if nodes > budget:
            return None, nodes, False
        chosen, best_rank = None, -1
        for pair in conflicts:
            children = []
            rank = 0
            for c in pair:
                agent = c[0]
                new_cons = cons + (c,)
                p = _plan_path(grid, agent, [x for x in new_cons if x[0] == agent], allow_wait)
                children.append((new_cons, agent, p))
                rank += p is None or len(p) > len(paths[agent])
            if rank > best_rank:
                chosen, best_rank = children, rank
            if rank == 2:
                break
        for new_cons, agent, p in chosen:
            if p is None:
                continue
            new_paths = list(paths)
            new_paths[agent] = p
            if key(new_paths, 0, 0)[0] > bound:
                continue
            conf, cnt = _conflicts(new_paths, CARDINAL_PROBE)
            serial += 1
            heapq.heappush(open_, (key(new_paths, cnt, serial), new_paths, new_cons, conf))
    return None, nodes, True


def _waits_before_arrival(paths: Sequence[Path]) -> bool:
    return any(p[t] == p[t - 1] for p in paths for t in range(1, len(p)))


def solve(instance: Instance, budget: int = NODE_BUDGET) -> Solution | Unsolved:
    """Exact `opt_soc`, `opt_makespan`, `needs_wait` and an SoC-optimal reference plan."""
    grid = _Grid(instance)
    limit = 1 << 30
    paths, nodes, exhausted = _cbs(grid, allow_wait=True, by_makespan=False, bound=limit, budget=budget)
    if paths is None:
        if exhausted:
            return Unsolved(f"no plan exists within the horizon of {grid.horizon} steps", nodes)
        return Unsolved(f"unsolved within budget ({budget} nodes, sum-of-costs search)", nodes)
    opt_soc = sum(len(p) - 1 for p in paths)
    total = nodes

    needs_wait = False
    if _waits_before_arrival(paths):
        nw_paths, n2, exhausted = _cbs(grid, allow_wait=False, by_makespan=False, bound=opt_soc, budget=budget)
        total += n2
        if nw_paths is None and not exhausted:
            return Unsolved(f"unsolved within budget ({budget} nodes, no-wait search)", total)
        needs_wait = nw_paths is None

    soc_makespan = max(len(p) - 1 for p in paths)
    lower = max(grid.dist[a][grid.starts[a]] for a in range(len(paths)))
    opt_makespan = soc_makespan
    if lower < soc_makespan:
        ms_paths, n3, exhausted = _cbs(grid, allow_wait=True, by_makespan=True, bound=soc_makespan - 1,
                                       budget=budget)
        total += n3
        if ms_paths is None and not exhausted:
            return Unsolved(f"unsolved within budget ({budget} nodes, makespan search)", total)
        if ms_paths is not None:
            opt_makespan = max(len(p) - 1 for p in ms_paths)

    plan = tuple(
        tuple(action_between(grid.cell(p[t - 1]), grid.cell(p[t])) for t in range(1, len(p))) for p in paths
    )
    return Solution(opt_soc, opt_makespan, needs_wait, plan, total)


def label(instance: Instance, budget: int = NODE_BUDGET) -> Instance | Unsolved:
    """The instance with its exact labels, or why it has none."""
    result = solve(instance, budget)
    if isinstance(result, Unsolved):
        return result
    return instance.with_labels(opt_soc=result.opt_soc, opt_makespan=result.opt_makespan,
                                needs_wait=result.needs_wait, reference_plan=result.plan)
