"""`benchmarks/bench_scoring.py` at a tiny budget (2,000 episodes): the batch scorer agrees with the step-by-step one
on every episode of the sample, and the exit status says what the lines say."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_scoring.py"


def test_the_batch_scorer_agrees_with_the_step_by_step_one():
    # a process of its own: the script sets the thread variables of the process it is loaded in
    done = subprocess.run([sys.executable, str(BENCH), "--episodes", "2000", "--sample", "300", "--repeats", "1"],
                          capture_output=True, text=True, timeout=300)
    out = done.stdout
    assert "built 2,000 episodes in" in out, out + done.stderr[-2000:]
    assert re.search(r"^episodes +2,000 +agent-steps [\d,]+; valid \d+\.\d%", out, re.M)
    assert re.search(r"^ratio batch/score +\d+\.\dx$", out, re.M)
    assert "agreement on sample  300/300 episodes" in out
    target = re.search(r"^target +5,000,000 agent-steps/s +(met|MISSED)$", out, re.M)
    assert target, out
    # its exit status: the absolute target (which a tiny budget on a busy machine may miss) and the agreement
    assert done.returncode == (0 if target.group(1) == "met" else 1)
