"""benchmarks/bench_grpo.py at a tiny budget: both models step GRPO and generate, and the figures it prints follow
from what it measured (tokens, seconds, the parameter count, the peak)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_grpo.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_grpo", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up by name
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_bench_grpo_measures_both_models_at_a_tiny_budget(bench, capsys):
    threads = torch.get_num_threads()
    try:
        figures = bench.run(bench.parser().parse_args(["--steps", "1", "--prompts", "1", "--generations", "2",
                                                        "--tokens", "4", "--threads", "1", "--no-vllm"]))
    finally:
        torch.set_num_threads(threads)
    assert [(f.model, f.mode) for f in figures] == [
        ("tiny", "GRPO"), ("tiny", "generate (transformers)"),
        ("qwen3-0.6b-small (random)", "GRPO"), ("qwen3-0.6b-small (random)", "generate (transformers)")]
    qwen = figures[2]
    shape = bench.CPU_SHAPE
    assert qwen.params == sum(p.numel() for p in bench.qwen3_policy(shape).model.parameters())
    assert qwen.completion_tokens == 2 * 4  # fixed-length completions: 2 of 4 tokens a step
    assert all(f.seconds > 0 and f.tokens > f.completion_tokens > 0 for f in figures)
    assert math.isclose(qwen.flops, 8 * qwen.params * qwen.tokens / qwen.seconds)
    assert math.isclose(figures[3].flops, 2 * qwen.params * figures[3].tokens / figures[3].seconds)
    out = capsys.readouterr().out
    assert "CPU, float32 peak 96 GFLOP/s (estimate: 96 GFLOP/s a core x 1 threads)" in out
    peak = bench.CPU_PEAK_PER_CORE
    assert qwen.row(peak) in out and f"{qwen.flops / peak:.2%}" in qwen.row(peak)


def test_the_full_qwen3_shape_is_qwen3_06b(bench):
    from transformers import Qwen3Config

    config = Qwen3Config(**bench.QWEN3_06B)
    with torch.device("meta"):  # the shape only: no memory, no weights
        from transformers import Qwen3ForCausalLM

        model = Qwen3ForCausalLM(config)
    assert round(sum(p.numel() for p in model.parameters()) / 1e6) == 596  # Qwen3-0.6B: 0.6 B with tied embeddings
