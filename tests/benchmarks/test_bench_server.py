"""`benchmarks/bench_server.py` at a tiny budget: a lab of the example run alone (no studies), each action timed once
after its untimed call, every row printed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_server.py"


def test_the_servers_actions_are_timed_on_a_first_start_lab(tmp_path: Path):
    done = subprocess.run([sys.executable, str(BENCH), "--no-studies", "--repeats", "1"], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert re.fullmatch(r"lab: 1 runs \(made in \d+\.\d s\); median of 1 after one untimed call", lines[0])
    assert [re.fullmatch(r"(.+?) +[\d,]+ ms", line).group(1) for line in lines[1:]] == [
        "the bar above the tabs", "open a run on Train", "open a run on Stage review", "open a run on Proposal",
        "the run a page load opens"]
