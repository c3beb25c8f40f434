"""`benchmarks/bench_app.py` at a tiny budget: the page's actions timed idle and under load in one run (its
figures are ratios against the idle run, never asserted as wall-clock times here)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_app.py"


def test_the_page_actions_are_timed_idle_and_under_load_side_by_side(capsys):
    spec = importlib.util.spec_from_file_location("bench_app", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    timed = bench.bench_actions(repeats=1, load="spin")
    assert list(timed) == ["open a run (every tab)", "open a proposal (with its boards)", "first visit to Stage review",
                           "a failure row to its replay", "one Play step, 10x10 board, 5 agents",
                           "one Play step, a stored episode"]
    assert all(idle > 0 and loaded is not None and loaded > 0 for idle, loaded in timed.values())
    out = capsys.readouterr().out
    assert "loaded while measured: yes at the start, yes at the end" in out  # the load ran the whole time
    assert out.count("x\n") == len(timed)  # a ratio per action
