"""`benchmarks/bench_page.py` at a tiny budget: every page action timed in Chromium, idle and beside a real stage of
the tiny policy, in one run (its figures are ratios against the idle run, never asserted as wall-clock times here).
Skips without Playwright or Chromium, unless ENVLAB_REQUIRE_BROWSER=1."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_page.py"


def test_the_page_actions_are_timed_in_a_browser_idle_and_while_a_stage_trains_and_every_tab_walked(capfd,
                                                                                                    monkeypatch):
    """Four actions (Compare among them) timed idle and beside a real stage of the tiny policy training, then, beside
    the same stage, a walk through every tab clicking what only reads (`tests.page_walk.Walk.every_tab`): not one
    error box or toast appears, the server logs no traceback, and the stage trained from before the first action to
    after the walk."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    spec = importlib.util.spec_from_file_location("bench_page", BENCH)
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    if reason := bench.missing():
        if os.environ.get("ENVLAB_REQUIRE_BROWSER") == "1":
            pytest.fail(f"ENVLAB_REQUIRE_BROWSER=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    figures, still, errors = bench.bench(repeats=1, play_steps=3, wait_s=300, warm=False,
                                         only=["open a run", "a decision", "the live edit check", "Compare"],
                                         beside=lambda walk: walk.every_tab(3))
    assert list(figures) == ["open a run (the tab shown)", "a decision (reject and ask again)",
                             "the live edit check (one cell typed)", "Compare (an experiment drawn)"]
    assert errors == []
    steps = re.fullmatch(r"yes, GRPO steps (\d+) to (\d+) of 2000 logged meanwhile", still)
    assert steps is not None, still  # the stage trained from before the first action to after the walk
    assert all(idle > 0 and loaded is not None and loaded > 0 for idle, loaded in figures.values())
    # the server logs no traceback while it serves; a request its shutdown cuts short (the browser's poll) may log
    # one after "Closing server" (starlette: "Caught handled exception, but response already started")
    serving = "".join(capfd.readouterr()).partition("Closing server")[0]
    assert "Traceback" not in serving, serving[serving.find("Traceback"):][:4000]
    bench.report(figures, still, errors, 1)
    out = capfd.readouterr().out
    # idle, loaded, a ratio and the target per action: 1 s, 1.5 s for Compare
    assert re.findall(r"ms +\d+ms +\d+\.\dx +(\d+)ms", out) == ["1000", "1000", "1000", "1500"]
    assert "target: each action <= 1 s, Compare <= 1.5 s, with a stage training beside the page" in out
    assert "error boxes the page showed: 0" in out
