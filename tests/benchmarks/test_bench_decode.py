"""`benchmarks/bench_decode.py` at its CI budget: transformers' `generate` and the decode loop on the same 12
validation boards and one GRPO step of the shipped tiny policy, with the same answers and the same loss curve."""

from __future__ import annotations

import re

import training.decode
from tests.benchmark_scripts import load


def test_both_paths_answer_alike_and_a_ratio_is_printed(capsys, request, monkeypatch):
    temperatures = []  # of each batch the loop answered: greedy validation (None), GRPO's rollouts (1.0)
    loop = training.decode.decode
    monkeypatch.setattr(training.decode, "decode",
                        lambda *a, **kw: temperatures.append(kw.get("temperature")) or loop(*a, **kw))
    bench = load("bench_decode", request)
    figures = bench.main(bench.Args(quick=True))
    out = capsys.readouterr().out
    assert "tiny policy (shipped), 1 torch thread(s); agents 3,4,5, sizes 5,6,7,8,9,10; each path 1 turn(s)" in out
    line = re.search(r"^validation, 12 boards greedy in batches of 64: generate (\d+\.\d\d) s, loop (\d+\.\d\d) s; "
                     r"ratio (\d+\.\d\d)x; answers identical 12/12; valid \d+/12$", out, re.M)
    assert line, out
    old, new, ratio = map(float, line.groups())
    assert abs(ratio - old / new) <= 0.01 * ratio + 0.01  # the ratio follows from the two (no speed asserted)
    assert re.search(r"^GRPO step, 2 boards x 8 completions \(median of 1 after a warm-up\): generate \d+\.\d\d s, "
                     r"loop \d+\.\d\d s; ratio \d+\.\d\dx; loss curves of 2 steps differ by at most 0$", out, re.M), out
    assert figures["same"] == figures["boards"] == 12 and figures["loss_gap"] == 0.0
    assert None in temperatures and 1.0 in temperatures  # validation and the rollouts went through the loop
    assert "run" not in figures  # the whole run is not part of the CI budget


def test_transformers_continuous_batching_answers_as_the_loop_does_and_its_time_is_printed(capsys, request):
    """`--paged`: transformers' continuous batching (`generate_batch`) on the same boards, greedy, at one budget: the
    same answers as the loop, and the two times with their ratio (no speed asserted)."""
    bench = load("bench_decode", request)
    args = bench.Args(quick=True)
    boards = bench.boards_of(args, 4, seed=7)
    figures = bench.paged(bench.load_policy("tiny"), boards, 64)
    assert figures["same"] == 4 and figures["budget"] == max(bench.answer_budget(bench.load_policy("tiny"), b)
                                                                 for b in boards)
    assert set(figures["seconds"]) == {"loop", "paged"} and all(s > 0 for s in figures["seconds"].values())
