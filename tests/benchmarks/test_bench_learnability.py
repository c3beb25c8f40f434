"""`benchmarks/bench_learnability.py` at a tiny budget: one board per size of `hard-start`, two sampled answers each;
every row's learnability and dead share follow from its valid share, and the weighted line from the rows."""

from __future__ import annotations

import re

from lab.study.experiments import load_scenario
from tests.benchmark_scripts import load


def test_each_size_of_the_scenario_is_tabled(request, capsys):
    bench = load("bench_learnability", request)
    bench.main(bench.Args(boards=1, generations=2))
    out = capsys.readouterr().out
    assert "scenario hard-start, policy tiny: 1 boards per size, 2 sampled answers each (temperature 1)" in out
    config = load_scenario("hard-start").config
    rows = re.findall(r"^\| (\d+)x\1 \| \d+% \| \d+% \| (\d+\.\d)% \| (\d\.\d{3}) \| (\d+)% \|$", out, re.M)
    assert [int(size) for size, *_ in rows] == list(config.sizes)
    learn = {}
    for size, p, mean, dead in rows:  # one board, two answers: p is 0, 1/2 or 1, and the rest follows from it
        assert p in ("0.0", "50.0", "100.0")
        assert float(mean) == (0.25 if p == "50.0" else 0.0) and int(dead) == (100 if p == "0.0" else 0)
        learn[int(size)] = (float(mean), int(dead) / 100)
    weighted = sum(config.data_ratio[s] * m for s, (m, _) in learn.items())
    dead = sum(config.data_ratio[s] * d for s, (_, d) in learn.items())
    assert f"weighted by the data shares: mean p(1-p) {weighted:.3f}; groups with no advantage {dead:.0%}" in out
