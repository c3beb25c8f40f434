"""The paper's benchmark suite, the validation and dev sets, and the tables scored episodes make.

Benchmark: agents 3, 4, 5; sizes max(3, K)..10; wait subsets 0.25 / 0.50 / 0.75; 50 boards per
(agents, size, subset) cell: 3,150 boards fixed by one seed. Each board's hole ratio is drawn
uniformly from 0 to 0.5 and lowered one hole at a time only while the largest ice component cannot
hold the agents' starts and goals. Validation: the same construction on the benchmark's agent counts (3, 4, 5:
`VALIDATION_AGENTS`, unless a run names others in `validation_agents`) and sizes max(3, K)..10, 10 boards per
(count, size, subset) cell (630 in all), each count's cells drawn from a stream of their own in a separate seed
namespace, so no board is shared. The first validation set had 2 agents on sizes 3..10 (240 boards,
`FIRST_AGENTS`): a run stored before the default changed names it, and its boards are the same as they were; the
2-agent cells are the same boards whatever other counts sit beside them.

A larger validation set (`validation_cells(per_size)`, e.g. 120 boards per (count, size)) keeps the standard
boards first in each cell and adds the rest from a namespace of its own (`VALIDATION_EXTRA`), with the same
construction and each whole cell's wait subset met exactly: a stage evaluated on it can be compared with one
evaluated on the standard set on their common boards.

Dev: boards drawn like the validation boards (the same counts and sizes, each cell's wait subset met exactly) from
a namespace of their own (`DEV`), skipping every board of the validation set they are drawn beside, so no board is
in both. A run's engineers read how its policy does on these (`dev_entries`), while its score stays the validation
rate. A run drawn per seed (`draw`, its run seed) reads a dev set of its own: the seed joins each cell's stream, so
two seeds' engineers read different boards, while every seed is scored on the same validation set; without `draw`,
the one dev set every run read before runs drew theirs per seed.
"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict

from envsim.generator import (
    BENCHMARK,
    DEV,
    VALIDATION,
    VALIDATION_EXTRA,
    random_board,
    round_half_up,
    stratified,
)
from envsim.instance import Instance

SUITE_SEED = 2606
WAIT_SUBSETS = (0.25, 0.50, 0.75)
MAX_SIZE = 10
VALIDATION_PER_SIZE = 30  # the standard validation set: 10 boards per (size, wait subset), 240 in all
# A run's dev boards per size (the engineers read these): 240 in all, as many as the standard validation set, so a
# stage's evaluation costs at most twice the standard one's and a quarter more than an experiment's 960-board one,
# while each size still shows its engineer 30 boards (10 per wait subset) to read failures from.
DEV_PER_SIZE = 30
VALIDATION_AGENTS = (3, 4, 5)  # the validation and dev sets' agent counts unless a run names others: the paper's
# The counts of the first validation and dev sets (2 agents): what a run stored without `validation_agents` was scored
# on, and the sets whose cached files keep their first names (`training.evaluate.set_file`).
FIRST_AGENTS = (2,)

class Split(StrEnum):
    """The instance sets: the 3,150-board benchmark, the validation set (the score) and the dev set (what the
    engineers read)."""

    BENCHMARK = "benchmark"
    VALIDATION = "validation"
    DEV = "dev"


class Entry(BaseModel):
    """One suite board with where it belongs: its split and wait subset (agents and size are the board's)."""

    model_config = ConfigDict(frozen=True)

    split: Split
    subset: float
    instance: Instance

    @property
    def agents(self) -> int:
        return self.instance.num_agents

    @property
    def size(self) -> int:
        return self.instance.size


@dataclass(frozen=True)
class SuiteCell:
    split: Split
    agents: int
    size: int
    subset: float
    count: int
    extra: bool = False  # boards a larger validation set adds to the standard cell (namespace VALIDATION_EXTRA)
    draw: int | None = None  # a dev cell drawn for one run seed (None: the dev set every seed shares)


def cells(split: Split, agents: Sequence[int] | None = None) -> list[SuiteCell]:
    """The (agents, size, subset) cells of a split, in table order; `agents` replaces the split's agent counts
    (the benchmark's 3, 4, 5; the first validation set's 2): each count's cells draw from a stream of their own."""
    if split == Split.BENCHMARK:
        counts, per_cell = (3, 4, 5), 50
    else:
        counts, per_cell = FIRST_AGENTS, VALIDATION_PER_SIZE // len(WAIT_SUBSETS)
    agents = counts if agents is None else agents
    return [SuiteCell(split, k, s, w, per_cell) for k in agents for s in range(max(3, k), MAX_SIZE + 1)
            for w in WAIT_SUBSETS]


def validation_cells(per_size: int = VALIDATION_PER_SIZE, agents: Sequence[int] = VALIDATION_AGENTS
                     ) -> list[SuiteCell]:
    """The cells of a validation set with `per_size` boards per (agent count, map size) (a multiple of 3, at least
    30), for each count of `agents` on sizes max(3, K)..10: each standard cell, then (past 30 per size) the cell of
    the boards it adds, in table order (count, size, wait subset)."""
    subsets = len(WAIT_SUBSETS)
    extra = checked_per_size(Split.VALIDATION, per_size) // subsets - VALIDATION_PER_SIZE // subsets
    out = []
    for cell in cells(Split.VALIDATION, agents=checked_agents(agents)):
        out.append(cell)
        if extra:
            out.append(SuiteCell(cell.split, cell.agents, cell.size, cell.subset, extra, extra=True))
    return out


def dev_cells(per_size: int = DEV_PER_SIZE, agents: Sequence[int] = VALIDATION_AGENTS,
              draw: int | None = None) -> list[SuiteCell]:
    """The cells of a dev set with `per_size` boards per (agent count, map size) (a multiple of 3, at least 3), for
    each count of `agents` on sizes max(3, K)..10, in table order; drawn for run seed `draw` (None: shared)."""
    subsets = len(WAIT_SUBSETS)
    checked_per_size(Split.DEV, per_size)
    return [SuiteCell(Split.DEV, k, s, w, per_size // subsets, draw=draw) for k in checked_agents(agents)
            for s in range(max(3, k), MAX_SIZE + 1) for w in WAIT_SUBSETS]


def boards_in(split: Split, per_size: int, agents: Sequence[int] = VALIDATION_AGENTS) -> int:
    """The boards of a validation or dev set of `per_size` per (agent count, size): 960 for the validation set of 120
    per size at 2 agents, 2,520 at agents 3, 4, 5 (8 + 7 + 6 sizes)."""
    todo = dev_cells(per_size, agents) if split == Split.DEV else validation_cells(per_size, agents)
    return sum(cell.count for cell in todo)


def checked_per_size(split: Split, per_size: int) -> int:
    """`per_size` as the boards per (agent count, map size) of a validation or dev set: a multiple of 3 (one share
    per wait subset), at least 30 (the standard set) for validation and 3 for dev; a ValueError saying so. The
    check alone, without the cells: a run's settings are checked with it each time they are read."""
    subsets = len(WAIT_SUBSETS)
    name, least, what = (("validation_per_size", VALIDATION_PER_SIZE, " (the standard set)")
                         if split == Split.VALIDATION else ("dev_per_size", subsets, ""))
    if per_size < least or per_size % subsets:
        raise ValueError(f"{name} = {per_size}: a multiple of {subsets} (one share per wait subset), "
                         f"at least {least}{what}")
    return per_size


def checked_agents(agents: Sequence[int]) -> Sequence[int]:
    """The agent counts of a validation or dev set; a ValueError for none, or for a count whose cells cannot be
    drawn: one agent never waits, so no board of it meets a wait subset."""
    if not agents:
        raise ValueError("name at least one agent count")
    if (few := min(agents)) < 2:
        raise ValueError(f"agent count {few}: one agent never waits, so its boards cannot meet the wait subsets "
                         "(validation and dev boards have 2 agents or more)")
    return agents


def dev_entries(per_size: int, exclude: Iterable[Instance], seed: int = SUITE_SEED,
                agents: Sequence[int] = VALIDATION_AGENTS, draw: int | None = None,
                on_part: Callable[[int, int], None] | None = None) -> list[Entry]:
    """The dev boards, `per_size` per (agent count, map size), none of them among `exclude` (the validation boards
    beside them): a board drawn again as one of those is drawn anew, so the two sets never share a board. `draw`
    is the run seed a dev set of its own is drawn for (None: the dev set every seed shares). `on_part(done, total)`
    is told the boards made so far after each cell."""
    taken = frozenset(board.id for board in exclude)
    todo = dev_cells(per_size, agents, draw)
    entries: list[Entry] = []
    for cell in todo:
        entries.extend(build_cell(cell, seed, taken)[0])
        if on_part is not None:
            on_part(len(entries), sum(c.count for c in todo))
    return entries


def suite_draw(size: int, agents: int, exclude: frozenset[str] = frozenset()):
    def draw(rng: np.random.Generator) -> Instance | None:
        board = _board(rng)
        return None if board is None or board.id in exclude else board

    def _board(rng: np.random.Generator) -> Instance | None:
        ratio = rng.uniform(0.0, 0.5)
        holes = min(round_half_up(ratio * size * size), size * size - 2 * agents)
        while holes >= 0:
            board = random_board(size, holes, agents, rng)
            if board is not None:
                return board
            holes -= 1
        return None

    return draw


def build_cell(cell: SuiteCell, seed: int = SUITE_SEED,
               exclude: frozenset[str] = frozenset()) -> tuple[list[Entry], float, str]:
    """The cell's boards (none whose id is in `exclude`), plus the slowest single board's labelling time and its id
    (for reports)."""
    namespace = (BENCHMARK if cell.split == Split.BENCHMARK else DEV if cell.split == Split.DEV
                 else VALIDATION_EXTRA if cell.extra else VALIDATION)
    stream = [namespace, seed, cell.agents, cell.size, WAIT_SUBSETS.index(cell.subset)]
    # a run seed's dev cell: the seed joins the stream (five words already, so a 0 appended is a stream of its own)
    rng = np.random.default_rng(stream if cell.draw is None else [*stream, cell.draw])
    wait_count = round_half_up(cell.subset * cell.count)
    if cell.extra:  # the standard cell and its added boards together meet the subset exactly
        standard = VALIDATION_PER_SIZE // len(WAIT_SUBSETS)
        wait_count = round_half_up(cell.subset * (standard + cell.count)) - round_half_up(cell.subset * standard)
    what = f"{cell.split} cell (agents {cell.agents}, size {cell.size}, wait subset {cell.subset})"
    stats: dict = {}
    entries = [Entry(split=cell.split, subset=cell.subset, instance=inst)
               for inst in stratified(suite_draw(cell.size, cell.agents, exclude), cell.count, wait_count, rng, what,
                                          stats=stats)]
    return entries, *stats.get("slowest", (0.0, ""))


def _end_with(parent: int) -> None:
    """A pool process's start (Linux): the kernel SIGKILLs it when the process that started it dies, even by
    SIGKILL, so a killed job leaves no pool process waiting for work forever."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it died before the line above
        os._exit(1)


def pool(workers: int) -> ProcessPoolExecutor:
    """`workers` processes (at least one) that end with this one."""
    return ProcessPoolExecutor(max_workers=max(1, workers), initializer=_end_with, initargs=(os.getpid(),))


def build(split: Split, seed: int = SUITE_SEED, workers: int = 2, progress: bool = False,
          per_size: int = VALIDATION_PER_SIZE, agents: Sequence[int] = VALIDATION_AGENTS,
          on_part: Callable[[int, int], None] | None = None) -> tuple[list[Entry], dict]:
    """All boards of a split in table order, and build stats (seconds, slowest board). `per_size` and `agents` make
    the validation set (`validation_cells`). `progress`: a bar on the terminal; `on_part(done, total)` is told the
    boards made so far after each cell (a stage's log says so as it builds a set the first time)."""
    todo = validation_cells(per_size, agents) if split == Split.VALIDATION else cells(split)
    t0 = time.perf_counter()
    entries: list[Entry] = []
    slowest = (0.0, "")
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=sum(c.count for c in todo), desc=f"{split} suite", unit="board")
    with pool(workers) as cells_pool:
        for part, seconds, board in cells_pool.map(build_cell, todo, [seed] * len(todo)):
            entries.extend(part)
            slowest = max(slowest, (seconds, board))
            if bar is not None:
                bar.update(len(part))
            if on_part is not None:
                on_part(len(entries), sum(c.count for c in todo))
    if bar is not None:
        bar.close()
    stats = {"boards": len(entries), "seconds": time.perf_counter() - t0, "slowest_seconds": slowest[0],
             "slowest_board": slowest[1]}
    return entries, stats


def jsonl_line(entry: Entry) -> str:
    """A suite row as its JSONL line: what `write_jsonl` writes and what `boards_hash` hashes."""
    return entry.model_dump_json() + "\n"


def write_jsonl(entries: Iterable[Entry], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for e in entries:
            f.write(jsonl_line(e))


def boards_hash(entries: Iterable[Entry]) -> str:
    """The boards' content hash: sha256 (hex) over their JSONL lines in table order, i.e. of the file `write_jsonl`
    writes. The same boards give the same hash however they were kept (a JSONL file, a `datasets` folder, the
    episodes a stage was scored on), so a result names the exact boards behind it."""
    digest = hashlib.sha256()
    for e in entries:
        digest.update(jsonl_line(e).encode())
    return digest.hexdigest()


def read_jsonl(path: Path) -> list[Entry]:
    """Suite rows, or plain instance rows (given split "validation", subset from the label if any)."""
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(Entry.model_validate_json(line))
        except ValueError as err:
            raise ValueError(f"{path}:{n}: not a suite row: {str(err).splitlines()[0]}") from err
    return out


@dataclass(frozen=True)
class Report:
    """The paper's tables: rates per (agents, size), the mean over sizes, and per (agents, wait subset)."""

    by_size: dict[tuple[int, int], tuple[float, float, int]]  # (agents, size) -> (valid, optimal, n)
    mean_over_sizes: dict[int, tuple[float, float]]
    by_subset: dict[tuple[int, float], tuple[float, float, int]]
    boards: str = ""  # `boards_hash` of the entries scored, in their order

    def to_markdown(self) -> str:
        agents = sorted(self.mean_over_sizes)
        sizes = sorted({s for _, s in self.by_size})
        lines = ["| agents | " + " | ".join(f"{s}x{s}" for s in sizes) + " | mean |",
                 "|---" * (len(sizes) + 2) + "|"]
        for k in agents:
            row = []
            for s in sizes:
                v = self.by_size.get((k, s))
                row.append(f"{v[0]:.1%} / {v[1]:.1%}" if v else "-")
            m = self.mean_over_sizes[k]
            lines.append(f"| {k} | " + " | ".join(row) + f" | {m[0]:.1%} / {m[1]:.1%} |")
        subsets = sorted({w for _, w in self.by_subset})
        lines += ["", "| agents | " + " | ".join(f"wait {w:.2f}" for w in subsets) + " |",
                  "|---" * (len(subsets) + 1) + "|"]
        for k in agents:
            cellv = [self.by_subset.get((k, w)) for w in subsets]
            lines.append(f"| {k} | " + " | ".join(f"{v[0]:.1%} / {v[1]:.1%}" if v else "-" for v in cellv) + " |")
        return "valid rate / optimal rate\n\n" + "\n".join(lines)


def report(entries: Sequence[Entry], valid: Sequence[bool], optimal: Sequence[bool]) -> Report:
    """Tables from scored episodes, one per entry in the same order, and the entries' `boards_hash`."""
    if not (len(entries) == len(valid) == len(optimal)):
        raise ValueError(f"{len(entries)} entries but {len(valid)} valid flags and {len(optimal)} optimal flags")
    size_acc: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0, 0])
    subset_acc: dict[tuple[int, float], list[int]] = defaultdict(lambda: [0, 0, 0])
    for e, v, o in zip(entries, valid, optimal, strict=True):
        for acc in (size_acc[(e.agents, e.size)], subset_acc[(e.agents, e.subset)]):
            acc[0] += bool(v)
            acc[1] += bool(o)
            acc[2] += 1
    by_size = {key: (a[0] / a[2], a[1] / a[2], a[2]) for key, a in sorted(size_acc.items())}
    by_subset = {key: (a[0] / a[2], a[1] / a[2], a[2]) for key, a in sorted(subset_acc.items())}
    mean: dict[int, tuple[float, float]] = {}
    for k in sorted({k for k, _ in by_size}):
        rows = [v for (kk, _), v in by_size.items() if kk == k]
        mean[k] = (sum(r[0] for r in rows) / len(rows), sum(r[1] for r in rows) / len(rows))
    return Report(by_size, mean, by_subset, boards_hash(entries))
