import hashlib
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from envsim.generator import round_half_up
from envsim.suite import (
    FIRST_AGENTS,
    VALIDATION_AGENTS,
    WAIT_SUBSETS,
    Entry,
    Split,
    boards_hash,
    boards_in,
    build,
    build_cell,
    cells,
    dev_cells,
    dev_entries,
    read_jsonl,
    report,
    validation_cells,
    write_jsonl,
)


def test_the_benchmark_layout_is_the_papers():
    bench = cells("benchmark")
    assert len(bench) == (8 + 7 + 6) * 3
    assert sum(c.count for c in bench) == 3150
    assert {(c.agents, min(x.size for x in bench if x.agents == c.agents)) for c in bench} == {(3, 3), (4, 4), (5, 5)}
    assert {c.subset for c in bench} == {0.25, 0.5, 0.75}
    assert sum(c.count for c in cells("validation")) == 240


def test_a_benchmark_cell_hits_its_wait_subset_exactly():
    cell = next(c for c in cells("benchmark") if (c.agents, c.size, c.subset) == (4, 6, 0.75))
    entries, slowest, board = build_cell(cell)
    assert len(entries) == 50
    assert sum(e.instance.needs_wait for e in entries) == round_half_up(0.75 * 50) == 38
    assert all(e.agents == 4 and e.size == 6 and e.subset == 0.75 for e in entries)
    assert all(len(e.instance.holes) <= round_half_up(0.5 * 36) for e in entries)
    assert slowest > 0 and board in {e.instance.id for e in entries}
    assert build_cell(cell)[0] == entries  # fixed by the seed


def test_validation_set_is_disjoint_from_the_benchmark(tmp_path):
    validation, stats = build("validation", workers=2, agents=FIRST_AGENTS)
    assert stats["boards"] == len(validation) == 240
    assert all(e.agents == 2 for e in validation)
    assert len({e.instance.id for e in validation}) == 240
    two_agent_sized = [c for c in cells("benchmark") if c.agents == 3 and c.size <= 4]
    bench_ids = {e.instance.id for c in two_agent_sized for e in build_cell(c)[0]}
    assert not bench_ids & {e.instance.id for e in validation}
    write_jsonl(validation, tmp_path / "v.jsonl")
    assert read_jsonl(tmp_path / "v.jsonl") == validation


def test_the_boards_hash_is_the_jsonl_file_s_sha256_and_names_the_boards(tmp_path):
    """The hash of a suite's boards is the sha256 of the JSONL file they are written to, fixed by the seed (pinned
    here: a change to how the suite draws its boards changes it), and the report of scored boards carries it."""
    entries = build_cell(cells(Split.BENCHMARK)[0])[0]  # agents 3, 3x3, wait subset 0.25: 50 boards
    write_jsonl(entries, tmp_path / "cell.jsonl")
    assert boards_hash(entries) == hashlib.sha256((tmp_path / "cell.jsonl").read_bytes()).hexdigest() == \
        "e69abb13f578cde90da4c2300ba16c3466cb5c94b465b120e80b8843841d62e3"
    assert boards_hash(read_jsonl(tmp_path / "cell.jsonl")) == boards_hash(entries)
    assert boards_hash(entries[::-1]) != boards_hash(entries)  # in table order
    assert report(entries, [True] * 50, [False] * 50).boards == boards_hash(entries)


def test_report_tables_from_known_outcomes():
    def entry(agents, size, subset):
        from envsim.instance import Instance
        starts = tuple((0, i) for i in range(agents))
        goals = tuple((size - 1, i) for i in range(agents))
        board = Instance(size=size, holes=(), starts=starts, goals=goals)
        return Entry(split="benchmark", subset=subset, instance=board)

    entries = [entry(3, 3, 0.25), entry(3, 3, 0.75), entry(3, 4, 0.25), entry(4, 4, 0.25)]
    r = report(entries, valid=[True, False, True, True], optimal=[True, False, False, True])
    assert r.by_size == {(3, 3): (0.5, 0.5, 2), (3, 4): (1.0, 0.0, 1), (4, 4): (1.0, 1.0, 1)}
    assert r.mean_over_sizes == {3: (0.75, 0.25), 4: (1.0, 1.0)}
    assert r.by_subset == {(3, 0.25): (1.0, 0.5, 2), (3, 0.75): (0.0, 0.0, 1), (4, 0.25): (1.0, 1.0, 1)}
    md = r.to_markdown()
    assert "| 3 | 50.0% / 50.0% | 100.0% / 0.0% | 75.0% / 25.0% |" in md
    assert "| 4 | - | 100.0% / 100.0% | 100.0% / 100.0% |" in md


def test_the_dev_boards_are_drawn_like_the_validation_boards_and_share_none_with_them():
    validation = [e.instance for e in build(Split.VALIDATION, agents=FIRST_AGENTS)[0]]
    dev = dev_entries(30, validation, agents=FIRST_AGENTS)
    assert len(dev) == 240 and {e.split for e in dev} == {Split.DEV}
    assert Counter(e.size for e in dev) == {s: 30 for s in range(3, 11)}
    waits = Counter((e.size, e.subset) for e in dev if e.instance.needs_wait)  # each cell's subset met exactly
    assert waits == {(s, w): round_half_up(10 * w) for s in range(3, 11) for w in WAIT_SUBSETS}
    assert not {e.instance.id for e in dev} & {b.id for b in validation}  # no board in both sets
    # drawn without the exclusion, the dev stream does meet a validation board: the exclusion is what keeps them apart
    unguarded = dev_entries(30, [], agents=FIRST_AGENTS)
    assert sum(e.instance.id in {b.id for b in validation} for e in unguarded) == 1
    assert dev_entries(30, validation, agents=FIRST_AGENTS) == dev  # a function of the seed and the boards it avoids
    with pytest.raises(ValueError, match="dev_per_size = 10: a multiple of 3"):
        dev_cells(10)


def _digest(entries: list[Entry]) -> str:
    return hashlib.sha256("\n".join(e.instance.id for e in entries).encode()).hexdigest()[:16]


def test_the_2_agent_validation_and_dev_sets_are_the_boards_they_were_before_other_counts():
    """The first counts, (2,), give the boards every run stored before the default became 3, 4, 5 was evaluated on:
    the ids in order, pinned from the functions as they were before they took `agents` (the same digests for 120 per
    size: 0cef1775c2e3434d, and its 3-per-size dev set: b09d314be6165db6)."""
    validation = build(Split.VALIDATION, agents=FIRST_AGENTS)[0]
    assert _digest(validation) == "ff2f81ffe4920c1e"
    assert _digest(dev_entries(30, [e.instance for e in validation], agents=FIRST_AGENTS)) == "0331292042b4451c"
    assert [(c.agents, c.size, c.subset, c.count, c.extra) for c in validation_cells(120, FIRST_AGENTS)] == [
        (2, s, w, n, extra) for s in range(3, 11) for w in WAIT_SUBSETS for n, extra in ((10, False), (30, True))]
    # beside other counts, the 2-agent cells are the same cells, first: each cell's boards are a function of it
    assert validation_cells(120, (2, 3))[:48] == validation_cells(120, FIRST_AGENTS)
    assert dev_cells(30, (2, 4))[:24] == dev_cells(30, FIRST_AGENTS)
    # the default is the paper's counts
    assert VALIDATION_AGENTS == (3, 4, 5) and validation_cells(30) == validation_cells(30, (3, 4, 5))


def test_the_papers_agent_counts_give_cells_on_the_benchmarks_sizes():
    for per_size, boards in [(30, 630), (120, 2520)]:  # 8 + 7 + 6 sizes at agents 3, 4, 5
        todo = validation_cells(per_size, (3, 4, 5))
        assert sum(c.count for c in todo) == boards
        by_cell = Counter()
        for c in todo:
            by_cell[c.agents, c.size] += c.count
        assert by_cell == {(k, s): per_size for k in (3, 4, 5) for s in range(k if k > 3 else 3, 11)}
    assert Counter(c.agents for c in dev_cells(30, (3, 4, 5)) for _ in range(c.count)) == {3: 240, 4: 210, 5: 180}
    assert [boards_in(Split.VALIDATION, 120, FIRST_AGENTS), boards_in(Split.VALIDATION, 120),
            boards_in(Split.DEV, 30, (3, 4, 5))] == [960, 2520, 630]
    with pytest.raises(ValueError, match="agent count 1: one agent never waits"):
        validation_cells(30, (1, 2))
    # dev boards at 3 agents: 3 per size, each cell's subset met, and a board among `exclude` drawn anew
    dev = dev_entries(3, [], agents=(3,))
    assert Counter((e.agents, e.size) for e in dev) == {(3, s): 3 for s in range(3, 11)}
    waits = Counter(e.size for e in dev if e.instance.needs_wait)  # 1 board a cell: round(0.25, 0.5, 0.75) waits
    assert waits == {s: 0 + 1 + 1 for s in range(3, 11)}
    guarded = dev_entries(3, [dev[0].instance], agents=(3,))
    assert len(guarded) == 24 and dev[0].instance.id not in {e.instance.id for e in guarded}
    assert guarded[1:] == dev[1:]  # only the first cell was drawn again: each cell is a stream of its own


KILLED_WITH_ITS_POOL = """
import os, sys, time
from envsim.suite import pool
def pid(_):
    time.sleep(0.3)
    return os.getpid()
workers = pool(2)
print(*sorted(set(workers.map(pid, range(6)))), flush=True)
time.sleep(600)
"""


def test_the_pool_that_builds_a_suite_ends_with_the_process_that_started_it():
    """A process killed by SIGKILL (a job's child, its worker gone) while its board-building pool waits for work:
    the pool's processes end with it, none is left waiting forever."""
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WITH_ITS_POOL], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[2])
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert pids and all(Path(f"/proc/{p}").exists() for p in pids)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 10
    while (alive := [p for p in pids if _running(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive == []


def _running(pid: int) -> bool:
    """Whether `pid` is a process that has not ended (a zombie, ended and waiting for its reaper, has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_dev_set_drawn_per_seed_is_the_seeds_own_and_never_a_validation_or_benchmark_board():
    """Each run seed draws a dev set of its own (the seed joins every cell's stream), beside the one validation set
    every seed is scored on; the same seed draws the same boards, and no draw (a run made before) draws the shared
    set, the boards pinned above."""
    two = dict(agents=FIRST_AGENTS)
    validation = [e.instance for e in build(Split.VALIDATION, **two)[0]]
    shared = dev_entries(3, validation, **two)
    drawn = {seed: dev_entries(3, validation, draw=seed, **two) for seed in range(4)}
    ids = {seed: [e.instance.id for e in entries] for seed, entries in drawn.items()}
    assert dev_entries(3, validation, draw=2, **two) == drawn[2]  # a pure function of the seed
    assert all(len(set(i)) == 24 for i in ids.values())
    assert len({tuple(i) for i in ids.values()} | {tuple(e.instance.id for e in shared)}) == 5
    assert all(len(set(ids[a]) & set(ids[b])) <= 1 for a in ids for b in ids if a < b)  # 3x3 boards may repeat
    assert [(e.size, e.subset, e.instance.needs_wait) for e in drawn[1]] == [
        (e.size, e.subset, e.instance.needs_wait) for e in shared]  # drawn like the shared set, cell by cell
    held = {b.id for b in validation}
    assert not any(set(i) & held for i in ids.values())
    # at 3 agents, beside that count's validation cells, and apart from the benchmark's 3-agent boards (sizes 3, 4)
    small = [c for c in cells(Split.BENCHMARK) + cells(Split.VALIDATION, agents=(3,)) if c.agents == 3 and c.size <= 4]
    held = {e.instance.id for c in small for e in build_cell(c)[0]}
    for seed in range(3):
        beside = [e.instance for c in cells(Split.VALIDATION, agents=(3,)) if c.size <= 4 for e in build_cell(c)[0]]
        dev = [e for e in dev_entries(3, beside, agents=(3,), draw=seed) if e.size <= 4]
        assert len(dev) == 6 and not {e.instance.id for e in dev} & held
