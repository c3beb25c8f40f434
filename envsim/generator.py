"""Training instances from an EnvConfig: a pure, seeded function of (config, n, seed).

Per map size `s` the generator draws `count[s]` boards (largest-remainder shares of `n` by
`data_ratio`), each with exactly `round_half_up(hole_ratio[s] * s^2)` holes and every start and goal
in the board's largest ice component, labels each with the exact solver, and keeps exactly
`round_half_up(wait_ratio[s] * count[s])` boards that need a wait (rejection sampling, stratified by the
`needs_wait` label). Each size draws from its own random stream, so changing one size's knobs never
changes another size's boards.

The agent counts follow `agent_ratio` (`cell_counts`): the stage's boards are split over counts by largest
remainder, exactly as over sizes, and dealt out size by size, so each size's mix is as close to the ratio as whole
boards allow. A count goes only to the sizes that hold it (`room`: K agents need 2K ice cells for their starts and
goals, after the holes `hole_ratio` gives): a 3x3 board with 2 holes gets no 4- or 5-agent boards, and where the
sizes that hold a count have too few boards for it, boards move to them from the sizes that do not (`placement`
says what moved). A config whose every board can be dealt as the ratios say is dealt exactly as before this rule.
A size's cells (one per agent count, fewest agents first) draw one after another from the size's
stream, each meeting the size's knobs on its own boards (the wait count is per cell); a config of one count has one
cell a size, whose boards are those it had before the mix existed.

With `random_share` > 0, `round_half_up(random_share * count[s])` of a size's boards are drawn broadly instead
(after the size's own, from a stream of their own): each board's wait ratio uniform over its legal range (it
needs a wait with that chance; a lone agent never does) and each draw's hole ratio uniform over its legal range.
The size's own knobs then hold for the rest, so with `random_share` 0 the boards are exactly those of a config
without it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from envsim.config import KNOBS, EnvConfig
from envsim.instance import Instance
from envsim.solver import NODE_BUDGET, Unsolved, label

# Seed namespaces: no two share a random stream. VALIDATION_EXTRA: the boards a larger validation set adds;
# DEV: the boards the engineers read (`envsim.suite.dev_entries`).
TRAINING, VALIDATION, BENCHMARK, VALIDATION_EXTRA, DEV = 0, 1, 2, 3, 4
BROAD = 1  # appended to a size's training stream: the stream of its boards drawn broadly (`random_share`)
TRIES_PER_INSTANCE = 200
MIN_TRIES = 2000


class GenerationError(ValueError):
    """The config cannot be met; the message names the map size and the knob, and `size` is that map size (None
    where no one size is to blame), so a caller acts on it without reading the message."""

    def __init__(self, message: str, size: int | None = None):
        super().__init__(message)
        self.size = size


@dataclass(frozen=True)
class Unfillable:
    """Why the generator cannot fill a config, as data: the map size it could not fill (None where no one size is
    to blame) and its one-line message (`str()` of it)."""

    size: int | None
    message: str

    def __str__(self) -> str:
        return self.message


def round_half_up(x: float) -> int:
    return math.floor(x + 0.5)


def _largest_remainder(shares: dict[int, float], n: int) -> dict[int, int]:
    """`n` split by `shares` (keys in order): each key its quota's floor, the rest one each to the largest
    remainders (ties: the smaller key first)."""
    quotas = {k: shares[k] * n for k in sorted(shares)}
    counts = {k: math.floor(q) for k, q in quotas.items()}
    rest = n - sum(counts.values())
    for k in sorted(quotas, key=lambda k: (-(quotas[k] - counts[k]), k))[:rest]:
        counts[k] += 1
    return counts


def size_counts(config: EnvConfig, n: int) -> dict[int, int]:
    """Largest-remainder split of `n` instances over sizes by `data_ratio` (ties: smaller size first)."""
    return _largest_remainder(config.data_ratio, n)


def ice_cells(config: EnvConfig, size: int) -> int:
    """The ice cells of one of `size`'s boards: its cells less the `round_half_up(hole_ratio * size^2)` holes."""
    return size * size - round_half_up(config.hole_ratio[size] * size * size)


def room(config: EnvConfig, size: int) -> int:
    """The most agents a board of `size` holds: K agents' starts and goals take 2K ice cells (`ice_cells`)."""
    return ice_cells(config, size) // 2


@dataclass(frozen=True)
class Placement:
    """Where a stage's boards go (`placement`): `cells` is `{size: {agents: boards}}` (`cell_counts`), `moved` the
    boards each size gained (+) or lost (-) against `size_counts` (sizes without a change left out), `narrowed` the
    sizes with boards that hold fewer agents than the stage's most (`{size: room}`)."""

    cells: dict[int, dict[int, int]]
    moved: dict[int, int]
    narrowed: dict[int, int]

    def notes(self, config: EnvConfig) -> list[str]:
        """What the rule that a count goes only to the sizes that hold it did to this config, a line per size
        (none where it did nothing)."""
        lines = []
        for size, held in self.narrowed.items():
            given = [k for k, boards in self.cells[size].items() if boards]
            kept = (f"its boards have {_counts_text(given)} agents" if given else "it gets no boards")
            lines.append(f"size {size}: hole_ratio {config.hole_ratio[size]:g} leaves {ice_cells(config, size)} ice "
                         f"cells, room for {held} agents' starts and goals: {kept}; the boards of more agents go to "
                         f"the sizes that hold them")
        for size, change in self.moved.items():
            lines.append(f"size {size}: {abs(change)} boards more than its data_ratio gives, moved from sizes too "
                         f"small for their agents" if change > 0 else
                         f"size {size}: {-change} boards fewer than its data_ratio gives, moved to sizes that hold "
                         f"their agents")
        return lines


def _counts_text(counts: list[int]) -> str:
    return " or ".join(map(str, counts)) if len(counts) <= 2 else f"{', '.join(map(str, counts[:-1]))} or {counts[-1]}"


def placement(config: EnvConfig, n: int | None = None) -> Placement:
    """Boards per map size and agent count, each count only on sizes that hold it, and what that moved.

    Sizes get `size_counts`; the stage's boards per count are the largest-remainder split of `n` by `agent_ratio`
    (exactly what the ratio says, as sizes are). They are dealt out board by board, size by size, each to the count
    furthest behind its share of the boards dealt so far (ties: fewer agents first) among the counts the size holds
    (`room`) and whose boards the sizes still to come can take, so every size's mix is as close to the ratio as
    whole boards allow and no count gains from rounding size after size. Where the sizes that hold K or more agents
    have fewer boards than the counts of K or more take, the shortfall moves to them (by their `data_ratio`) from
    the sizes that do not (in proportion to their boards), most agents first. GenerationError where no size holds a
    count at all."""
    n = config.num_instances if n is None else n
    totals = {k: c for k, c in _largest_remainder(config.agent_ratio, n).items() if config.agent_ratio[k] > 0}
    sizes = size_counts(config, n)
    rooms = {s: room(config, s) for s in sizes}
    wanted = [k for k in totals if totals[k]]
    counts = dict(sizes)
    for j in sorted(wanted, reverse=True):
        short = sum(totals[k] for k in wanted if k >= j) - sum(c for s, c in counts.items() if rooms[s] >= j)
        if short > 0:
            _move(config, counts, rooms, j, short)
    cells = _deal(config, totals, counts, rooms)
    moved = {s: counts[s] - sizes[s] for s in sizes if counts[s] != sizes[s]}
    most = max(wanted, default=0)
    narrowed = {s: rooms[s] for s in sizes if counts[s] and rooms[s] < most}
    return Placement(cells, moved, narrowed)


def _move(config: EnvConfig, counts: dict[int, int], rooms: dict[int, int], agents: int, short: int) -> None:
    """`short` boards moved into `counts`' sizes that hold `agents` (their `data_ratio` shares, else equal shares
    when none has data) from those that do not (in proportion to their boards)."""
    into = [s for s in counts if rooms[s] >= agents]
    if not into:
        best = max(counts, key=lambda s: (ice_cells(config, s), s))
        raise GenerationError(
            f"size {best}: hole_ratio {config.hole_ratio[best]:g} leaves {ice_cells(config, best)} ice cells, too few "
            f"for {agents} agents' starts and goals ({2 * agents} cells), and no other map size of the config holds "
            f"them", best)
    weights = {s: config.data_ratio[s] for s in into}
    if not sum(weights.values()):
        weights = dict.fromkeys(into, 1.0)
    total = sum(weights.values())
    gained = _largest_remainder({s: w / total for s, w in weights.items()}, short)
    sources = {s: c for s, c in counts.items() if rooms[s] < agents and c}
    held = sum(sources.values())
    lost = _largest_remainder({s: c / held for s, c in sources.items()}, short)
    for s, c in gained.items():
        counts[s] += c
    for s, c in lost.items():
        counts[s] -= c


def _deal(config: EnvConfig, totals: dict[int, int], counts: dict[int, int],
          rooms: dict[int, int]) -> dict[int, dict[int, int]]:
    """The boards of each count (`totals`) dealt over the sizes' boards (`counts`), as `placement` says.

    The counts left to deal must stay placeable on the boards left: for every K, the boards of K or more agents
    still to deal fit on the boards left of sizes that hold K or more (Hall's condition, exact here since a size
    holds every count up to its room). Where every size holds every count this never binds."""
    dealt = dict.fromkeys(totals, 0)
    need = {j: sum(totals[k] for k in totals if k >= j) for j in totals}  # boards of j or more agents to deal
    left = {j: sum(c for s, c in counts.items() if rooms[s] >= j) for j in totals}  # boards left that hold j
    cells: dict[int, dict[int, int]] = {}
    done = 0
    for size, count in counts.items():
        cells[size] = dict.fromkeys(totals, 0)
        for _ in range(count):
            done += 1
            for j in left:
                left[j] -= rooms[size] >= j
            candidates = sorted((k for k in totals if dealt[k] < totals[k] and k <= rooms[size]),
                                key=lambda k: (config.agent_ratio[k] * done - dealt[k], -k), reverse=True)
            k = next(k for k in candidates if all(need[j] - (j <= k) <= left[j] for j in need))
            for j in need:
                need[j] -= j <= k
            dealt[k] += 1
            cells[size][k] += 1
    return cells


def cell_counts(config: EnvConfig, n: int) -> dict[int, dict[int, int]]:
    """Boards per map size and agent count (`{size: {agents: boards}}`, counts with a share only), each count only
    on the sizes that hold it: `placement`'s cells."""
    return placement(config, n).cells


def _components(size: int, holes: set[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    seen: set[tuple[int, int]] = set()
    comps = []
    for r in range(size):
        for c in range(size):
            if (r, c) in holes or (r, c) in seen:
                continue
            comp, stack = [], [(r, c)]
            seen.add((r, c))
            while stack:
                cr, cc = stack.pop()
                comp.append((cr, cc))
                for nr, nc in ((cr - 1, cc), (cr + 1, cc), (cr, cc - 1), (cr, cc + 1)):
                    if 0 <= nr < size and 0 <= nc < size and (nr, nc) not in holes and (nr, nc) not in seen:
                        seen.add((nr, nc))
                        stack.append((nr, nc))
            comps.append(sorted(comp))
    return comps


def random_board(size: int, num_holes: int, num_agents: int, rng: np.random.Generator) -> Instance | None:
    """One unlabelled board, or None when the largest ice component cannot hold 2K starts and goals."""
    cells = [(r, c) for r in range(size) for c in range(size)]
    picks = rng.choice(len(cells), size=num_holes, replace=False) if num_holes else []
    holes = {cells[i] for i in picks}
    comps = _components(size, holes)
    if not comps:
        return None
    comp = max(comps, key=len)  # ties: the first found, in row-major order
    if len(comp) < 2 * num_agents:
        return None
    order = rng.permutation(len(comp))
    starts = [comp[i] for i in order[:num_agents]]
    goal_order = rng.permutation(len(comp))
    goals: list[tuple[int, int]] = []
    for i in goal_order:
        cell = comp[i]
        if cell not in goals and cell != starts[len(goals)]:
            goals.append(cell)
            if len(goals) == num_agents:
                break
    return Instance(size=size, holes=tuple(sorted(holes)), starts=tuple(starts), goals=tuple(goals))


def stratified(draw: Callable[[np.random.Generator], Instance | None], count: int, wait_count: int,
               rng: np.random.Generator, what: str, budget: int = NODE_BUDGET,
               stats: dict | None = None, size: int | None = None,
               seen: set[str] | None = None) -> Iterator[Instance]:
    """Labelled boards from `draw`, exactly `wait_count` of `count` needing a wait.

    Raises GenerationError after a bounded number of draws, saying which stratum ran short (`size`: the map size
    it names, where there is one). `seen`: board ids not to draw again (it gains the ids this call draws).
    `stats["slowest"]`, when given a dict, becomes (seconds, board id) of the slowest board kept.
    """
    want = {True: wait_count, False: count - wait_count}
    tries = max(MIN_TRIES, TRIES_PER_INSTANCE * count)
    seen = set() if seen is None else seen
    empty = unsolved = 0
    for _ in range(tries):
        if want[True] == 0 and want[False] == 0:
            return
        board = draw(rng)
        if board is None:
            empty += 1
            continue
        if board.id in seen:
            continue
        seen.add(board.id)
        t0 = time.perf_counter()
        labelled = label(board, budget)
        seconds = time.perf_counter() - t0
        if isinstance(labelled, Unsolved):
            unsolved += 1
            continue
        if want[labelled.needs_wait] > 0:
            want[labelled.needs_wait] -= 1
            if stats is not None and seconds > stats.get("slowest", (0.0, ""))[0]:
                stats["slowest"] = (seconds, labelled.id)
            yield labelled
    if want[True] or want[False]:
        short = "needing a wait" if want[True] else "solvable without a wait"
        raise GenerationError(
            f"{what}: found only {count - want[True] - want[False]} of {count} boards after {tries} tries "
            f"(still short of {want[True] or want[False]} {short}; {empty} boards too small for the agents, "
            f"{unsolved} unsolvable or over the solver's budget)", size)


def stage_seed(run_seed: int, stage_index: int) -> int:
    """A stage's seed (its training boards and GRPO): a hash of (run seed, stage index), so no two stages or
    runs share a data stream."""
    return int(np.random.SeedSequence([run_seed, stage_index]).generate_state(1)[0])


def cannot_fill(config: EnvConfig, seed: int = 0, n: int | None = None) -> Unfillable | None:
    """Why `generate(config, n, seed)` fails (the size it could not fill and the generator's message), or None when
    it succeeds. As costly as generating: an unfillable config spends every try before it is known."""
    try:
        generate(config, n, seed)
    except GenerationError as err:
        return Unfillable(err.size, str(err))
    return None


def generate(config: EnvConfig, n: int | None = None, seed: int = 0,
             on_board: Callable[[Instance], None] | None = None) -> list[Instance]:
    """`n` (default `config.num_instances`) labelled training instances; the same seed gives the same list.

    `on_board` is called with each board as it is kept (for progress bars).
    """
    out: list[Instance] = []
    for board in boards(config, n, seed):
        out.append(board)
        if on_board is not None:
            on_board(board)
    return out


def boards(config: EnvConfig, n: int | None = None, seed: int = 0) -> Iterator[Instance]:
    """`generate`'s boards one at a time, as they are made: a long set is written as it goes, never held."""
    n = config.num_instances if n is None else n
    for size, per_count in cell_counts(config, n).items():
        if not any(per_count.values()):
            continue
        rng = np.random.default_rng([TRAINING, seed, size])
        broad_rng = np.random.default_rng([TRAINING, seed, size, BROAD])
        seen: set[str] = set()
        for k, total in per_count.items():
            if total:
                yield from _cell(config, size, k, total, rng, broad_rng, seen)


def _cell(config: EnvConfig, size: int, k: int, total: int, rng: np.random.Generator,
          broad_rng: np.random.Generator, seen: set[str]) -> Iterator[Instance]:
    """The `total` boards of `size` with `k` agents: the size's own knobs on them, then those drawn broadly."""
    broad = round_half_up(config.random_share * total)
    count = total - broad
    num_holes = size * size - ice_cells(config, size)
    if count and room(config, size) < k:  # `placement` deals no such cell; kept as the rule's own message
        raise GenerationError(
            f"size {size}: hole_ratio {config.hole_ratio[size]:g} leaves {ice_cells(config, size)} ice cells, "
            f"too few for {k} agents' starts and goals ({2 * k} cells)", size)
    wait_count = round_half_up(config.wait_ratio[size] * count)
    if k == 1 and wait_count:
        raise GenerationError(f"size {size}: wait_ratio {config.wait_ratio[size]:g} asks for boards that need "
                              f"a wait, and a lone agent never needs one (set it to 0 or train 2+ agents)", size)
    what = (f"size {size} (hole_ratio {config.hole_ratio[size]:g}, wait_ratio {config.wait_ratio[size]:g}, "
            f"{k} agents)")

    def draw(r: np.random.Generator) -> Instance | None:
        return random_board(size, num_holes, k, r)

    yield from stratified(draw, count, wait_count, rng, what, size=size, seen=seen)
    if broad:
        yield from broad_boards(size, broad, k, broad_rng, seen)


def broad_boards(size: int, count: int, num_agents: int, rng: np.random.Generator,
                 seen: set[str] | None = None) -> Iterator[Instance]:
    """`count` labelled boards of `size` drawn broadly: each board's wait ratio uniform over its legal range
    (the board needs a wait with that chance; a lone agent never does) and each draw's hole ratio uniform over
    its legal range. The wait labels are drawn first, then the boards (`stratified`), so the counts are exact."""
    (hole_lo, hole_hi), (wait_lo, wait_hi) = KNOBS["hole_ratio"], KNOBS["wait_ratio"]
    chances = rng.uniform(wait_lo, wait_hi, size=count)
    wait_count = 0 if num_agents == 1 else int((rng.random(count) < chances).sum())

    def draw(r: np.random.Generator) -> Instance | None:
        holes = round_half_up(float(r.uniform(hole_lo, hole_hi)) * size * size)
        return random_board(size, holes, num_agents, r)

    what = f"size {size} (random_share: hole and wait ratios drawn at random, {num_agents} agents)"
    yield from stratified(draw, count, wait_count, rng, what, size=size, seen=seen)
