"""A stage's peak memory per device, estimated before it trains: a stage that cannot fit fails at once with one
line that says what would fit, instead of being killed in its first GRPO step by the kernel (a CPU) or by CUDA.

Why it is needed: `envlab run --policy gemma3-270m --lora 8` at the chat defaults (completion length 512, batches
of 8 completions) was killed by the kernel at 23.5 GB on a 24 GiB machine in its first step. LoRA kept the weights
small; Gemma 3's vocabulary of 262,144 tokens did not keep the logits small.

What a GRPO step holds at its peak, per device, in bytes (`StageMemory`):
- weights: a full fine-tune's float32 master weights (`training.stage.start_policy` loads them so); LoRA's frozen
  base in bf16 under bf16 autocast (as loaded on a GPU), else as loaded, plus its adapters in float32;
- autocast: under bf16 autocast a full fine-tune's forward keeps a bf16 copy of every weight for its backward;
- gradients and optimizer: 4 bytes per trained parameter, and AdamW's two float32 states (8 bytes); LoRA trains
  only its adapters (rank r on every linear layer but the output layer, peft's "all-linear");
- vllm: a colocated vLLM engine's share of the GPU (`vllm_gpu_memory_utilization`);
- logits: `per_device_train_batch_size` sequences of prompt + completion tokens over the vocabulary in float32,
  twice (the log-softmax and its gradient);
- activations, roughly: 17 values per token, layer and hidden unit kept for the backward (Korthikanti et al. 2022,
  with fused attention), or, under activation checkpointing, each layer's input plus one layer recomputed.
FSDP or ZeRO-3 over N processes splits weights, autocast copies, gradients and optimizer N ways; DDP (accelerate's
default) copies them to every GPU. Generation is left out: a step's peak is its loss and backward. A stage is
refused above `HEADROOM` of its device: the CUDA context, the allocator's fragmentation, and on a CPU the system
and the worker itself need the rest.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

HEADROOM = 0.9  # the share of a device a stage may plan to use
LORA_RANK = 16  # the rank a refusal suggests (docs/training.md)
ACTIVATIONS_PER_UNIT = 17  # values kept per token, layer and hidden unit without checkpointing (34 bytes in bf16)
GB = 1e9
CGROUP_LIMIT = Path("/sys/fs/cgroup/memory.max")  # a Slurm job's or a container's limit (cgroup v2)


@dataclass(frozen=True)
class StagePlan:
    """What a stage's memory depends on besides its model (`plan_of` reads it from TRL's config)."""

    device_bytes: int  # one device: a GPU's memory, or on a CPU the machine's share per process
    batch: int  # per_device_train_batch_size: the completions one loss step scores
    generations: int  # num_generations (a smaller batch may need fewer)
    prompt: int  # tokens of the longest prompt
    completion: int  # max_completion_length
    lora: int = 0  # LoRA rank; 0: every weight trains
    bf16: bool = False  # bf16 autocast (GRPOConfig's bf16)
    checkpointing: bool = False  # activation checkpointing
    vllm_share: float = 0.0  # a colocated vLLM engine's share of the device
    shards: int = 1  # processes FSDP or ZeRO-3 splits the trained state over (1: none, as under DDP)
    gpu: bool = False


@dataclass(frozen=True)
class StageMemory:
    """A stage's peak memory per device, by part, in bytes."""

    weights: int
    autocast: int
    gradients: int
    optimizer: int
    vllm: int
    logits: int
    activations: int

    @property
    def total(self) -> int:
        return sum(dataclasses.astuple(self))

    def parts(self) -> str:
        """The parts of 1% of the total or more, e.g. `weights 16.1 GB, gradients 16.1 GB, ...`."""
        return ", ".join(f"{f.name} {size(getattr(self, f.name))}" for f in dataclasses.fields(self)
                         if getattr(self, f.name) >= self.total / 100)


def size(n: float) -> str:
    """Bytes for people: GB to one decimal, MB below a tenth of a GB."""
    return f"{n / GB:.1f} GB" if n >= GB / 10 else f"{n / 1e6:.0f} MB"


def lora_parameters(model: Any, rank: int) -> int:
    """The parameters of rank-`rank` adapters on every linear layer but the output layer (peft's "all-linear")."""
    output = model.get_output_embeddings()
    return sum(rank * (m.in_features + m.out_features) for m in model.modules()
               if isinstance(m, torch.nn.Linear) and m is not output)


def stage_memory(model: Any, plan: StagePlan) -> StageMemory:
    """The peak memory per device of a GRPO stage of `model` (as loaded for training; a model on the meta device
    will do) under `plan`: the parts of the module docstring."""
    config = model.config.get_text_config()
    params = list(model.parameters())
    count = sum(p.numel() for p in params)
    trained = lora_parameters(model, plan.lora) if plan.lora else count
    if plan.lora:  # the frozen base in bf16 where the stage trains under bf16 (as `start_policy` loads it on a GPU)
        weights = (2 * count if plan.bf16 else sum(p.numel() * p.element_size() for p in params)) + 4 * trained
    else:  # float32 master weights
        weights = 4 * count
    autocast = 2 * count if plan.bf16 and not plan.lora else 0
    tokens = plan.batch * (plan.prompt + plan.completion)
    per_value = 2 if plan.bf16 else params[0].element_size()
    layers = config.num_hidden_layers
    kept = layers + ACTIVATIONS_PER_UNIT if plan.checkpointing else ACTIVATIONS_PER_UNIT * layers
    return StageMemory(
        weights=weights // plan.shards, autocast=autocast // plan.shards, gradients=4 * trained // plan.shards,
        optimizer=8 * trained // plan.shards, vllm=int(plan.vllm_share * plan.device_bytes) if plan.gpu else 0,
        logits=2 * tokens * config.vocab_size * 4, activations=tokens * config.hidden_size * kept * per_value)


def refusal(model: Any, plan: StagePlan) -> str | None:
    """None where the stage fits in `HEADROOM` of its device; else one line: what it needs, by part, and the
    changes that would make it fit (LoRA, FSDP or ZeRO-3 over more GPUs, a shorter completion, fewer completions
    a step), each with its own estimate."""
    usable = HEADROOM * plan.device_bytes
    need = stage_memory(model, plan)
    if need.total <= usable:
        return None

    def first(changes: Iterable[tuple[int, StagePlan]]) -> tuple[int, str] | None:
        """The first (setting, plan) that fits, with its estimate."""
        for setting, changed in changes:
            if (total := stage_memory(model, changed).total) <= usable:
                return setting, size(total)
        return None

    replace = dataclasses.replace
    options = []
    if not plan.lora and (found := first([(LORA_RANK, replace(plan, lora=LORA_RANK))])):
        options.append(f"LoRA (--lora {LORA_RANK}: about {found[1]})")
    if plan.gpu and (found := first((n, replace(plan, shards=n)) for n in (2, 4, 8))):
        options.append(f"FSDP or ZeRO-3 over {found[0]} GPUs (about {found[1]} each)")
    if found := first((c, replace(plan, completion=c)) for c in _halves(plan.completion)):
        options.append(f"--completion-length {found[0]} (about {found[1]})")
    if found := first((b, replace(plan, batch=b)) for b in _halves(plan.batch)):
        generations = f" --grpo num_generations={found[0]}" if plan.generations > found[0] else ""
        options.append(f"--grpo per_device_train_batch_size={found[0]}{generations} (about {found[1]})")
    fix = "it would fit with " + " or ".join(options) if options else "nothing short of a larger device fits"
    return (f"needs about {size(need.total)} per {'GPU' if plan.gpu else 'process'} ({need.parts()}), more than "
            f"{HEADROOM:.0%} of the {size(plan.device_bytes)} it has: {fix}")


def _halves(n: int) -> list[int]:
    """n/2, n/4, ... down to 1: the smaller settings a refusal tries, largest first."""
    out = []
    while n > 1:
        n //= 2
        out.append(n)
    return out


def plan_of(config: Any, *, lora: int, prompt: int, device_bytes: int | None = None) -> StagePlan:
    """The plan of a stage with TRL's `config` (a `GRPOConfig`), LoRA rank `lora` and prompts of up to `prompt`
    tokens, on this process's device (`device_memory`) unless `device_bytes` says otherwise."""
    gpu = not config.use_cpu and torch.cuda.is_available()
    colocated = config.use_vllm and config.vllm_mode == "colocate"
    sharded = bool(getattr(config, "fsdp", None)) or os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true" \
        or os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE") == "3"
    return StagePlan(
        device_bytes=device_bytes or device_memory(gpu), batch=config.per_device_train_batch_size,
        generations=config.num_generations, prompt=prompt, completion=config.max_completion_length, lora=lora,
        bf16=bool(config.bf16),
        checkpointing=bool(getattr(config, "activation_checkpointing", None) or config.gradient_checkpointing),
        vllm_share=config.vllm_gpu_memory_utilization if colocated else 0.0,
        shards=config.world_size if sharded else 1, gpu=gpu)


def device_memory(gpu: bool) -> int:
    """This process's device memory: its GPU's; on a CPU the machine's (or its cgroup's limit, where lower: a Slurm
    job or a container is killed there), shared by the processes of this machine (`LOCAL_WORLD_SIZE`)."""
    if gpu:
        return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    with contextlib.suppress(OSError, ValueError):  # no cgroup v2 limit here ("max", or no such file)
        machine = min(machine, int(CGROUP_LIMIT.read_text()))
    return machine // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
