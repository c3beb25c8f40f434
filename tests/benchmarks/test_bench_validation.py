"""`benchmarks/bench_validation.py` at a tiny budget: the 2-agent sets of 30 and 33 boards per size built with a
machine cache of the benchmark's own (never the machine's), the standard set read into a second runs root from it,
and 10 boards of each set evaluated, with the same answers on the common ones."""

from __future__ import annotations

import os
import re

from tests.benchmark_scripts import load


def test_a_set_is_built_once_a_machine_and_common_boards_answer_alike(request, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("ENVLAB_CACHE", str(tmp_path / "machine"))  # what the benchmark must leave alone
    bench = load("bench_validation", request)
    bench.main(bench.Args(per_size=33, agents="2", boards=10))
    out = capsys.readouterr().out
    assert "tiny policy, greedy, batch 64, 1 torch threads; agents 2" in out
    assert re.search(r"^build: standard 240 boards \d+\.\d s; 264 boards \d+\.\d s \(then read from the cache in "
                     r"\d+\.\d\d s\)$", out, re.M), out
    cache = re.search(r"^machine cache: the standard 240 boards into a fresh runs root (\d+\.\d\d) s with it empty, "
                      r"(\d+\.\d{3}) s into another with it holding them; ratio (\d+)x; same boards: yes$", out, re.M)
    assert cache, out
    empty, held, ratio = float(cache.group(1)), float(cache.group(2)), int(cache.group(3))
    assert abs(ratio - empty / max(held, 0.001)) <= 0.1 * ratio + 1  # it follows from the two (no speed asserted)
    # 10 boards of the standard set; of the larger one those and 1 more (it has 264 / 240 as many)
    assert re.search(r"^evaluate 10 boards \(of 240\): +\d+\.\d s \(mean of a run before and after\)  valid "
                     r"\d+\.\d%$", out, re.M)
    assert re.search(r"^evaluate 11 boards \(of 264\): +\d+\.\d s  valid \d+\.\d%$", out, re.M)
    assert re.search(r"^ratio: \d+\.\d\dx the seconds for 1\.1x the boards; answers on the common 10 boards "
                     r"identical: 10/10$", out, re.M)
    assert os.environ["ENVLAB_CACHE"] == str(tmp_path / "machine") and not (tmp_path / "machine").exists()


def test_a_spread_of_each_set_is_evaluated(request):
    bench = load("bench_validation", request)

    class Board(str):
        id = property(str.__str__)

    standard = [Board(f"s{i}") for i in range(8)]
    larger = [b for i in range(8) for b in (standard[i], Board(f"x{i}"))]  # each standard board, then one added
    small, large = bench.evaluated(standard, larger, 4)
    assert small == ["s0", "s2", "s4", "s6"]
    assert large == ["s0", "x0", "s2", "x2", "s4", "x4", "s6", "x6"]  # those 4 and 4 more: twice the boards
    assert bench.evaluated(standard, larger, 0) == (standard, larger)
    assert bench.evaluated(standard, standard, 3) == (["s0", "s2", "s5"], ["s0", "s2", "s5"])
