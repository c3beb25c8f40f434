"""`benchmarks/bench_experiment.py` at a tiny budget: one run of one stage on 8 boards, done by one worker process
and then by two; the figures are start-up and the database (a minute or two on a loaded 2-core machine)."""

from __future__ import annotations

import re

from tests.benchmark_scripts import load


def test_every_run_finishes_with_one_worker_and_with_two(request, capsys):
    bench = load("bench_experiment", request)
    bench.main(bench.Args(arms="fixed", seeds=1, stages=1, instances=8, validation_per_size=30, validation_boards=8,
                          grpo="num_generations=2,per_device_train_batch_size=16", workers="1,2"))
    out = capsys.readouterr().out
    assert ("experiment: arms fixed, 1 seeds, 1 stages of 8 boards, validation 30 per size (8 boards used), GRPO "
            "{'num_generations': 2, 'per_device_train_batch_size': 16}") in out
    for workers in (1, 2):  # the one run done each time
        assert re.search(rf"^{workers} worker\(s\): +\d+\.\d runs/hour \(1 runs in \d+ s\)$", out, re.M), out
    assert re.search(r"^ratio 2 workers / 1 worker: \d+\.\d\dx$", out, re.M)
