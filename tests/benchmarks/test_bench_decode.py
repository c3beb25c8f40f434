"""`benchmarks/bench_decode.py` at its CI budget: transformers' `generate` and the decode loop on the same 12
validation boards and one GRPO step of the shipped tiny policy, with the same answers and the same loss curve."""

from __future__ import annotations

import re

import training.decode
from tests.benchmark_scripts import load


def test_both_paths_answer_alike_and_a_ratio_is_printed(capsys, request, monkeypatch):
    # of each batch the loop answered: greedy validation (None), GRPO's rollouts (1.0), each drafted or not
    temperatures = []
    loop, drafted = training.decode.decode, training.decode.decode_drafted
    monkeypatch.setattr(training.decode, "decode",
                        lambda *a, **kw: temperatures.append(kw.get("temperature")) or loop(*a, **kw))
    monkeypatch.setattr(training.decode, "decode_drafted",
                        lambda *a, **kw: temperatures.append(("drafted", a[7] if len(a) > 7 else kw.get("temperature")))
                        or drafted(*a, **kw))
    bench = load("bench_decode", request)
    figures = bench.main(bench.Args(quick=True))
    out = capsys.readouterr().out
    assert "tiny policy (shipped), 1 torch thread(s); agents 3,4,5, sizes 5,6,7,8,9,10; each path 1 turn(s)" in out
    line = re.search(r"^validation, 12 boards greedy in batches of 64: generate (\d+\.\d\d) s, loop (\d+\.\d\d) s, "
                     r"drafted (\d+\.\d\d) s; ratio (\d+\.\d\d)x, (\d+\.\d\d)x; answers identical 12/12, 12/12; "
                     r"valid \d+/12$", out, re.M)
    assert line, out
    old, new, drafts, ratio, drafts_ratio = map(float, line.groups())
    # each ratio follows from the two times (no speed asserted)
    assert abs(ratio - old / new) <= 0.01 * ratio + 0.01 and abs(drafts_ratio - old / drafts) <= 0.01 * ratio + 0.01
    forwards = re.search(r"^  (\d+) decode steps for \d+ tokens: .*; forwards of the model: generate (\d+), "
                         r"loop (\d+), drafted (\d+)$", out, re.M)
    assert forwards, out
    steps, plain, looped, fewer = map(int, forwards.groups())
    # one forward a step for generate and the loop; the drafts write the cells and line starts without one
    assert plain == looped == steps == figures["forwards"]["loop"] and fewer == figures["forwards"]["drafted"]
    assert fewer < steps / 1.5
    assert re.search(r"^GRPO step, 2 boards x 8 completions \(median of 1 after a warm-up\): generate \d+\.\d\d s, "
                     r"loop \d+\.\d\d s, drafted \d+\.\d\d s; ratio \d+\.\d\dx, \d+\.\d\dx; loss curves of 2 steps "
                     r"differ by at most 0 \(loop; drafted samples other answers from the same distribution\)$",
                     out, re.M), out
    assert figures["same"] == figures["boards"] == 12 and figures["loss_gap"] == 0.0
    # validation and the rollouts went through the loop and through the drafts
    assert {None, 1.0, ("drafted", None), ("drafted", 1.0)} <= set(temperatures)
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
