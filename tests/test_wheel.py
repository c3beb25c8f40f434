"""What `pip install envlab` puts on a machine: the four packages and the `envlab` command, no generic top-level
module (the root's `app.py` is a checkout's entry point; the page is `lab.pages.web`).

The wheel is built from a copy of the sources, offline and without build isolation (setuptools comes with torch),
so the checkout gets no `build/` or egg-info folder.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("envsim", "lab", "storage", "training")


def test_the_wheel_holds_the_packages_and_no_top_level_app(tmp_path: Path):
    pytest.importorskip("setuptools.build_meta")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "app.py"):
        shutil.copy(ROOT / name, src / name)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", str(tmp_path / "out"), str(src)], check=True, capture_output=True)
    (wheel,) = (tmp_path / "out").glob("envlab-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names}
    dist_info = next(t for t in top if t.endswith(".dist-info"))
    assert top == {*PACKAGES, dist_info}
    assert "app.py" not in names and "lab/pages/web.py" in names
    entry_points = zipfile.ZipFile(wheel).read(f"{dist_info}/entry_points.txt").decode()
    assert "envlab = lab.cli:main" in entry_points
