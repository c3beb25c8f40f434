"""A stage's memory estimate, in exact numbers for the models this lab trains, and the stage refusing one that cannot
fit with the line that says what would.

The models are built on the meta device from their published shapes (no weights, nothing downloaded), so their
parameter counts and layers are the real ones.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from sqlalchemy import Engine
from sqlmodel import select
from transformers import AutoModelForCausalLM, Gemma3TextConfig

from envsim.config import EnvConfig
from envsim.generator import generate
from storage.settings import RunSettings
from training.evaluate import answer_budget
from training.memory import (
    CHAT_ON_80_GB,
    GB,
    StagePlan,
    fsdp_needed,
    head_tile,
    launched,
    logits_memory,
    markdown,
    plan_of,
    qwen3,
    refusal,
    stage_memory,
    table,
)
from training.policy import build_tiny, load_policy
from training.stage import StageArgs, StageError, grpo_config, train

GIB_24 = 24 * 2**30  # this machine
GEMMA_270M = Gemma3TextConfig(vocab_size=262_144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=256, tie_word_embeddings=True)
GEMMA_LONGEST_PROMPT = 511  # tokens of the longest chat prompt of sizes 3..10 in Gemma's tokenizer
# the stage's defaults for a chat policy on a GPU of 80 GB (`grpo_config`): batches of 8 completions, bf16 autocast,
# activation checkpointing; a prompt of 512 tokens and the chat budget of 512 (less what a test sets)
ON_A_GPU = {k: v for k, v in dataclasses.asdict(CHAT_ON_80_GB).items()
            if k not in ("lora", "shards", "vllm_share", "vllm_sleeps", "reference")}

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def meta(config, dtype: torch.dtype = torch.float32):
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def test_gemmas_logits_are_one_tile_of_trls_fused_head_not_the_whole_batch():
    """`envlab run --policy gemma3-270m --lora 8` at completion length 512 was killed by the kernel at 23.5 GB, when the
    estimate counted whole logits (17.2 GB). TRL 1.16 scores tokens through a fused LM head, one tile of 4,096 tokens
    by 32,768 columns at a time: 10 float32 tiles at its peak on a CPU, one bf16 tile on a GPU, whatever the batch."""
    assert head_tile() == (4096, 32768)
    gemma = meta(GEMMA_270M)
    plan = StagePlan(device_bytes=GIB_24, batch=8, generations=4, prompt=GEMMA_LONGEST_PROMPT, completion=512, lora=8)
    assert logits_memory(plan, 262_144, 640, None) == 2 * 8 * (511 + 512) * 262_144 * 4  # a TRL without the head
    assert stage_memory(gemma, plan).logits == 10 * 4096 * 32768 * 4  # 5.4 GB, not 17.2
    assert stage_memory(gemma, dataclasses.replace(plan, batch=32)).logits == 10 * 4096 * 32768 * 4
    on_a_gpu = StagePlan(**ON_A_GPU, lora=8)
    assert stage_memory(meta(GEMMA_270M, torch.bfloat16), on_a_gpu).logits == 4096 * 32768 * 2  # 268 MB
    # a full fine-tune also holds its head's float32 gradient whole (the fused head accumulates it)
    assert stage_memory(gemma, dataclasses.replace(plan, lora=0)).logits == 10 * 4096 * 32768 * 4 + 4 * 262_144 * 640
    # the issue's stage (no activation checkpointing, 512 new tokens) was killed at 23.5 GB: refused, naming what fits
    assert refusal(gemma, plan) == (
        "needs about 22.6 GB per process (runtime 1.0 GB, weights 1.1 GB, logits 5.4 GB, activations 15.1 GB), more "
        "than 80% of the 25.8 GB it has: it would fit with --grpo activation_checkpointing=true (about 7.8 GB) or "
        "--completion-length 256 (about 18.8 GB) or --grpo per_device_train_batch_size=4 (about 15.0 GB)")
    assert refusal(gemma, dataclasses.replace(plan, checkpointing=True)) is None  # the chat default now: 7.8 GB
    assert refusal(gemma, dataclasses.replace(plan, completion=4096, checkpointing=True)) is None  # 9.2 GB
    assert refusal(gemma, dataclasses.replace(plan, completion=4096)).endswith(
        "it would fit with --grpo activation_checkpointing=true (about 9.2 GB) or --completion-length 256 (about "
        "18.8 GB) or --grpo per_device_train_batch_size=1 --grpo num_generations=1 (about 16.0 GB)")


def test_gemmas_float32_activations_are_the_counts_measured_on_its_layers():
    """In float32 (a CPU's stage) Gemma 3's layers keep 33 values per token, layer and hidden unit for the backward,
    40 with LoRA (its dropout copies), as autograd's saved-tensor hooks measured them, not Korthikanti's 17; under
    activation checkpointing each layer's input, and one layer recomputed only where it holds more than the head's
    tiles freed before it (on a CPU never for Gemma: 0.3 GB against 5.4); on a CPU the process itself besides."""
    gemma = meta(GEMMA_270M)
    plan = StagePlan(device_bytes=GIB_24, batch=8, generations=4, prompt=389, completion=128, lora=8)
    tokens = 8 * (389 + 128)
    assert stage_memory(gemma, plan).activations == tokens * 640 * 40 * 18 * 4
    assert stage_memory(gemma, dataclasses.replace(plan, lora=0)).activations == tokens * 640 * 33 * 18 * 4
    assert stage_memory(gemma, dataclasses.replace(plan, checkpointing=True)).activations == tokens * 640 * 18 * 4
    # a layer that outgrows the tiles (a head of 1,024 columns: one tile of 4,096 x 1,024 tokens, 168 MB) adds the rest
    small_head = meta(Gemma3TextConfig(**{**GEMMA_270M.to_dict(), "vocab_size": 1024}))
    assert stage_memory(small_head, dataclasses.replace(plan, checkpointing=True)).activations == \
        tokens * 640 * 18 * 4 + tokens * 640 * 40 * 4 - 10 * 4096 * 1024 * 4
    assert stage_memory(gemma, plan).runtime == 10**9
    assert stage_memory(meta(GEMMA_270M, torch.bfloat16), StagePlan(**ON_A_GPU, lora=8)).runtime == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="reads the stage's CPU settings")
def test_the_plan_is_read_from_the_stages_own_config_on_a_cpu(tmp_path: Path):
    args = StageArgs(run_id=1, stage_index=1, seed=0, policy="", config=EnvConfig.default(), run_dir=tmp_path,
                     run_uuid="u", settings=RunSettings(stages=1, lora=8))
    plan = plan_of(grpo_config(args, {}, 512, "chat"), lora=8, prompt=GEMMA_LONGEST_PROMPT, device_bytes=GIB_24)
    # a chat policy checkpoints its activations on a CPU too (the stage's default: docs/training.md's measured peaks)
    assert plan == StagePlan(device_bytes=GIB_24, batch=8, generations=4, prompt=511, completion=512, lora=8,
                             checkpointing=True)
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
    assert stage_memory(policy.model, plan).total < 2 * GB and refusal(policy.model, plan) is None


def test_a_4b_full_fine_tune_on_one_80_gb_gpu_is_refused_naming_lora_and_fsdp():
    four_b = qwen3("4B")
    assert sum(p.numel() for p in four_b.parameters()) == 4_022_468_096
    assert refusal(four_b, StagePlan(**ON_A_GPU)) == (
        "needs about 76.2 GB per GPU (weights 16.1 GB, autocast 8.0 GB, gradients 16.1 GB, optimizer 32.2 GB, logits "
        "1.8 GB, activations 2.0 GB), more than 90% of the 80.0 GB it has: it would fit with LoRA (--lora 16: about "
        "26.9 GB) or --processes 2 (FSDP over 2 GPUs: about 40.0 GB each)")  # LoRA on a float32 model: stage 2's base
    # already sharded over 8: a refusal names only more GPUs than it has
    assert refusal(four_b, StagePlan(**{**ON_A_GPU, "vllm_share": 0.9}, shards=8)).endswith(
        "nothing short of a larger device fits")
    assert refusal(qwen3("4B", torch.bfloat16), StagePlan(**ON_A_GPU, lora=16)) is None  # LoRA: bf16 base
    # from stage 2 LoRA's base is a trained stage's float32 checkpoint, cast to bf16 under autocast besides
    bf16_base, float32_base = (stage_memory(qwen3("4B", dtype), StagePlan(**ON_A_GPU, lora=16))
                               for dtype in (torch.bfloat16, torch.float32))
    assert (float32_base.weights - bf16_base.weights, float32_base.autocast, bf16_base.autocast) == (
        2 * 4_022_468_096, 2 * 4_022_468_096, 0)
    assert refusal(four_b, StagePlan(**ON_A_GPU, shards=8)) is None


@pytest.mark.parametrize(("size", "lora", "gpus", "expected"), [
    ("0.6B", 0, 1, (False, "full fine-tune of 0.6B on 1 GPU: 12.1 GB: one process")),
    ("0.6B", 0, 8, (False, "full fine-tune of 0.6B on 8 GPUs: 12.1 GB each unsharded: DDP")),
    ("0.6B", 16, 1, (False, "LoRA 16 of 0.6B on 1 GPU: 2.1 GB: one process")),
    ("0.6B", 16, 8, (False, "LoRA 16 of 0.6B on 8 GPUs: 2.1 GB each: DDP")),
    ("4B", 0, 1, (False, "full fine-tune of 4.0B on 1 GPU: 76.2 GB: one process")),
    ("4B", 0, 8, (True, "full fine-tune of 4.0B on 8 GPUs: 76.2 GB each unsharded, 12.8 GB with FSDP: using FSDP")),
    ("4B", 16, 1, (False, "LoRA 16 of 4.0B on 1 GPU: 10.8 GB: one process")),
    ("4B", 16, 8, (False, "LoRA 16 of 4.0B on 8 GPUs: 10.8 GB each: DDP")),
])
def test_fsdp_only_for_a_full_fine_tune_that_does_not_fit_a_gpu_unsharded(size, lora, gpus, expected):
    model = qwen3(size, torch.bfloat16 if lora else torch.float32)
    assert fsdp_needed(model, dataclasses.replace(CHAT_ON_80_GB, lora=lora), gpus) == expected


def test_a_run_of_n_processes_is_checked_per_process_as_the_worker_launches_them():
    """A stage launched on N processes, one per GPU: a full fine-tune of 4B fits no 80 GB GPU whole, so on two it is
    launched under FSDP and fits there (its run is made, not refused as one GPU's); LoRA and what fits whole keep DDP,
    each process with the whole model, as on one GPU."""
    four_b = qwen3("4B")
    plan = StagePlan(**ON_A_GPU)
    assert refusal(four_b, launched(four_b, plan, 1)) is not None
    assert launched(four_b, plan, 2) == dataclasses.replace(plan, shards=2)
    assert refusal(four_b, launched(four_b, plan, 2)) is None
    lora = dataclasses.replace(plan, lora=16)
    assert launched(qwen3("4B", torch.bfloat16), lora, 8) == lora
    assert launched(qwen3("0.6B"), plan, 8) == plan


def test_a_run_of_n_processes_on_a_cpu_is_checked_against_its_share_of_the_machine(
        empty_lab: Engine, tmp_path: Path, monkeypatch):
    """On a CPU (two processes under gloo stand in for two GPUs) a launch's processes share the machine's memory: a
    Gemma-shaped LoRA run that fits one process of a 24 GiB machine is refused at four, each with a quarter."""
    from lab.loop import LoopError, create_run
    from storage.db import session

    folder = tmp_path / "gemma-shaped"
    GEMMA_270M.save_pretrained(folder)
    monkeypatch.setattr("training.memory.CGROUP_LIMIT", tmp_path / "no-cgroup-limit")
    monkeypatch.setattr("os.sysconf", lambda name: {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": GIB_24 // 4096}[name])
    with session(empty_lab) as s:
        with pytest.raises(LoopError) as refused:
            create_run(s, name="four", config=EnvConfig.default(), policy=str(folder),
                       settings=RunSettings(stages=1, lora=8, processes=4))
        assert str(refused.value) == (
            f"{folder}: a stage needs about 7.8 GB per process (runtime 1.0 GB, weights 1.1 GB, logits 5.4 GB, "
            "activations 0.4 GB), more than 80% of the 6.4 GB it has: it would fit with --grpo "
            "per_device_train_batch_size=2 --grpo num_generations=2 (about 4.9 GB)")
        assert create_run(s, name="one", config=EnvConfig.default(), policy=str(folder),
                          settings=RunSettings(stages=1, lora=8)).id is not None


def test_the_numbers_of_the_table_in_docs_training():
    """The numbers of docs/training.md's table (`python -m training.memory --table`), in GB per GPU, and the table
    as the docs show it."""
    rows = {(r["policy"], r["training"]): [round(r[k] / GB, 1) for k in ("1 GPU", "FSDP", "1 GPU vllm")]
            + [(r[k][0], round(r[k][1] / GB, 1)) for k in ("launched", "launched vllm")] for r in table()}
    assert rows == {
        ("Qwen3-0.6B", "full"): [12.1, 2.7, 31.2, ("DDP", 12.1), ("DDP", 31.2)],
        ("Qwen3-0.6B", "LoRA"): [2.1, 0.9, 25.3, ("DDP", 2.1), ("DDP", 25.3)],
        ("Qwen3-4B", "full"): [76.2, 12.8, 76.2, ("FSDP", 12.8), ("FSDP", 30.0)],
        ("Qwen3-4B", "LoRA"): [10.8, 3.3, 32.4, ("DDP", 10.8), ("DDP", 32.4)]}
    docs = (Path(__file__).resolve().parents[2] / "docs" / "training.md").read_text()
    assert markdown(table()) in docs


def test_a_stage_that_cannot_fit_fails_before_it_builds_a_trainer(empty_lab: Engine, tmp_path: Path, monkeypatch):
    policy = build_tiny(0, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                        num_key_value_heads=2, head_dim=32)
    args = StageArgs(run_id=1, stage_index=1, seed=0, policy="", config=EnvConfig.default(sizes=(3,), num_instances=4),
                     run_dir=tmp_path / "run", run_uuid="u", settings=RunSettings(stages=1, grpo={"max_steps": 1}))
    monkeypatch.setattr("training.memory.device_memory", lambda gpu, processes=None: 13 * 10**8)  # a machine of 1.3 GB

    def never(*a, **k):
        raise AssertionError("a stage that cannot fit must not build its trainer")

    monkeypatch.setattr("training.stage.Trainer", never)
    with pytest.raises(StageError) as refused:
        train(empty_lab, args, policy, lambda *a, **k: False)
    assert str(refused.value) == (
        "stage 1 of run 1 needs about 1.1 GB per process (runtime 1.0 GB, logits 98 MB, activations 39 MB), more than "
        "80% of the 1.3 GB it has: it would fit with --grpo per_device_train_batch_size=8 (about 1.0 GB)")


def test_a_run_whose_stage_cannot_fit_is_refused_when_it_is_made(empty_lab: Engine, tmp_path: Path, monkeypatch):
    """The issue's run (Gemma 270M, LoRA 8, 512 new tokens) without activation checkpointing was killed by the kernel
    about 14 minutes in, after stage 0 and a proposal: such a run is now refused before it is stored, in one line
    naming a setting that fits; at the chat defaults (which checkpoint) it is made."""
    from lab.loop import LoopError, create_run
    from storage.db import session
    from storage.models import Run

    folder = tmp_path / "gemma-shaped"
    GEMMA_270M.save_pretrained(folder)  # its architecture only: the check reads no weight
    monkeypatch.setattr("training.memory.device_memory", lambda gpu, processes=None: GIB_24)
    issue = RunSettings(stages=1, lora=8, grpo={"max_steps": 2, "activation_checkpointing": False})
    with session(empty_lab) as s:
        with pytest.raises(LoopError) as refused:
            create_run(s, name="killed", config=EnvConfig.default(), settings=issue, policy=str(folder))
        assert str(refused.value) == (
            f"{folder}: a stage needs about 22.6 GB per process (runtime 1.0 GB, weights 1.1 GB, logits 5.4 GB, "
            "activations 15.1 GB), more than 80% of the 25.8 GB it has: it would fit with --grpo "
            "activation_checkpointing=true (about 7.8 GB) or --completion-length 256 (about 18.8 GB) or --grpo "
            "per_device_train_batch_size=4 (about 15.0 GB)")
        assert s.exec(select(Run)).first() is None
        run = create_run(s, name="fits", config=EnvConfig.default(), settings=RunSettings(stages=1, lora=8),
                         policy=str(folder))
        assert run.id is not None


def test_a_reference_model_is_counted_where_beta_is_above_zero_a_full_copy_unless_lora():
    """TRL keeps a reference model where `beta` > 0: for a full fine-tune a copy of the policy in its float32, 16.1 GB
    for 4B, whole on each GPU under DDP and split as the policy under FSDP; with LoRA the base with its adapters
    disabled, no copy."""
    four_b = qwen3("4B")
    with_kl = StagePlan(**ON_A_GPU, reference=True)
    assert stage_memory(four_b, with_kl).reference == 4 * 4_022_468_096
    assert stage_memory(four_b, with_kl).total == stage_memory(four_b, StagePlan(**ON_A_GPU)).total + 4 * 4_022_468_096
    assert refusal(four_b, with_kl) == (
        "needs about 92.3 GB per GPU (weights 16.1 GB, reference 16.1 GB, autocast 8.0 GB, gradients 16.1 GB, "
        "optimizer 32.2 GB, logits 1.8 GB, activations 2.0 GB), more than 90% of the 80.0 GB it has: it would fit "
        "with LoRA (--lora 16: about 26.9 GB) or --processes 2 (FSDP over 2 GPUs: about 48.0 GB each)")
    assert stage_memory(four_b, dataclasses.replace(with_kl, shards=8)).reference == 4 * 4_022_468_096 // 8
    assert stage_memory(qwen3("4B", torch.bfloat16), dataclasses.replace(with_kl, lora=16)).reference == 0


def test_a_sleeping_colocated_vllm_is_not_counted_in_the_backward_only_while_it_generates():
    """A colocated vLLM engine that sleeps between generations (the lab's default) has freed its share by the
    backward; while it generates, the trainer holds its weights, reference and AdamW's states beside it."""
    four_b = qwen3("4B")
    awake = StagePlan(**ON_A_GPU, vllm_share=0.3, shards=8)
    sleeps = dataclasses.replace(awake, vllm_sleeps=True)
    assert stage_memory(four_b, awake).vllm == 24 * 10**9 and stage_memory(four_b, awake).generating == 0
    assert stage_memory(four_b, awake).total == 36_829_358_976
    asleep = stage_memory(four_b, sleeps)
    assert (asleep.vllm, asleep.step) == (0, 36_829_358_976 - 24 * 10**9)
    assert asleep.generating == 4 * 4_022_468_096 // 8 + 8 * 4_022_468_096 // 8 + 24 * 10**9  # weights, AdamW, vLLM
    assert asleep.total == asleep.generating == 30_033_702_144
    with_kl = stage_memory(four_b, dataclasses.replace(sleeps, reference=True))
    assert with_kl.generating == asleep.generating + 4 * 4_022_468_096 // 8
    assert refusal(four_b, dataclasses.replace(sleeps, vllm_share=0.9)) == (
        "needs about 78.0 GB per GPU (weights 2.0 GB, autocast 1.0 GB, gradients 2.0 GB, optimizer 4.0 GB, logits "
        "1.8 GB, activations 2.0 GB; 78.0 GB while vLLM generates), more than 90% of the 80.0 GB it has: nothing "
        "short of a larger device fits")


def test_the_plan_reads_beta_and_vllms_sleep_mode_from_trls_config():
    from trl import GRPOConfig

    base = dict(output_dir="unused", use_cpu=True, per_device_train_batch_size=8, num_generations=4)
    plain = plan_of(GRPOConfig(**base), lora=0, prompt=100, device_bytes=GIB_24)
    assert (plain.reference, plain.vllm_sleeps) == (False, False)
    kl = plan_of(GRPOConfig(**base, beta=0.04, use_vllm=True, vllm_mode="colocate", vllm_enable_sleep_mode=True),
                 lora=0, prompt=100, device_bytes=GIB_24)
    assert (kl.reference, kl.vllm_share, kl.vllm_sleeps) == (True, 0.3, True)
    server = plan_of(GRPOConfig(**base, use_vllm=True, vllm_mode="server", vllm_enable_sleep_mode=True),
                     lora=0, prompt=100, device_bytes=GIB_24)
    assert (server.vllm_share, server.vllm_sleeps) == (0.0, False)  # a server's GPUs are its own


def test_under_fsdps_own_activation_checkpointing_the_trainers_is_off_and_the_estimate_still_counts_it(
        tmp_path: Path, monkeypatch):
    """The lab's fsdp.yaml checkpoints activations with FSDP's units: the stage's `GRPOConfig` turns its own off (the
    trainer's would gather each layer again to recompute it; transformers refuses both), even where the run set it,
    and the estimate counts the checkpointing FSDP does."""
    args = StageArgs(run_id=1, stage_index=1, seed=0, policy="", config=EnvConfig.default(), run_dir=tmp_path,
                     run_uuid="u", settings=RunSettings(stages=1))
    assert grpo_config(args, {}, 512, "chat").activation_checkpointing is True  # the chat default, no FSDP
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_ACTIVATION_CHECKPOINTING", "true")
    for overrides in ({}, {"activation_checkpointing": True}):
        config = grpo_config(args, overrides, 512, "chat")
        assert config.activation_checkpointing is False and config.gradient_checkpointing is False
        assert plan_of(config, lora=0, prompt=511, device_bytes=GIB_24).checkpointing is True


FREED = """
import ctypes, os, sys
from training import memory
if sys.argv[1] == "fixed":
    assert memory.return_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes, libc.memset.argtypes = [ctypes.c_void_p], [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
MB = 1 << 20
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
big = libc.malloc(30 * MB)
libc.memset(big, 1, 30 * MB)
libc.free(big)  # glibc raises its threshold for blocks of their own to 30 MB here, unless it is fixed
blocks = [libc.malloc(20 * MB) for _ in range(40)]
for block in blocks:
    libc.memset(block, 1, 20 * MB)
before = rss()
for block in blocks[::2]:  # every other block: free space between blocks in use
    libc.free(block)
print(before - rss())
"""


@pytest.mark.parametrize("allocator", ["default", "fixed"])
def test_a_cpu_stages_allocator_gives_freed_blocks_back(allocator):
    """20 blocks of 20 MB freed between blocks still in use, after a block of 30 MB was freed: glibc's malloc as it
    starts keeps them all resident in its heap (its threshold rose to 30 MB); with the threshold a CPU stage fixes
    (`return_freed_memory`, 1 MiB) each had pages of its own, and all 400 MB go back to the kernel."""
    done = subprocess.run([sys.executable, "-c", FREED, allocator], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[2])
    returned = int(done.stdout)
    if allocator == "fixed":
        assert returned >= 0.99 * 400 * 2**20
    else:
        assert returned <= 0.01 * 400 * 2**20
