"""A stage's memory estimate, in exact numbers for the models this lab trains, and the stage refusing one that cannot
fit with the line that says what would.

The models are built on the meta device from their published shapes (no weights, nothing downloaded), so their
parameter counts and layers are the real ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from sqlalchemy import Engine
from transformers import AutoModelForCausalLM, Gemma3TextConfig, Qwen3Config

from envsim.config import EnvConfig
from envsim.generator import generate
from storage.settings import RunSettings
from training.evaluate import answer_budget
from training.memory import GB, StagePlan, plan_of, refusal, stage_memory
from training.policy import build_tiny, load_policy
from training.stage import StageArgs, StageError, grpo_config, train

GIB_24 = 24 * 2**30  # this machine
GPU_80 = 80 * 10**9
GEMMA_270M = Gemma3TextConfig(vocab_size=262_144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=256, tie_word_embeddings=True)
QWEN3 = {"0.6B": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16),
         "4B": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32)}
GEMMA_LONGEST_PROMPT = 511  # tokens of the longest chat prompt of sizes 3..10 in Gemma's tokenizer
# the stage's defaults for a chat policy on a GPU (`grpo_config`): batches of 8 completions, bf16 autocast,
# activation checkpointing; a prompt of 512 tokens and the chat budget of 512
ON_A_GPU = dict(device_bytes=GPU_80, batch=8, generations=4, prompt=512, completion=512, bf16=True,
                checkpointing=True, gpu=True)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def meta(config, dtype: torch.dtype = torch.float32):
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def qwen3(size: str, dtype: torch.dtype = torch.float32):
    return meta(Qwen3Config(vocab_size=151_936, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                            **QWEN3[size]), dtype)


def test_gemma_at_the_chat_defaults_is_refused_on_this_machine_naming_what_would_fit():
    """`envlab run --policy gemma3-270m --lora 8` at completion length 512: the kernel killed it at 23.5 GB."""
    gemma = meta(GEMMA_270M)
    plan = StagePlan(device_bytes=GIB_24, batch=8, generations=4, prompt=GEMMA_LONGEST_PROMPT, completion=512, lora=8)
    assert stage_memory(gemma, plan).logits == 2 * 8 * (511 + 512) * 262_144 * 4  # the vocabulary's share
    assert refusal(gemma, plan) == (
        "needs about 24.7 GB per process (weights 1.1 GB, logits 17.2 GB, activations 6.4 GB), more than 90% of the "
        "25.8 GB it has: it would fit with --completion-length 256 (about 18.8 GB) or --grpo "
        "per_device_train_batch_size=4 (about 12.9 GB)")
    # the settings docs/training.md runs it with: 2 answers of 8 tokens a step
    assert refusal(gemma, StagePlan(device_bytes=GIB_24, batch=2, generations=2, prompt=GEMMA_LONGEST_PROMPT,
                                    completion=8, lora=8)) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="reads the stage's CPU settings")
def test_the_plan_is_read_from_the_stages_own_config_on_a_cpu(tmp_path: Path):
    args = StageArgs(run_id=1, stage_index=1, seed=0, policy="", config=EnvConfig.default(), run_dir=tmp_path,
                     run_uuid="u", settings=RunSettings(stages=1, lora=8))
    plan = plan_of(grpo_config(args, {}, 512, "chat"), lora=8, prompt=GEMMA_LONGEST_PROMPT, device_bytes=GIB_24)
    assert plan == StagePlan(device_bytes=GIB_24, batch=8, generations=4, prompt=511, completion=512, lora=8)
    colocated = plan_of(grpo_config(args, {"vllm_mode": "colocate"}, 512, "chat"), lora=8, prompt=511)
    assert colocated.vllm_share == 0.0 and not colocated.gpu  # no vLLM on a CPU


def test_the_tiny_policys_defaults_fit_this_machine(tmp_path: Path):
    policy = load_policy("tiny")
    boards = generate(EnvConfig.default(), 64, seed=0)
    args = StageArgs(run_id=1, stage_index=1, seed=0, policy="tiny", config=EnvConfig.default(), run_dir=tmp_path,
                     run_uuid="u")
    config = grpo_config(args, {}, max(answer_budget(policy, b) for b in boards), "compact")
    prompt = max(len(policy.tokenizer(policy.prompt(b))["input_ids"]) for b in boards)
    plan = plan_of(config, lora=0, prompt=prompt, device_bytes=GIB_24)
    assert stage_memory(policy.model, plan).total < 1 * GB and refusal(policy.model, plan) is None


def test_a_4b_full_fine_tune_on_one_80_gb_gpu_is_refused_naming_lora_and_fsdp():
    four_b = qwen3("4B")
    assert sum(p.numel() for p in four_b.parameters()) == 4_022_468_096
    assert refusal(four_b, StagePlan(**ON_A_GPU)) == (
        "needs about 84.6 GB per GPU (weights 16.1 GB, autocast 8.0 GB, gradients 16.1 GB, optimizer 32.2 GB, logits "
        "10.0 GB, activations 2.2 GB), more than 90% of the 80.0 GB it has: it would fit with LoRA (--lora 16: about "
        "20.8 GB) or FSDP or ZeRO-3 over 2 GPUs (about 48.4 GB each)")
    assert refusal(qwen3("4B", torch.bfloat16), StagePlan(**ON_A_GPU, lora=16)) is None  # LoRA: bf16 base
    assert refusal(four_b, StagePlan(**ON_A_GPU, shards=8)) is None


def test_the_numbers_of_the_table_in_docs_training():
    """The numbers of docs/training.md's table, as `stage_memory` gives them (GB per GPU)."""
    table = {}
    for size in QWEN3:
        for lora in (0, 16):
            model = qwen3(size, torch.bfloat16 if lora else torch.float32)
            table[size, lora] = [round(stage_memory(model, StagePlan(**ON_A_GPU, lora=lora, shards=n,
                                                                     vllm_share=share)).total / GB, 1)
                                 for n in (1, 8) for share in (0.0, 0.3)]
    assert table == {("0.6B", 0): [21.4, 45.4, 12.1, 36.1], ("0.6B", 16): [12.1, 36.1, 10.9, 34.9],
                     ("4B", 0): [84.6, 108.6, 21.2, 45.2], ("4B", 16): [20.8, 44.8, 13.3, 37.3]}


def test_a_stage_that_cannot_fit_fails_before_it_builds_a_trainer(empty_lab: Engine, tmp_path: Path, monkeypatch):
    policy = build_tiny(0, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                        num_key_value_heads=2, head_dim=32)
    args = StageArgs(run_id=1, stage_index=1, seed=0, policy="", config=EnvConfig.default(sizes=(3,), num_instances=4),
                     run_dir=tmp_path / "run", run_uuid="u")
    monkeypatch.setattr("training.memory.device_memory", lambda gpu: 20 * 10**6)  # a machine of 20 MB

    def never(*a, **k):
        raise AssertionError("a stage that cannot fit must not build its trainer")

    monkeypatch.setattr("training.stage.GRPOTrainer", never)
    with pytest.raises(StageError) as refused:
        train(empty_lab, args, policy, {"max_steps": 1}, lambda *a, **k: False)
    assert str(refused.value) == (
        "stage 1 of run 1 needs about 42 MB per process (weights 1 MB, gradients 1 MB, optimizer 1 MB, logits 19 MB, "
        "activations 20 MB), more than 90% of the 20 MB it has: it would fit with --completion-length 3 (about 17 MB) "
        "or --grpo per_device_train_batch_size=8 (about 12 MB)")
