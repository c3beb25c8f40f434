"""The background scripts' shared part and their refusals: `scripts/fixed-commit.sh` checks a clone out at the
commit asked for, and `scripts/study-second-pass.sh` and `scripts/headroom-steps.sh` refuse to start before the
headroom screen's report exists."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

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


def test_the_study_waits_for_the_screens_report(tmp_path: Path) -> None:
    (tmp_path / "headroom").mkdir()
    done = subprocess.run(["bash", str(ROOT / "scripts" / "study-second-pass.sh")], capture_output=True, text=True,
                          env={**os.environ, "WORK": str(tmp_path)})
    assert done.returncode == 2
    assert done.stderr == (f"the headroom screen in {tmp_path}/headroom is not done (no report/report.md): "
                           "bash scripts/headroom-screen.sh\n")
    assert not (tmp_path / "second-pass").exists()  # nothing made


def test_the_steps_probe_waits_for_the_screens_report(tmp_path: Path) -> None:
    (tmp_path / "headroom").mkdir()
    done = subprocess.run(["bash", str(ROOT / "scripts" / "headroom-steps.sh")], capture_output=True, text=True,
                          env={**os.environ, "WORK": str(tmp_path)})
    assert done.returncode == 2
    assert done.stderr == (f"the headroom screen in {tmp_path}/headroom is not done (no report/gains.csv): "
                           "bash scripts/headroom-screen.sh\n")
    assert os.listdir(tmp_path / "headroom") == []  # nothing made
