"""The device check's CPU part: the same command that runs Qwen3-shaped models on a GPU, at a tiny size, so it
cannot rot between the times a GPU is at hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CHECK = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_check.py"


def test_the_device_check_trains_and_stores_everything_at_a_tiny_size(tmp_path: Path) -> None:
    out, scratch = tmp_path / "figures.json", tmp_path / "scratch"
    scratch.mkdir()
    done = subprocess.run([sys.executable, str(CHECK), "--tiny", "--steps", "1", "--instances", "4", "--boards", "4",
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
    assert done.returncode == 2 and "--shapes 4b,7b: 7b is not one of 0.6b, 4b" in done.stderr
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
