"""`benchmarks/bench_gemma_engineer.py` at a tiny budget: one proposal of one answer of at most 8 tokens by Gemma 3
270M (offline); what it counts adds up (about half a minute on a loaded CPU, most of it reading the prompt)."""

from __future__ import annotations

import re
import sys

import pytest

from tests.benchmark_scripts import NEEDS_GEMMA, failed, load, offline_gemma

pytestmark = NEEDS_GEMMA
gemma = pytest.fixture(offline_gemma)


def test_the_answers_counts_add_up(request, capsys, monkeypatch, gemma):
    bench = load("bench_gemma_engineer", request)
    monkeypatch.setattr(sys, "argv", ["bench_gemma_engineer.py", "--n", "1", "--max-tokens", "8",
                                      "--max-attempts", "1"])
    bench.main()
    out = capsys.readouterr().out
    assert "setup (boards, Gemma checkpoint and load):" in out
    assert re.search(r"^proposal 0: 1 answer\(s\), \d+\.\d s, ", out, re.M)
    assert ("hf:gemma3-270m, 1 proposals, max 1 answers each, 8 new tokens max, temperature 0.7, 1 torch thread(s)"
            in out)
    counts = re.search(r"^answers: 1; held a readable JSON object: ([01]) \(\d+%\); projected to a legal config: "
                       r"([01]) \(\d+%\)$", out, re.M)
    assert counts, out
    read, legal = map(int, counts.groups())
    assert legal <= read
    assert f"first answers readable: {read}/1, legal: {legal}/1" in out
    assert f"proposals with a legal config: {legal}/1;" in out
    assert failed(out, "answers") == 1 - legal
