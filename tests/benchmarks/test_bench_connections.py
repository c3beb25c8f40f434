"""`benchmarks/bench_connections.py` at a tiny budget: heartbeat connections without a login are refused and cost
the page under `--auth` neither memory nor open files."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_connections.py"


def test_connections_without_a_login_are_refused_and_cost_nothing() -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--attempts", "200"], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert "   200 answered HTTP/1.1 401 Unauthorized" in done.stdout
    files = re.search(r"page open files: (\d+) before, at most (\d+) meanwhile", done.stdout)
    assert files and int(files.group(2)) <= int(files.group(1)) + 5
