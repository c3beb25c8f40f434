"""The extras that keep a GPU machine's torch (pyproject.toml: `vllm-torch211`, `vllm-torch213`), resolved by uv
against the package registry: metadata only, no wheel and no weights downloaded. Skipped, saying so, where the
registry or uv is not at hand."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = "https://pypi.org/simple/vllm/"
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
# each extra, the torch it resolves to and the vLLM releases it may take: `vllm` alone the newest vLLM, whose torch
# 2.13.0 replaces a machine's 2.11 where a resolver does not hold on to it (pip); each of the other two its own torch
EXTRAS = {"vllm": ("2.13.0", (0, 22), (0, 31)), "vllm-torch211": ("2.11.0", (0, 24), (0, 26)),
          "vllm-torch213": ("2.13.0", (0, 27), (0, 31))}


@pytest.fixture(scope="module")
def uv() -> list[str]:
    """uv, where the registry answers: else the test is skipped naming what is missing."""
    if importlib.util.find_spec("uv") is None:
        pytest.skip("uv is not installed in this environment (pip install uv): it resolves the extras")
    try:
        urllib.request.urlopen(urllib.request.Request(REGISTRY, method="HEAD"), timeout=15).close()
    except OSError as err:
        pytest.skip(f"the package registry cannot be reached ({REGISTRY}: {err}): resolving the extras needs its "
                    "metadata")
    return [sys.executable, "-m", "uv"]


def pins(text: str) -> dict[str, str]:
    """`name==version` lines of a resolution, by name."""
    found = {}
    for line in text.splitlines():
        name, sep, version = line.strip().lstrip("+- ").partition("==")
        if sep:
            found[name.lower()] = version.split()[0]  # `2.11.0 (from file:///...)`: the version
    return found


def release(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


@pytest.mark.parametrize("extra", EXTRAS)
def test_each_extra_resolves_on_a_gpu_machine_to_its_torch(uv, extra):
    """For Linux x86_64 (where vLLM has wheels), this Python."""
    torch, least, most = EXTRAS[extra]
    done = subprocess.run([*uv, "pip", "compile", "--no-header", "--no-annotate", "--extra", extra, "--python-version",
                           PYTHON, "--python-platform", "x86_64-manylinux_2_28", "pyproject.toml"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    found = pins(done.stdout)
    assert found["torch"] == torch
    assert least <= release(found["vllm"]) <= most and release(found["trl"]) == (1, 16)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="vLLM publishes wheels for Linux only")
def test_an_environment_with_torch_2_11_keeps_it_with_its_extra_and_takes_2_13_with_the_other(uv, tmp_path):
    """An environment holding torch 2.11.0 (a wheel of its name and version only, as a GPU machine's own build looks to
    a resolver), planned with uv's dry run: `vllm-torch211` adds vLLM beside that torch, `vllm-torch213` replaces it
    with 2.13.0."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run([sys.executable, str(ROOT / ".ci" / "stub_wheel.py"), "torch", "2.11.0", str(tmp_path)], check=True)
    python = str(venv / "bin" / "python")
    subprocess.run([*uv, "pip", "install", "--python", python, "--no-index", "--offline",
                    str(tmp_path / "torch-2.11.0-py3-none-any.whl")], check=True, capture_output=True)

    def plan(extra: str) -> tuple[dict[str, str], dict[str, str]]:
        """What installing envlab with `extra` would add and remove."""
        done = subprocess.run([*uv, "pip", "install", "--dry-run", "--python", python, "-e", f".[{extra}]"],
                              cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        lines = done.stderr.splitlines()
        return tuple(pins("\n".join(line for line in lines if line.startswith(sign))) for sign in (" + ", " - "))

    added, removed = plan("vllm-torch211")
    assert "torch" not in added and "torch" not in removed and (0, 24) <= release(added["vllm"]) <= (0, 26)
    added, removed = plan("vllm-torch213")
    assert (added["torch"], removed["torch"]) == ("2.13.0", "2.11.0")
