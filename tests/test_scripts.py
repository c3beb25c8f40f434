"""The background scripts' shared part and their refusals: `scripts/fixed-commit.sh` checks a clone out at the
commit asked for, and `scripts/study-second-pass.sh` and `scripts/headroom-steps.sh` refuse to start before the
headroom screen's report exists."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _head() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_fixed_commit_clones_once_and_checks_the_commit_out(tmp_path: Path) -> None:
    work, head = tmp_path / "work", _head()
    first = subprocess.run(["git", "-C", str(ROOT), "rev-list", "--max-parents=0", "HEAD"], capture_output=True,
                           text=True, check=True).stdout.split()[0]
    script = f'source "{ROOT}/scripts/fixed-commit.sh"; fixed_commit "{ROOT}" "{work}" "$1"; ' \
             f'git -C "{work}/src" rev-parse HEAD'
    for commit in (head, first, head):  # cloned the first time, then fetched and checked out again
        done = subprocess.run(["bash", "-c", script, "-", commit], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == commit and (work / "COMMIT").read_text() == f"{commit}\n"
    assert (work / "src" / "scripts" / "fixed-commit.sh").is_file()


@pytest.mark.parametrize(("script", "needs"), [("study-second-pass.sh", "report/report.md"),
                                              ("headroom-steps.sh", "report/gains.csv")])
def test_what_follows_the_screen_waits_for_its_report(tmp_path: Path, script: str, needs: str) -> None:
    (tmp_path / "headroom").mkdir()
    done = subprocess.run(["bash", str(ROOT / "scripts" / script)], capture_output=True, text=True,
                          env={**os.environ, "WORK": str(tmp_path)})
    assert done.returncode == 2
    assert done.stderr == (f"the headroom screen in {tmp_path}/headroom is not done (no {needs}): "
                           "bash scripts/headroom-screen.sh\n")
    assert sorted(os.listdir(tmp_path)) == ["headroom"] and os.listdir(tmp_path / "headroom") == []  # nothing made
