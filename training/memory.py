"""A stage's peak memory per device, estimated before it trains: a stage that cannot fit is refused when its run is
created (`training.stage.memory_refusal`) and again before its trainer is built, with one line that says what would
fit, instead of being killed in its first GRPO step by the kernel (a CPU) or by CUDA.

Why it is needed: `envlab run --policy gemma3-270m --lora 8` at the chat defaults (completion length 512, batches
of 8 completions) was killed by the kernel on a 24 GiB machine in its first step, twice, while the estimate said
12.9 GB. Measured (`benchmarks/bench_memory.py`, docs/training.md): the activations the backward keeps were 2.3 times
what the estimate counted (Gemma 3's layers keep about 40 float32 values per token, layer and hidden unit with LoRA,
not 17), and the process itself (Python, torch, transformers, TRL, the tokenizer) was not counted at all. A chat
policy's stage now checkpoints its activations on a CPU too (`training.stage.grpo_config`). A real stage at those
defaults then peaked at 11.9 GB in its second step, a third of it free heap glibc kept (the allocator, below): a CPU
stage now has freed blocks given back, and the estimate is of what a stage uses (docs/training.md: estimate against
measured peak at 128, 256 and 512 new tokens).

What a GRPO step holds at its peak, per device, in bytes (`StageMemory`):
- runtime: on a CPU the process itself (`CPU_RUNTIME`, measured); on a GPU nothing (its CUDA context is `HEADROOM`'s);
- weights: a full fine-tune's float32 master weights (`training.stage.start_policy` loads them so); LoRA's frozen
  base as loaded (the run's policy in bf16 on a GPU at stage 1; from stage 2 a trained stage's float32 checkpoint,
  so that no stage's learning rounds away), plus its adapters in float32;
- reference: TRL's reference model where `beta` > 0, a full copy of the policy in its dtype (a full fine-tune's
  float32; split N ways under FSDP or ZeRO-3 as the policy is, whole on each GPU under DDP); none with LoRA, whose
  reference is its base with the adapters disabled;
- autocast: under bf16 autocast the forward keeps a bf16 copy of every float32 weight for its backward;
- gradients and optimizer: 4 bytes per trained parameter, and AdamW's two float32 states (8 bytes); LoRA trains
  only its adapters (rank r on every linear layer but the output layer, peft's "all-linear");
- vllm: a colocated vLLM engine's share of the GPU (`vllm_gpu_memory_utilization`), unless it sleeps between
  generations (`vllm_enable_sleep_mode`, the lab's default): then its share is free for the backward, and held only
  while it generates, beside the weights, the reference and the optimizer's states (gradients are freed by then):
  `generating`, the stage's peak where that is larger than the step's;
- logits: TRL 1.16 scores tokens through a fused LM head (`trl.trainer.utils.add_fused_lm_head`) that never
  holds a batch's logits, only one tile of at most 4,096 tokens by 32,768 vocabulary columns at a time (`head_tile`):
  on a GPU one tile in the compute dtype (its Triton kernels keep the rest in registers) and only the completion's
  tokens; on a CPU every position, and the torch fold of forward and backward holds `CPU_TILE_COPIES` float32
  tiles at its peak (measured). Where the head trains (a full fine-tune), its backward also accumulates the head's
  gradient in float32 before it joins the weight's. A TRL without that head holds `per_device_train_batch_size`
  sequences of prompt + completion tokens over the vocabulary in float32, twice (the log-softmax and its gradient);
- activations: the values each layer keeps per token and hidden unit for the backward: in float32 (no autocast, a
  CPU's stage) as measured with autograd's saved-tensor hooks on Gemma 3's layers (`FLOAT32_PER_UNIT`: its four
  norms and their float32 copies, q/k norms, GELU's inputs, and with LoRA each adapter's dropout copy of its input);
  under bf16 autocast (unmeasured: no GPU here) Korthikanti et al.'s 17 (34 bytes). The head's backward runs
  first, while every layer's saved values are still held, so without checkpointing its scores and all the layers'
  activations add up. Under activation checkpointing only each layer's input is held then; the layer recomputed
  after the head's scores are freed adds to the peak only what it holds beyond them (for Gemma 270M on a CPU,
  nothing: 0.8 GB a layer against 5.4 GB of tiles);
- the allocator: none. glibc's malloc would keep up to a third of a CPU stage's peak as free heap (measured: 3.4 of
  10.2 GB for Gemma 270M at 512 new tokens): it raises the size above which a block gets pages of its own to the
  largest block freed (up to 32 MiB), and serves blocks below it from heaps it seldom gives back. A CPU stage fixes
  that size at `MMAP_THRESHOLD` (`return_freed_memory`), and then holds what it uses (6.8 GB there).
FSDP or ZeRO-3 over N processes splits weights, autocast copies, gradients and optimizer N ways; DDP (accelerate's
default) copies them to every GPU. A worker of several GPUs launches a full fine-tune under FSDP where DDP would not
fit and FSDP would (`fsdp_needed`, the lab's `assets/accelerate/fsdp.yaml`); everything else keeps DDP.
Generation is left out: it holds the weights, a KV cache and one token's logits a step, far below the step's peak
(measured: Gemma 270M at 2.2 GB while it sampled 8 completions of 128 tokens, 8.4 GB in the step after). A stage is
refused above `HEADROOM` of a GPU (its CUDA context and the allocator's fragmentation need the rest) and
`CPU_HEADROOM` of a CPU's memory: there the system, the worker, its zygote and the command that started the run
share the machine with the stage (the kernel killed the stage above at 23.5 GB of 25.8: 0.91 of the machine).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

HEADROOM = 0.9  # the share of a GPU a stage may plan to use
CPU_HEADROOM = 0.8  # the share of a CPU's memory a stage may plan to use (the module docstring says why)
LORA_RANK = 16  # the rank a refusal suggests (docs/training.md)
ACTIVATIONS_PER_UNIT = 17  # values kept per token, layer and hidden unit under bf16 autocast (34 bytes; Korthikanti)
# values kept per token, layer and hidden unit in float32 (no autocast), measured on Gemma 3 270M's layers with
# autograd's saved-tensor hooks (1 to 6 layers, 256 to 512 tokens): 32.4 for a full fine-tune, 38.8 to 39.9 with LoRA
# (dropout 0.05, every linear layer), rounded up
FLOAT32_PER_UNIT = {"full": 33, "lora": 40}
CPU_RUNTIME = 1.0 * 10**9  # a stage's process on a CPU before its model: Python, torch, transformers, TRL, a tokenizer
# float32 tiles TRL's fused LM head holds at its peak on a CPU (its backward's torch fold): 9.7 measured with
# `ChunkedLogProbFunction` on one and on four tiles (ru_maxrss), rounded up
CPU_TILE_COPIES = 10
GB = 1e9
PROMPT_BOUND = 512  # tokens a chat prompt of the lab's 2-agent boards stays under (sizes 3..10: 511 in Gemma's)
PROMPT_PER_AGENT = 33  # tokens each agent beyond 2 adds to it (size 10 in Gemma's: 544, 577, 610, 643, ..., 709 at 8)
CGROUP_LIMIT = Path("/sys/fs/cgroup/memory.max")  # a Slurm job's or a container's limit (cgroup v2)
MMAP_THRESHOLD = 1 << 20  # bytes from which glibc's malloc gives a block pages of its own (`return_freed_memory`)
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter for it (malloc.h)


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
    vllm_sleeps: bool = False  # the colocated engine sleeps between generations (vllm_enable_sleep_mode)
    reference: bool = False  # TRL keeps a reference model (beta > 0)
    shards: int = 1  # processes FSDP or ZeRO-3 splits the trained state over (1: none, as under DDP)
    gpu: bool = False


@dataclass(frozen=True)
class StageMemory:
    """A stage's peak memory per device, by part, in bytes: the parts a training step holds, and what is held while
    a sleeping colocated vLLM engine generates (`generating`; 0 where none sleeps)."""

    runtime: int
    weights: int
    reference: int
    autocast: int
    gradients: int
    optimizer: int
    vllm: int
    logits: int
    activations: int
    generating: int = 0

    @property
    def step(self) -> int:
        """The training step's peak: every part."""
        return sum(getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "generating")

    @property
    def total(self) -> int:
        return max(self.step, self.generating)

    def parts(self) -> str:
        """The step's parts of 1% of the total or more, e.g. `weights 16.1 GB, gradients 16.1 GB, ...`, and what a
        sleeping vLLM's generation holds where that is the peak."""
        step = ", ".join(f"{f.name} {size(getattr(self, f.name))}" for f in dataclasses.fields(self)
                         if f.name != "generating" and getattr(self, f.name) >= self.total / 100)
        return step + (f"; {size(self.generating)} while vLLM generates" if self.generating > self.step else "")


def size(n: float) -> str:
    """Bytes for people: GB to one decimal, MB below a tenth of a GB."""
    return f"{n / GB:.1f} GB" if n >= GB / 10 else f"{n / 1e6:.0f} MB"


def lora_parameters(model: Any, rank: int) -> int:
    """The parameters of rank-`rank` adapters on every linear layer but the output layer (peft's "all-linear")."""
    output = model.get_output_embeddings()
    return sum(rank * (m.in_features + m.out_features) for m in model.modules()
               if isinstance(m, torch.nn.Linear) and m is not output)


def head_tile() -> tuple[int, int] | None:
    """(tokens, vocabulary columns) of one tile of the installed TRL's fused LM head, through which `GRPOTrainer`
    computes every log-probability (TRL 1.16: 4,096 x 32,768); None for a TRL without it, which holds whole logits.
    TRL has no setting for the tile (`GRPOConfig` has no field for it): the stage leaves it as TRL sets it."""
    try:
        from trl.kernels.chunked_logprob import TOKEN_CHUNK_SIZE
        from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE
    except ImportError:
        return None
    return TOKEN_CHUNK_SIZE, _CHUNKED_LOGPROB_CHUNK_SIZE


def logits_memory(plan: StagePlan, vocab: int, hidden: int, tile: tuple[int, int] | None) -> int:
    """The bytes the log-probabilities of one micro-batch hold at their peak (the module docstring's logits)."""
    return _scores(plan, vocab, tile) + (0 if plan.lora else 4 * vocab * hidden)  # a trained head's float32 gradient


def _scores(plan: StagePlan, vocab: int, tile: tuple[int, int] | None) -> int:
    """The bytes the head's scores of a micro-batch hold at their peak and free when its backward is done: the fused
    head's tiles, or whole logits and their gradient."""
    if tile is None:  # whole logits: a batch of prompt + completion tokens over the vocabulary, and their gradient
        return 2 * plan.batch * (plan.prompt + plan.completion) * vocab * 4
    scored = plan.batch * (plan.completion if plan.gpu else plan.prompt + plan.completion)
    cells = min(scored, tile[0]) * min(vocab, tile[1])
    return cells * (2 if plan.bf16 else 4) if plan.gpu else cells * 4 * CPU_TILE_COPIES


def stage_memory(model: Any, plan: StagePlan, tile: tuple[int, int] | None = None) -> StageMemory:
    """The peak memory per device of a GRPO stage of `model` (as loaded for training; a model on the meta device
    will do) under `plan`: the parts of the module docstring, the logits as the installed TRL holds them (`head_tile`)
    unless `tile` says otherwise."""
    tile = tile or head_tile()
    config = model.config.get_text_config()
    params = list(model.parameters())
    count = sum(p.numel() for p in params)
    trained = lora_parameters(model, plan.lora) if plan.lora else count
    if plan.lora:  # the frozen base as `start_policy` loads it: the run's policy (bf16 on a GPU), a stage's float32
        weights = sum(p.numel() * p.element_size() for p in params) + 4 * trained
        wide = sum(p.numel() for p in params if p.element_size() > 2)  # a float32 base is cast to bf16 too
    else:  # float32 master weights
        weights, wide = 4 * count, count
    autocast = 2 * wide if plan.bf16 else 0
    tokens = plan.batch * (plan.prompt + plan.completion)
    per_value = 2 if plan.bf16 else params[0].element_size()
    per_unit = ACTIVATIONS_PER_UNIT if plan.bf16 else FLOAT32_PER_UNIT["lora" if plan.lora else "full"]
    layers = config.num_hidden_layers
    unit = tokens * config.hidden_size * per_value  # one value per token and hidden unit
    if plan.checkpointing:  # each layer's input, and one layer recomputed where that outgrows the head's scores
        activations = layers * unit + max(0, per_unit * unit - _scores(plan, config.vocab_size, tile))
    else:
        activations = per_unit * layers * unit
    # TRL's reference model: a copy of the policy in its dtype (`GRPOTrainer` loads it so); LoRA disables its adapters
    reference = sum(p.numel() * p.element_size() for p in params) if plan.reference and not plan.lora else 0
    vllm = int(plan.vllm_share * plan.device_bytes) if plan.gpu else 0
    runtime = 0 if plan.gpu else int(CPU_RUNTIME)
    weights, reference, optimizer = weights // plan.shards, reference // plan.shards, 8 * trained // plan.shards
    return StageMemory(
        runtime=runtime, weights=weights, reference=reference, autocast=autocast // plan.shards,
        gradients=4 * trained // plan.shards, optimizer=optimizer, vllm=0 if plan.vllm_sleeps else vllm,
        logits=logits_memory(plan, config.vocab_size, config.hidden_size, tile),
        activations=activations,
        generating=runtime + weights + reference + optimizer + vllm if plan.vllm_sleeps and vllm else 0)


def return_freed_memory() -> bool:
    """Have glibc's malloc map every block of `MMAP_THRESHOLD` bytes or more on pages of its own, given back to the
    kernel when the block is freed, for the rest of this process (the module docstring's allocator); True where the
    C library took the setting, False where it has no `mallopt` (it then allocates as it did)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1


def refusal(model: Any, plan: StagePlan) -> str | None:
    """None where the stage fits in `usable` memory of its device; else one line: what it needs, by part, and the
    changes that would make it fit (LoRA, FSDP or ZeRO-3 over more GPUs, activation checkpointing, a shorter
    completion, fewer completions a step), each with its own estimate."""
    usable = usable_bytes(plan)
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
    if plan.gpu and not plan.lora and (found := first((n, replace(plan, shards=n)) for n in SHARDS
                                                      if n > plan.shards)):  # as the lab launches them: `launched`
        options.append(f"--processes {found[0]} (FSDP over {found[0]} GPUs: about {found[1]} each)")
    if not plan.checkpointing and (found := first([(1, replace(plan, checkpointing=True))])):
        options.append(f"--grpo activation_checkpointing=true (about {found[1]})")
    if found := first((c, replace(plan, completion=c)) for c in _halves(plan.completion)):
        options.append(f"--completion-length {found[0]} (about {found[1]})")
    if found := first((b, replace(plan, batch=b)) for b in _halves(plan.batch)):
        generations = f" --grpo num_generations={found[0]}" if plan.generations > found[0] else ""
        options.append(f"--grpo per_device_train_batch_size={found[0]}{generations} (about {found[1]})")
    fix = "it would fit with " + " or ".join(options) if options else "nothing short of a larger device fits"
    return (f"needs about {size(need.total)} per {'GPU' if plan.gpu else 'process'} ({need.parts()}), more than "
            f"{usable / plan.device_bytes:.0%} of the {size(plan.device_bytes)} it has: {fix}")


def usable_bytes(plan: StagePlan) -> float:
    """What a stage may plan to use of its device: `HEADROOM` of a GPU, `CPU_HEADROOM` of a CPU's memory."""
    return (HEADROOM if plan.gpu else CPU_HEADROOM) * plan.device_bytes


SHARDS = (2, 4, 8, 16, 32, 64)  # the GPU counts a refusal tries under FSDP


def fsdp_needed(model: Any, plan: StagePlan, gpus: int) -> tuple[bool, str]:
    """Whether a stage of `model` under `plan` on `gpus` GPUs runs under FSDP, and the line that says why.

    FSDP where DDP cannot fit and sharding can help: a full fine-tune on several GPUs whose estimate per GPU, with
    the whole model, its gradients and AdamW's states on each (DDP), is above `HEADROOM` of a GPU. Everything else
    keeps DDP, whose steps gather no weights: LoRA (its trained state is small), one GPU, a model that fits
    anyway. A full fine-tune that does not fit even sharded runs under FSDP too, and the stage refuses it with its
    own estimate (`refusal`).
    """
    count = sum(p.numel() for p in model.parameters())
    what = f"{f'LoRA {plan.lora}' if plan.lora else 'full fine-tune'} of {count / 1e9:.1f}B on {gpus} " \
           f"GPU{'s' if gpus > 1 else ''}"
    unsharded = stage_memory(model, dataclasses.replace(plan, shards=1)).total
    if gpus <= 1:
        return False, f"{what}: {size(unsharded)}: one process"
    if plan.lora:
        return False, f"{what}: {size(unsharded)} each: DDP"
    if unsharded <= HEADROOM * plan.device_bytes:
        return False, f"{what}: {size(unsharded)} each unsharded: DDP"
    sharded = stage_memory(model, dataclasses.replace(plan, shards=gpus)).total
    return True, f"{what}: {size(unsharded)} each unsharded, {size(sharded)} with FSDP: using FSDP"


def launched(model: Any, plan: StagePlan, processes: int) -> StagePlan:
    """`plan` (one process's, as a config built outside a launch sees it) as the lab launches it on `processes`
    processes, one per GPU: under FSDP, its trained state split `processes` ways, where `fsdp_needed` says so; else
    under DDP, whole on each, as on one. Per process either way: each has its own GPU (on a CPU its share of the
    machine: `device_memory`)."""
    if processes > 1 and fsdp_needed(model, plan, processes)[0]:
        return dataclasses.replace(plan, shards=processes)
    return plan


def prompt_bound(agents: int) -> int:
    """Tokens the longest chat prompt of boards of up to `agents` agents stays under (size 10, Gemma's tokenizer)."""
    return PROMPT_BOUND + PROMPT_PER_AGENT * max(agents - 2, 0)


def _halves(n: int) -> list[int]:
    """n/2, n/4, ... down to 1: the smaller settings a refusal tries, largest first."""
    out = []
    while n > 1:
        n //= 2
        out.append(n)
    return out


def plan_of(config: Any, *, lora: int, prompt: int, device_bytes: int | None = None,
            processes: int | None = None) -> StagePlan:
    """The plan of a stage with TRL's `config` (a `GRPOConfig`), LoRA rank `lora` and prompts of up to `prompt`
    tokens, on this process's device (`device_memory`, as a launch of `processes` processes shares it) unless
    `device_bytes` says otherwise."""
    gpu = not config.use_cpu and torch.cuda.is_available()
    colocated = config.use_vllm and config.vllm_mode == "colocate"
    sharded = bool(getattr(config, "fsdp", None)) or os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true" \
        or os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE") == "3"
    return StagePlan(
        device_bytes=device_bytes or device_memory(gpu, processes), batch=config.per_device_train_batch_size,
        generations=config.num_generations, prompt=prompt, completion=config.max_completion_length, lora=lora,
        bf16=bool(config.bf16),
        checkpointing=bool(getattr(config, "activation_checkpointing", None) or config.gradient_checkpointing
                           or os.environ.get("FSDP_ACTIVATION_CHECKPOINTING", "").lower() == "true"),
        vllm_share=config.vllm_gpu_memory_utilization if colocated else 0.0,
        vllm_sleeps=bool(colocated and config.vllm_enable_sleep_mode), reference=config.beta != 0.0,
        shards=config.world_size if sharded else 1, gpu=gpu)


def device_memory(gpu: bool, processes: int | None = None) -> int:
    """This process's device memory: its GPU's; on a CPU the machine's (or its cgroup's limit, where lower: a Slurm
    job or a container is killed there), shared by the processes of this machine: `processes` (a launch planned
    from outside it), else those of the launch this process is in (`LOCAL_WORLD_SIZE`)."""
    if gpu:
        return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    with contextlib.suppress(OSError, ValueError):  # no cgroup v2 limit here ("max", or no such file)
        machine = min(machine, int(CGROUP_LIMIT.read_text()))
    return machine // (processes or int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


# ---------------------------------------------------------------- the table of docs/training.md

# Qwen3's published shapes (config.json of Qwen/Qwen3-0.6B and Qwen/Qwen3-4B), built on the meta device
QWEN3 = {"0.6B": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16),
         "4B": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32)}
# a chat policy's stage on a GPU of 80 GB at the lab's defaults (`training.stage.grpo_config`): batches of 8
# completions, bf16 autocast, activation checkpointing; a prompt of `PROMPT_BOUND` tokens and the chat budget of 512
CHAT_ON_80_GB = StagePlan(device_bytes=80 * 10**9, batch=8, generations=4, prompt=PROMPT_BOUND, completion=512,
                          bf16=True, checkpointing=True, gpu=True)
TABLE_GPUS = 8


def qwen3(name: str, dtype: torch.dtype = torch.float32) -> Any:
    """Qwen3 of the size `name` ("0.6B", "4B") on the meta device: its real parameters and layers, no weights."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = Qwen3Config(vocab_size=151_936, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                         **QWEN3[name])
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def table(plan: StagePlan = CHAT_ON_80_GB, gpus: int = TABLE_GPUS) -> list[dict[str, Any]]:
    """docs/training.md's table: for each Qwen3 size, full and LoRA (rank `LORA_RANK`, its base in bf16), bytes per
    GPU on one GPU (as on each under DDP), on each of `gpus` under FSDP and as the lab launches `gpus`
    (`fsdp_needed`: "DDP" or "FSDP"), the last also beside a colocated vLLM engine (0.3 of the GPU) that sleeps
    between generations, as the lab colocates one (`training.vllm.vllm_fields`)."""
    rows = []
    for name in QWEN3:
        for lora in (0, LORA_RANK):
            model = qwen3(name, torch.bfloat16 if lora else torch.float32)
            row: dict[str, Any] = {"policy": f"Qwen3-{name}", "training": "LoRA" if lora else "full"}
            for share, suffix in ((0.0, ""), (0.3, " vllm")):
                at = dataclasses.replace(plan, lora=lora, vllm_share=share, vllm_sleeps=share > 0)
                fsdp, _ = fsdp_needed(model, at, gpus)
                row["1 GPU" + suffix] = stage_memory(model, at).total
                row["FSDP" + suffix] = stage_memory(model, dataclasses.replace(at, shards=gpus)).total
                row["launched" + suffix] = ("FSDP", row["FSDP" + suffix]) if fsdp else ("DDP", row["1 GPU" + suffix])
            rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]], plan: StagePlan = CHAT_ON_80_GB, gpus: int = TABLE_GPUS) -> str:
    """The rows of `table` as docs/training.md shows them: GB per GPU, "refused" above `HEADROOM`."""
    usable = HEADROOM * plan.device_bytes

    def cell(n: int) -> str:
        return f"{n / GB:.1f}" + (": refused" if n > usable else "")

    head = ["policy", "training", f"1 GPU, or each of {gpus} under DDP", f"each of {gpus} under FSDP",
            f"{gpus} GPUs as the lab launches them", "1 GPU, colocated vLLM (0.3, sleeping)",
            f"{gpus} GPUs as launched, colocated vLLM (0.3, sleeping)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        launched = [f"{r[k][0]}, {cell(r[k][1])}" for k in ("launched", "launched vllm")]
        lines.append("| " + " | ".join([r["policy"], r["training"], cell(r["1 GPU"]), cell(r["FSDP"]), launched[0],
                                        cell(r["1 GPU vllm"]), launched[1]]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """`python -m training.memory --table`: docs/training.md's table of estimates, in Markdown."""
    parser = argparse.ArgumentParser(prog="python -m training.memory", description=main.__doc__.splitlines()[0])
    parser.add_argument("--table", action="store_true", help="print the table of estimates for Qwen3 0.6B and 4B")
    args = parser.parse_args(argv)
    if not args.table:
        parser.print_help()
        return 2
    print(markdown(table()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
