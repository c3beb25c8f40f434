"""`benchmarks/tiny_benchmark.py` on a few boards (`--boards`): one of each agent count, tabled and printed, while the
shipped assets/leaderboard/tiny.json stays as it is; and how `--boards N` spreads N over the benchmark's cells."""

from __future__ import annotations

import json
from collections import Counter

from lab.study.reference import TINY_FILE
from tests.benchmark_scripts import load


def test_a_few_boards_are_printed_and_the_shipped_result_left_alone(request, capsys):
    shipped, written = TINY_FILE.read_bytes(), TINY_FILE.stat().st_mtime_ns
    bench = load("tiny_benchmark", request)
    bench.main(bench.Args(boards=3))
    captured = capsys.readouterr()
    assert TINY_FILE.read_bytes() == shipped and TINY_FILE.stat().st_mtime_ns == written
    assert "3 benchmark boards built in" in captured.err
    assert f"3 of the boards only: not written to {TINY_FILE}" in captured.err
    out = captured.out
    data = json.loads(out[out.index("\n{\n") + 1:])
    assert data["boards"] == 3 and data["command"].endswith(" --boards 3")
    # one board of each agent count: the first of its first cell
    assert [(r["agents"], r["size"], r["n"]) for r in data["by_size"]] == [(3, 3, 1), (4, 4, 1), (5, 5, 1)]
    assert [(r["agents"], r["subset"], r["n"]) for r in data["by_subset"]] == [(3, 0.25, 1), (4, 0.25, 1),
                                                                              (5, 0.25, 1)]
    valid = sum(r["valid"] == 100.0 for r in data["by_size"])
    assert sum(data["failures"].values()) == 3 - valid  # every board not valid failed in one way
    assert "| agents | 3x3 | 4x4 | 5x5 | mean |" in out


def test_the_boards_are_spread_over_each_agent_counts_cells(request, monkeypatch):
    bench = load("tiny_benchmark", request)
    monkeypatch.setattr(bench, "build_cell", lambda cell: ([(cell.agents, cell.size, cell.subset, i)
                                                            for i in range(cell.count)], 0.0, ""))
    assert bench.sample(3) == [(3, 3, 0.25, 0), (4, 4, 0.25, 0), (5, 5, 0.25, 0)]
    # 6 boards: 2 a count (of 1,200, 1,050 and 900 boards), each count's second from the middle of its boards
    assert bench.sample(6) == [(3, 3, 0.25, 0), (3, 7, 0.25, 0), (4, 4, 0.25, 0), (4, 7, 0.5, 25), (5, 5, 0.25, 0),
                               (5, 8, 0.25, 0)]
    assert Counter(b[0] for b in bench.sample(63)) == {3: 24, 4: 21, 5: 18}  # each count in proportion
    everything = bench.sample(3150)
    assert len(set(everything)) == 3150 and everything == sorted(everything)  # the whole benchmark, in table order
