"""`benchmarks/bench_evaluate.py` at a tiny budget: four 2-agent validation boards answered in a batch and one at a
time, with the same answers."""

from __future__ import annotations

import re

from tests.benchmark_scripts import load


def test_batched_and_one_at_a_time_answer_alike(request, capsys):
    bench = load("bench_evaluate", request)
    bench.main(bench.Args(boards=4, batch_size=4, threads=1, agents="2"))
    out = capsys.readouterr().out
    assert "4 validation boards (agents 2, sizes up to 6), tiny policy, greedy, 1 threads" in out
    assert re.search(r"^batched \(batch 4\): +\d+\.\d\d episodes/s \(\d+\.\d s\)$", out, re.M)
    assert re.search(r"^one at a time: +\d+\.\d\d episodes/s \(\d+\.\d s\)$", out, re.M)
    assert re.search(r"^speed-up: \d+\.\dx; identical answers: 4/4; valid: [0-4]/4$", out, re.M)
