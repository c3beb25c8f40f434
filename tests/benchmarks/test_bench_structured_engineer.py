"""`benchmarks/bench_structured_engineer.py` at a tiny budget: after the example run's first stage only, one seed, at
most 8 tokens, Gemma 3 270M (offline) answers once in free text and once held to the schema; each mode's counts add
up and the ratio line is there (about a minute on a loaded CPU, most of it reading the prompt twice)."""

from __future__ import annotations

import re
import sys

import pytest

from tests.benchmark_scripts import NEEDS_GEMMA, failed, load, offline_gemma

pytestmark = NEEDS_GEMMA
gemma = pytest.fixture(offline_gemma)


def test_free_and_constrained_answers_are_counted_alike(request, capsys, monkeypatch, gemma):
    bench = load("bench_structured_engineer", request)
    monkeypatch.setattr(sys, "argv", ["bench_structured_engineer.py", "--summaries", "1", "--seeds", "1",
                                      "--max-tokens", "8"])
    bench.main()
    out = capsys.readouterr().out
    assert re.search(r"^setup \(example run, Gemma load\): \d+\.\d s; 1 stage summaries x 1 seeds$", out, re.M)
    for mode in ("free text", "constrained"):
        assert re.search(rf"^after stage 0, seed 0, {mode}: \d+\.\d s, [1-8] tokens, ", out, re.M), out
        row = re.search(rf"^\| {mode} \| ([01]) of 1 \| [01] of \1 \| ", out, re.M)
        assert row, out
        assert failed(out, f"{mode} answers") == 1 - int(row.group(1))
    assert ("hf:gemma3-270m on the example run: 1 stage summaries x 1 seeds = 1 proposals, one answer each, at most 8 "
            "new tokens") in out
    assert re.search(r"^constrained / free text, seconds per proposal: \d+\.\d\d$", out, re.M)
