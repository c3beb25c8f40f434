"""GRPO throughput you can quote: tokens/s, step time and MFU of a stage's training and of generation alone.

Run: `python benchmarks/bench_grpo.py [--steps 3] [--prompts 4] [--generations 8] [--tokens 48] [--threads 1]
[--models tiny,qwen3-0.6b] [--full-shape] [--no-vllm]`.

Two models, each trained with the stage's own `GRPOConfig` defaults (`training.stage.grpo_config`) and rewards
on 2-agent boards of sizes 3..5, `prompts x generations` completions a step, the first step a warm-up left out:
- `tiny`: the tiny policy's shape (`training.policy.build_tiny`, compact prompts), completions of its own length
  (it stops at eos);
- `qwen3-0.6b`: a model built from Qwen3-0.6B's config with random weights (nothing is downloaded; 28 layers,
  width 1024, 16/8 heads, vocabulary 151,936, tied embeddings) and a word-level tokenizer padded to its
  vocabulary. On the CPU a scaled-down shape (`CPU_SHAPE`) runs unless `--full-shape`; on a GPU the real shape,
  in bf16 mixed precision. A random model seldom stops, so its completions have a fixed length (`--tokens`,
  `min_new_tokens`): every step is the same work.

The baseline in the same run is generation alone (the rollouts without the learning step) with transformers
(`Policy.generate`), and with vLLM where it is installed and a GPU is at hand; the ratio says what GRPO costs on
top of generation. FLOPs from the parameter count N: 2N per token generated or read (prefill) and 6N per token
of the update's forward and backward pass; a GRPO step is 8N per token. MFU is that rate over the device's
peak: `PEAK` (dense bf16 tensor-core peaks from the data sheets) for a GPU, and for the CPU an estimate,
`CPU_PEAK_PER_CORE` times the threads (`--cpu-peak` to give your own).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runs from a checkout without an install

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402
from transformers.trainer_callback import PrinterCallback  # noqa: E402
from trl import GRPOTrainer  # noqa: E402

from envsim.config import EnvConfig  # noqa: E402
from envsim.generator import generate  # noqa: E402
from training.evaluate import answer_budget  # noqa: E402
from training.policy import Policy, build_tiny  # noqa: E402
from training.rewards import REWARDS  # noqa: E402
from training.stage import StageArgs, dataset, grpo_config  # noqa: E402

# Dense bf16 tensor-core peaks from the data sheets (FLOP/s, SXM parts), matched against the device's name.
PEAK = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12, "L4": 121e12}
# A CPU core's float32 peak, an estimate: two 256-bit FMA pipes (16 FLOP each a cycle) at about 3 GHz, as on the
# AMD EPYC (Zen 4) cores this was measured on. Give your own with --cpu-peak.
CPU_PEAK_PER_CORE = 96e9
QWEN3_06B = dict(vocab_size=151_936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40_960,
                 tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0})
# Qwen3-0.6B's proportions at a size two shared CPU cores can step in seconds: 4 layers, width 256, 8k words.
CPU_SHAPE = dict(QWEN3_06B, vocab_size=8192, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=64)
MODELS = ("tiny", "qwen3-0.6b")


@dataclass
class Figures:
    """One measurement: what was timed, how many tokens per step, the seconds a step took."""

    model: str
    mode: str  # "GRPO", "generate (transformers)", "generate (vLLM)"
    params: int
    tokens: float  # tokens a step reads and writes (prompt + completion, every completion)
    completion_tokens: float
    seconds: float  # median seconds a step
    flops_per_token: int  # 8N for GRPO, 2N for generation

    @property
    def flops(self) -> float:
        return self.flops_per_token * self.params * self.tokens / self.seconds

    def row(self, peak: float) -> str:
        rate = self.completion_tokens / self.seconds
        return (f"{self.model:<26} {self.mode:<24} {self.params / 1e6:>8.1f} {rate:>9.0f} {self.seconds:>7.3f} "
                f"{self.flops / 1e12:>8.4f} {self.flops / peak:>6.2%}")


HEADER = (f"{'model':<26} {'mode':<24} {'params M':>8} {'tokens/s':>9} {'s/step':>7} {'TFLOP/s':>8} {'MFU':>6}")


class StepTimer(TrainerCallback):
    """Wall time of each optimizer step, and the mean completion length TRL logged for it."""

    def __init__(self):
        self.times: list[float] = []
        self.lengths: list[float] = []
        self._t0 = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        _sync()
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        _sync()
        self.times.append(time.perf_counter() - self._t0)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "completions/mean_length" in logs:
            self.lengths.append(float(logs["completions/mean_length"]))


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def word_tokenizer(vocab_size: int):
    """envlab's compact words, then filler words up to `vocab_size`: a tokenizer for a model of that vocabulary."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    from envsim.prompts import COMPACT_VOCAB

    words = list(COMPACT_VOCAB) + [f"<x{i}>" for i in range(vocab_size - len(COMPACT_VOCAB))]
    core = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>",
                                   padding_side="left")


def qwen3_policy(shape: dict) -> Policy:
    """A random model of `shape` (Qwen3-0.6B's, or `CPU_SHAPE`) over a word-level tokenizer of its vocabulary."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = word_tokenizer(shape["vocab_size"])
    config = Qwen3Config(**shape, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None)
    torch.manual_seed(0)
    full = shape["num_hidden_layers"] == QWEN3_06B["num_hidden_layers"]
    name = "qwen3-0.6b (random)" if full else "qwen3-0.6b-small (random)"
    return Policy(model=Qwen3ForCausalLM(config), tokenizer=tok, name=name, prompt_style="compact")


def grpo_steps(policy: Policy, boards, steps: int, prompts: int, generations: int, workdir: Path,
               **overrides) -> StepTimer:
    """Train `steps` GRPO steps of `prompts x generations` completions with the stage's config; the step timer."""
    args = StageArgs(run_id=0, stage_index=1, seed=0, policy="bench", config=EnvConfig.default(sizes=(3,)),
                     run_dir=workdir, run_uuid="bench")
    budget = max(answer_budget(policy, b) for b in boards)
    grpo = dict(max_steps=steps, num_generations=generations, per_device_train_batch_size=prompts * generations,
                save_strategy="no", logging_steps=1, **overrides)
    timer = StepTimer()
    config = grpo_config(args, grpo, budget, "chat" if torch.cuda.is_available() and policy.name != "tiny"
                         else policy.prompt_style)  # on a GPU the large model takes the chat defaults (bf16)
    trainer = GRPOTrainer(model=policy.model, reward_funcs=list(REWARDS), args=config,
                          train_dataset=dataset(policy, boards), processing_class=policy.tokenizer, callbacks=[timer])
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    return timer


def measure(policy: Policy, opts: argparse.Namespace, fixed: int | None) -> list[Figures]:
    """GRPO, then generation alone of the same completions (transformers; vLLM where installed, on a GPU)."""
    boards = generate(EnvConfig.default(sizes=(3, 4, 5), num_instances=64), 64, seed=0)
    params = sum(p.numel() for p in policy.model.parameters())  # tied: the embedding is the LM head's matmul
    per_step = opts.prompts * opts.generations
    prompt_tokens = statistics.mean(len(policy.tokenizer(policy.prompt(b))["input_ids"])
                                    for b in boards[:opts.prompts])
    extra = {} if fixed is None else dict(max_completion_length=fixed, generation_kwargs={"min_new_tokens": fixed},
                                          activation_checkpointing=False)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        timer = grpo_steps(policy, boards, opts.steps + 1, opts.prompts, opts.generations, Path(tmp), **extra)
    length = statistics.mean(timer.lengths[1:] or timer.lengths)
    step = statistics.median(timer.times[1:] or timer.times)
    figures = [Figures(policy.name, "GRPO", params, per_step * (prompt_tokens + length), per_step * length, step, 8)]
    # generation alone: the same prompts, the same lengths, in one batch, by transformers' `generate` as the GRPO
    # trainer above (benchmarks/bench_decode.py compares it with the decode loop)
    policy.model.to(device)
    policy.decoder = "transformers"
    prompts = [policy.prompt(b) for b in boards[:opts.prompts]] * opts.generations
    budget = fixed or max(answer_budget(policy, b) for b in boards)
    policy.generate(prompts, max_new_tokens=budget, batch_size=len(prompts), do_sample=True, seed=0)  # warm-up
    times = []
    for k in range(opts.steps):
        _sync()
        t0 = time.perf_counter()
        policy.generate(prompts, max_new_tokens=budget, batch_size=len(prompts), do_sample=True, seed=k)
        _sync()
        times.append(time.perf_counter() - t0)
    figures.append(Figures(policy.name, "generate (transformers)", params, per_step * (prompt_tokens + length),
                           per_step * length, statistics.median(times), 2))
    if not opts.no_vllm and (vllm := vllm_generation(policy, prompts, budget, fixed, opts.steps)) is not None:
        figures.append(Figures(policy.name, "generate (vLLM)", params, per_step * (prompt_tokens + length),
                               per_step * length, vllm, 2))
    return figures


def vllm_generation(policy: Policy, prompts: list[str], budget: int, fixed: int | None, steps: int) -> float | None:
    """Median seconds vLLM takes to sample `prompts`, or None (and a line saying why) where it cannot run."""
    if importlib.util.find_spec("vllm") is None or not torch.cuda.is_available():
        print(f"  {policy.name}: vLLM generation skipped ("
              + ("vLLM is not installed: pip install 'envlab[vllm]'" if importlib.util.find_spec("vllm") is None
                 else "no CUDA device") + ")")
        return None
    from training.vllm import generate_texts, vllm_engine

    with tempfile.TemporaryDirectory() as tmp:
        policy.save(Path(tmp) / "policy")
        engine = vllm_engine(str(Path(tmp) / "policy"))
        generate_texts(engine, prompts, budget, min_tokens=fixed or 0, seed=0)  # warm-up
        times = []
        for k in range(steps):
            t0 = time.perf_counter()
            generate_texts(engine, prompts, budget, min_tokens=fixed or 0, seed=k)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def peak_of(opts: argparse.Namespace) -> tuple[float, str]:
    """The device's peak FLOP/s and how it was found."""
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        peak = next((v for k, v in PEAK.items() if k in name), None)
        if peak is None:
            return float("nan"), f"{name}: no bf16 peak on record (add it to PEAK)"
        return peak, f"{name}, dense bf16 peak {peak / 1e12:.0f} TFLOP/s (data sheet)"
    peak = opts.cpu_peak or CPU_PEAK_PER_CORE * torch.get_num_threads()
    how = "given with --cpu-peak" if opts.cpu_peak else \
        f"estimate: {CPU_PEAK_PER_CORE / 1e9:.0f} GFLOP/s a core x {torch.get_num_threads()} threads"
    return peak, f"CPU, float32 peak {peak / 1e9:.0f} GFLOP/s ({how})"


def run(opts: argparse.Namespace) -> list[Figures]:
    torch.set_num_threads(opts.threads)
    peak, where = peak_of(opts)
    print(f"{where}; {opts.prompts} prompts x {opts.generations} generations a step, {opts.steps} timed steps "
          "after a warm-up")
    print(HEADER)
    figures: list[Figures] = []
    for model in opts.models:
        if model == "tiny":
            policy, fixed = build_tiny(0), None
        else:
            shape = QWEN3_06B if opts.full_shape or torch.cuda.is_available() else CPU_SHAPE
            policy, fixed = qwen3_policy(shape), opts.tokens
        rows = measure(policy, opts, fixed)
        for row in rows:
            print(row.row(peak), flush=True)
        grpo, gen = rows[0], rows[1]
        print(f"  {policy.name}: a GRPO step takes {grpo.seconds / gen.seconds:.2f}x the time of generating its "
              "completions alone (transformers)")
        figures += rows
    return figures


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3, help="timed steps (one more runs as a warm-up)")
    p.add_argument("--prompts", type=int, default=4, help="prompts per step")
    p.add_argument("--generations", type=int, default=8, help="completions per prompt")
    p.add_argument("--tokens", type=int, default=48, help="completion length of the random Qwen3 model")
    p.add_argument("--threads", type=int, default=1, help="CPU threads")
    p.add_argument("--models", type=lambda s: s.split(","), default=list(MODELS),
                   help=f"comma-separated: {', '.join(MODELS)}")
    p.add_argument("--full-shape", action="store_true", help="Qwen3-0.6B's real shape on the CPU too")
    p.add_argument("--cpu-peak", type=float, help="the CPU's peak FLOP/s (default: an estimate, see the docstring)")
    p.add_argument("--no-vllm", action="store_true", help="leave vLLM out even where it is installed")
    return p


def main(argv: list[str] | None = None) -> int:
    opts = parser().parse_args(argv)
    unknown = sorted(set(opts.models) - set(MODELS))
    if unknown:
        parser().error(f"unknown model(s) {', '.join(unknown)}: use {', '.join(MODELS)}")
    run(opts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
