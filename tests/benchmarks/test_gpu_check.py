"""The device check's CPU part: the same command that runs Qwen3-shaped models on a GPU, at a tiny size, so it
cannot rot between the times a GPU is at hand; run in a virtual environment that holds only what a GPU machine has and
the wheels the check carries, so it cannot count on a package it would not find there."""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "benchmarks" / "gpu_check.py"
WHEEL_LIMIT = 64 * 2**20  # what a device machine's call carries


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _with_needs(names: list[str]) -> dict[str, importlib.metadata.Distribution]:
    """The installed distributions `names` and every one they require (extras aside), by normalised name."""
    found: dict[str, importlib.metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        if _key(name) in found:
            continue
        found[_key(name)] = dist = importlib.metadata.distribution(name)
        for text in dist.requires or []:
            need = Requirement(text)
            if need.marker is None or need.marker.evaluate({"extra": ""}):
                todo.append(need.name)
    return found


@pytest.fixture
def carrying(request) -> tuple[object, dict[str, importlib.metadata.Distribution]]:
    """The check's module, and what a GPU machine holds once the check has installed its wheels: the machine's own
    packages (`MACHINE`, with their needs) and the carried ones (`carried()`), each as installed here."""
    from tests.benchmark_scripts import load

    check = load("gpu_check", request)
    held = _with_needs(list(check.MACHINE))
    held.update({_key(name): importlib.metadata.distribution(name)
                 for name in (pinned.partition("==")[0] for pinned in check.carried())})
    return check, held


def _clean_venv(folder: Path, dists: dict[str, importlib.metadata.Distribution]) -> Path:
    """A virtual environment in `folder` whose site-packages holds `dists` only (links to this one's files) and this
    working tree (as `pip install -e` would); its Python."""
    venv.create(folder, symlinks=True, with_pip=False)
    site = next(folder.glob("lib/python3*/site-packages"))
    for dist in dists.values():
        root = Path(dist.locate_file(""))
        for top in {file.parts[0] for file in dist.files or [] if file.parts[0] not in ("..", "__pycache__")}:
            if (root / top).exists() and not (site / top).exists():
                (site / top).symlink_to(root / top)
    (site / "envlab.pth").write_text(f"{ROOT}\n")
    return folder / "bin" / "python"


def test_the_carried_wheels_are_pinned_to_what_is_tested_need_nothing_else_and_fit_a_call(carrying) -> None:
    """Each carried wheel is the version installed here (the one these tests run), every need of each is the
    machine's or carried too (they install with --no-deps), and their files, which a wheel zips, stay under 64 MiB
    (17 MB as Python 3.12's manylinux wheels)."""
    check, held = carrying
    pins = [pinned.partition("==") for pinned in check.carried()]
    assert [(name, version) for name, _, version in pins] == [
        (name, importlib.metadata.version(name)) for name, _, _ in pins]
    for name, _, _ in pins:
        needs = [Requirement(text) for text in importlib.metadata.distribution(name).requires or []]
        assert [need.name for need in needs if (need.marker is None or need.marker.evaluate({"extra": ""}))
                and _key(need.name) not in held] == [], name
    files = [Path(dist.locate_file(file)) for name, _, _ in pins
             for dist in [importlib.metadata.distribution(name)] for file in dist.files or []
             if "__pycache__" not in file.parts]
    assert sum(file.stat().st_size for file in files if file.is_file()) < WHEEL_LIMIT
    assert {_key(name) for name, _, _ in pins} >= {"pillow", "cloudpickle", "trl", "submitit"}


def test_the_device_check_trains_and_stores_everything_at_a_tiny_size(tmp_path: Path, carrying) -> None:
    """In a virtual environment of only a GPU machine's packages and the carried wheels: the check's whole path
    (`envlab run`, its worker, the stage's child, TRL, validation, the database) imports nothing else."""
    python = _clean_venv(tmp_path / "venv", carrying[1])
    out, scratch = tmp_path / "figures.json", tmp_path / "scratch"
    scratch.mkdir()
    done = subprocess.run([str(python), str(CHECK), "--tiny", "--steps", "1", "--instances", "4", "--boards", "4",
                           "--completion-length", "16", "--out", str(out), "--scratch", str(scratch)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    [figures] = json.loads(out.read_text())
    assert (figures["model"], figures["device"], figures["exit"], figures["grpo_steps"]) == ("tiny", "CPU", 0, 1)
    assert figures["saved_dtype"] == "F32" and figures["stored"]["stages"] == [[0, "done"], [1, "done"]]
    assert figures["stored"]["all_there"] and figures["grpo_tokens_per_s"] > 0
    assert figures["mfu"] is None and figures["peak_gpu_memory_mib"] is None  # no GPU: nothing made up
    assert list(scratch.iterdir()) == []  # the models and their run written there, and gone with the check


def test_a_shape_it_does_not_know_is_named_before_anything_runs(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(CHECK), "--shapes", "4b,7b", "--out", str(tmp_path / "figures.json")],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "--shapes 4b,7b: 7b is not one of 0.6b, 4b, two" in done.stderr
    assert not (tmp_path / "figures.json").exists()


def test_a_scratch_folder_that_is_not_there_is_named_before_anything_runs(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(CHECK), "--scratch", str(tmp_path / "nowhere"), "--out",
                           str(tmp_path / "figures.json")], capture_output=True, text=True)
    assert done.returncode == 2 and f"--scratch {tmp_path / 'nowhere'}: no such folder" in done.stderr
    assert not (tmp_path / "figures.json").exists()


def test_the_checks_shapes_tie_their_embeddings_as_qwen3_does(request) -> None:
    """Qwen3-0.6B and Qwen3-4B both tie their input and output embeddings: an untied 4B shape carried 0.39 B
    parameters the real model does not have (4.41 B, not 4.02 B), so its memory and MFU were those of another
    model. The check's shapes count as the published models do, and as the lab's memory estimate counts 4B."""
    import torch
    from transformers import AutoModelForCausalLM

    from tests.benchmark_scripts import load
    from training.memory import qwen3

    check = load("gpu_check", request)

    def parameters(shape: str) -> int:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(check.model_config(shape, check.QWEN3_VOCAB))
        return sum(p.numel() for p in model.parameters())

    assert parameters("4b") == 4_022_468_096 == sum(p.numel() for p in qwen3("4B").parameters())
    assert parameters("0.6b") == 596_049_920
    assert all(check.model_config(shape, 100).tie_word_embeddings for shape in check.SHAPES)
