"""`benchmarks/bench_app.py` at a tiny budget: the page's actions timed idle and with a real stage of the tiny policy
training beside the page, in one run (its figures are ratios against the idle run, never asserted as wall-clock
times here)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_app.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_app", BENCH)
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclasses look their module up while they are made
    spec.loader.exec_module(bench)
    return bench


def test_the_page_actions_are_timed_idle_and_while_a_stage_trains_side_by_side(capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    bench = load_bench()
    timed = bench.bench_actions(repeats=1, load="stage", wait_s=300)
    assert list(timed) == ["open a run (the tab shown)", "open a proposal (with its boards)",
                           "first visit to Stage review",
                           "a failure row to its replay", "one Play step, 10x10 board, 5 agents",
                           "Play to the end, 10x10 (40 steps): slowest", "one Play step, a stored episode",
                           "the live edit check (one cell typed)", "a decision (reject and ask again)"]
    assert all(idle > 0 and loaded is not None and loaded > 0 for idle, loaded, _ in timed.values())
    assert [target for *_, target in timed.values()] == [1.5] * 5 + [0.6] + [1.5] * 3
    out = capsys.readouterr().out
    steps = re.search(r"training while measured: yes, GRPO steps (\d+) to (\d+) of 2000 logged meanwhile", out)
    assert steps is not None, out  # the stage trained from before the first measurement to after the last
    assert 0 < int(steps[1]) <= int(steps[2]) < 2000
    assert len(re.findall(r"ms +\d+ms +\d+\.\dx  <= ", out)) == len(timed)  # idle, loaded and a ratio per action
    assert "target: each action <= 1.5 s with a stage training beside the page" in out


def test_a_stage_that_is_not_training_gives_no_loaded_figures(capsys, monkeypatch):
    """A stage not seen training within the wait (here 1 s, less than its worker takes to start): the loaded column
    stays empty and says what the stage was doing, rather than figures taken beside no training."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    bench = load_bench()
    timed = bench.bench_actions(repeats=1, load="stage", wait_s=1)
    assert all(idle > 0 and loaded is None for idle, loaded, _ in timed.values())
    out = capsys.readouterr().out
    assert re.search(r"training while measured: NO: not seen training within 1 s \(stage job (queued|running), "
                     r"(step \d+/\d+|no step counted yet): ", out), out
    assert len(re.findall(r"ms +- +-  <= ", out)) == len(timed)
