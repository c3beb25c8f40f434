"""Solver labels for the warm start: boards of 2 to 5 agents on sizes 3..10, labelled by CBS, kept on disk.

Labelling is the costly half of the warm start (CBS takes 2-50 ms a board at 2 agents and 0.2-0.4 s at 5), so it is
done once, on every core, into shards that the warm start reads as often as it likes. A shard is one
(agents, size, index) cell of `shard_boards` boards and a pure function of (seed, agents, size, index): the same
settings give the same files on any machine. Shards are made in rounds (every cell's shard 0, then every cell's
shard 1, ...), so a label set cut short is still spread over every cell. A shard is written to a temporary name and
renamed when whole: a run stopped anywhere resumes where it stopped and never makes a shard twice.

Boards are drawn as the benchmark draws them (hole ratio uniform in 0..0.5 per board, lowered only where the agents'
starts and goals would not fit), from the training seed namespace, half of them needing a wait (a third at
2 agents, where a wait is rare and each extra one costs several solver calls). Boards the solver cannot label
within its node budget are skipped, as the benchmark skips them. Which of these boards the warm start may train
on is its business: it drops every board of a held-out set (`training.warmstart.held_out_ids`).

    python -m training.labels --out ~/envlab-labels --boards 120000
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gzip
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
from tqdm import tqdm

from envsim.generator import TRAINING, GenerationError, stratified
from envsim.instance import Instance
from envsim.suite import MAX_SIZE, pool, suite_draw

AGENTS = (2, 3, 4, 5)
# Share of boards per agent count: the benchmark's 3 to 5 agents get most; 2 stays for the lab's 2-agent stages.
AGENT_WEIGHTS = {2: 0.16, 3: 0.24, 4: 0.28, 5: 0.32}
# Share of an agent count's boards per size (the sizes a count can hold, renormalised): small boards are cheap to
# learn from and are where stages start; large ones are where answers are long.
SIZE_WEIGHTS = {3: 0.10, 4: 0.12, 5: 0.14, 6: 0.14, 7: 0.13, 8: 0.13, 9: 0.12, 10: 0.12}
LABELS_NAMESPACE = 101  # after TRAINING in a shard's seed: no stage's boards share its stream
MANIFEST = "labels.json"
T = TypeVar("T")


@dataclass
class Args:
    out: str = "labels"
    """the folder of shards (made if missing; a folder of other settings is refused)"""
    boards: int = 120_000
    """boards in all (rounded up to whole shards per cell)"""
    shard_boards: int = 250
    seed: int = 0
    workers: int = 0
    """labelling processes; 0: one per core"""


@dataclass(frozen=True)
class Shard:
    agents: int
    size: int
    index: int

    @property
    def name(self) -> str:
        return f"a{self.agents}-s{self.size:02d}-{self.index:04d}.jsonl.gz"


def cells() -> list[tuple[int, int]]:
    """Every (agents, size) cell labelled: K agents on sizes max(3, K)..10, as the benchmark's cells."""
    return [(k, s) for k in AGENTS for s in range(max(3, k), MAX_SIZE + 1)]


def plan(boards: int, shard_boards: int) -> list[Shard]:
    """The shards of a label set in the order they are made: round by round over every cell."""
    shares = {}
    for k, s in cells():
        sizes = range(max(3, k), MAX_SIZE + 1)
        shares[(k, s)] = AGENT_WEIGHTS[k] * SIZE_WEIGHTS[s] / sum(SIZE_WEIGHTS[t] for t in sizes)
    per_cell = {cell: max(1, -(-round(boards * share) // shard_boards)) for cell, share in shares.items()}
    rounds = max(per_cell.values())
    return [Shard(k, s, j) for j in range(rounds) for (k, s) in cells() if j < per_cell[(k, s)]]


def wait_share(agents: int) -> float:
    return 1 / 3 if agents == 2 else 0.5


def label_shard(shard: Shard, shard_boards: int, seed: int) -> list[Instance]:
    """The shard's labelled boards (fewer than `shard_boards` only where its cell cannot be filled)."""
    rng = np.random.default_rng([TRAINING, LABELS_NAMESPACE, seed, shard.agents, shard.size, shard.index])
    wait_count = round(wait_share(shard.agents) * shard_boards)
    what = f"labels (agents {shard.agents}, size {shard.size}, shard {shard.index})"
    out: list[Instance] = []
    with contextlib.suppress(GenerationError):  # a cell that cannot be filled keeps what it found
        out.extend(stratified(suite_draw(shard.size, shard.agents), shard_boards, wait_count, rng, what))
    return out


def write_shard(folder: Path, shard: Shard, shard_boards: int, seed: int) -> tuple[Shard, int, float]:
    """Label one shard and write it whole (a temporary name renamed at the end); returns it, its boards, seconds."""
    t0 = time.perf_counter()
    boards = label_shard(shard, shard_boards, seed)
    tmp = folder / f".{shard.name}.{os.getpid()}.tmp"
    with gzip.open(tmp, "wt") as f:
        for board in boards:
            f.write(board.model_dump_json() + "\n")
    tmp.rename(folder / shard.name)
    return shard, len(boards), time.perf_counter() - t0


def read_shards(folder: str | Path) -> Iterator[tuple[Shard, list[Instance]]]:
    """Every whole shard in `folder`, in plan order where the manifest gives one, with its boards."""
    folder = Path(folder)
    manifest = json.loads((folder / MANIFEST).read_text())
    for shard in plan(manifest["boards"], manifest["shard_boards"]):
        file = folder / shard.name
        if file.is_file():
            with gzip.open(file, "rt") as f:
                yield shard, [Instance.model_validate_json(line) for line in f if line.strip()]


def settings_of(args: Args) -> dict:
    return {"boards": args.boards, "shard_boards": args.shard_boards, "seed": args.seed,
            "agent_weights": AGENT_WEIGHTS, "size_weights": SIZE_WEIGHTS}


def open_folder(args: Args) -> Path:
    """The label folder, made with its manifest, or refused when it holds a label set of other settings."""
    folder = Path(args.out).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    manifest = folder / MANIFEST
    want = json.loads(json.dumps(settings_of(args)))
    if manifest.is_file():
        have = json.loads(manifest.read_text())
        if have != want:
            diff = sorted(k for k in want if have.get(k) != want[k])
            raise SystemExit(f"{folder} holds labels made with other settings ({', '.join(diff)}): "
                             f"name another folder or the same settings")
    else:
        manifest.write_text(json.dumps(want, indent=1) + "\n")
    for stale in folder.glob(".*.tmp"):  # a shard cut off mid-write
        stale.unlink()
    return folder


def run(args: Args) -> int:
    """Label every shard of the plan that is not on disk yet; returns the number of boards labelled now."""
    folder = open_folder(args)
    shards = plan(args.boards, args.shard_boards)
    todo = [s for s in shards if not (folder / s.name).is_file()]
    workers = args.workers or os.cpu_count() or 1
    bar = tqdm(total=len(shards) * args.shard_boards, initial=(len(shards) - len(todo)) * args.shard_boards,
               desc="labels", unit="board", mininterval=5)
    made = 0
    with pool(workers) as labellers:
        n = len(todo)
        for shard, count, seconds in labellers.map(write_shard, [folder] * n, todo, [args.shard_boards] * n,
                                                   [args.seed] * n):
            made += count
            bar.update(args.shard_boards)
            bar.set_postfix(cell=f"{shard.agents}a {shard.size}x{shard.size}", shard_s=f"{seconds:.0f}",
                            refresh=False)
    bar.close()
    return made


def command_line(settings: type[T], doc: str, argv: list[str] | None = None) -> T:
    """A settings dataclass as the command line sets it: one flag a field (`--a-b` for `a_b`), the defaults its own
    (the labels' and the warm start's scripts)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    for field in dataclasses.fields(settings):
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=type(field.default), default=field.default)
    return settings(**vars(parser.parse_args(argv)))


if __name__ == "__main__":
    run(command_line(Args, __doc__))
