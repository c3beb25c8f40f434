"""`benchmarks/bench_memory.py` at CI's tiny shape: the shipped tiny policy trains one GRPO step at two completion
lengths, each in a child process of its own, and the rows it prints are the estimate of `training.memory` for the
child's own plan beside the resident memory the child measured."""

from __future__ import annotations

import re

import pytest

from tests.benchmark_scripts import load


def test_the_tiny_shape_prints_estimate_and_measured_peak_for_each_length(request, capsys):
    bench = load("bench_memory", request)
    rows = bench.run(bench.parser().parse_args(["--tiny", "--threads", "1", "--stop-gb", "4"]))
    assert [r.length for r in rows] == [8, 16]
    for r in rows:
        assert not r.stopped
        # the child's estimate is its plan's: the process on a CPU, the weights, and the rest by part
        assert r.total == sum(v for k, v in r.estimate.items() if k != "total")
        assert r.estimate["runtime"] == 10**9 and r.estimate["weights"] > 0
        # what it measured: a loaded process, then more while it steps, the kernel's high-water mark at least that
        assert 0 < r.loaded <= r.peak and r.step <= r.peak and r.prompt > 0
        assert r.peak < 4e9
        assert 0 <= r.free < r.peak  # the allocator's free heap at the step's peak, part of it
    out = capsys.readouterr().out
    assert "tiny, LoRA off, 4 boards of size 3 with 2 agents a step, 1 threads, stop at 4 GB, glibc's malloc as a " \
           "CPU stage sets it; GB of resident memory" in out
    assert bench.HEADER in out
    for r in rows:
        assert re.search(rf"^ +{r.length} +{r.prompt} +{r.total / 1e9:.2f} +{r.peak / 1e9:.2f} +"
                         rf"{r.total / r.peak:.2f} ", out, re.M), out


def test_a_child_past_its_limit_stops_itself_and_is_reported_as_stopped(request, capsys):
    """A length that does not fit never reaches the kernel's OOM killer: its child stops itself at `--stop-gb`."""
    bench = load("bench_memory", request)
    rows = bench.run(bench.parser().parse_args(["--policy", "tiny", "--lengths", "8", "--lora", "0", "--size", "3",
                                                "--agents", "2", "--boards", "4", "--threads", "1",
                                                "--stop-gb", "0.3"]))  # the tiny shape at one length
    assert [r.stopped for r in rows] == [True]  # torch alone is more than 0.3 GB
    assert rows[0].peak > 0.3e9
    assert capsys.readouterr().out.count("(stopped)") == 1


pytestmark = pytest.mark.usefixtures("one_thread")
