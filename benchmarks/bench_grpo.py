"""GRPO throughput: completions ("samples") per second of a tiny stage on this CPU, and on a GPU when there is one.

Run: `python benchmarks/bench_grpo.py [--steps 6] [--prompts 4] [--generations 8] [--threads 1,2] [--gpu-steps 6]`.

CPU: the tiny policy (`training.policy.build_tiny`, the shipped shape, compact prompts) trains with the
stage's own `GRPOConfig` defaults (`training.stage.grpo_config`) and rewards on 2-agent boards of sizes 3..5.
Each step generates `prompts x generations` completions and learns from them; the first step is a warm-up
and is left out. The baseline in the same run is sampling the same number of completions with
`Policy.generate` alone (the rollouts without the learning step), so the ratio says what GRPO costs on top of
generation. Both run once per thread count (on a shared 2-core machine, fewer threads can be faster).

GPU (only when CUDA is available): a randomly initialised model of Qwen3-0.6B's shape (`Qwen3Config`:
28 layers, width 1024, 16 query / 8 key-value heads, vocabulary 151,936, tied embeddings) with a word-level
tokenizer padded to that vocabulary, mixed bf16, and completions of a fixed length (`min_new_tokens`: a
random model seldom stops, and a fixed length makes every step the same work). Reports completion tokens
per second and the share of the GPU's dense bf16 peak that the step's FLOPs make: 2N per token for
generation (prefill and decode) plus 6N per token for the forward and backward pass of the update.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runs from a checkout without an install

import argparse  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

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

# Dense bf16 tensor-core peaks from the data sheets (FLOP/s), matched against the device name.
BF16_PEAK = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12, "L4": 121e12}


class StepTimer(TrainerCallback):
    """Wall time of each optimizer step, and the mean completion length TRL logged for it."""

    def __init__(self):
        self.times: list[float] = []
        self.lengths: list[float] = []
        self._t0 = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.times.append(time.perf_counter() - self._t0)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "completions/mean_length" in logs:
            self.lengths.append(float(logs["completions/mean_length"]))


def grpo_run(policy: Policy, boards, steps: int, prompts: int, generations: int, workdir: Path,
             **overrides) -> StepTimer:
    """Train `steps` GRPO steps of `prompts x generations` completions; the per-step timer."""
    config = EnvConfig.default(sizes=(3,))
    args = StageArgs(run_id=0, stage_index=1, seed=0, policy="bench", config=config, run_dir=workdir)
    budget = max(answer_budget(policy, b) for b in boards)
    grpo = dict(max_steps=steps, num_generations=generations, per_device_train_batch_size=prompts * generations,
                save_strategy="no", logging_steps=1, **overrides)
    timer = StepTimer()
    config = grpo_config(args, grpo, budget, policy.prompt_style)
    trainer = GRPOTrainer(model=policy.model, reward_funcs=list(REWARDS), args=config,
                          train_dataset=dataset(policy, boards), processing_class=policy.tokenizer, callbacks=[timer])
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    return timer


def cpu_bench(opts: argparse.Namespace) -> None:
    config = EnvConfig.default(sizes=(3, 4, 5), num_instances=64)
    boards = generate(config, 64, seed=0)
    per_step = opts.prompts * opts.generations
    policy = build_tiny(0)
    params = sum(p.numel() for p in policy.model.parameters())
    budget = max(answer_budget(policy, b) for b in boards)
    print(f"CPU: tiny policy, {params / 1e6:.2f} M parameters; {opts.prompts} prompts x {opts.generations} "
          f"generations = {per_step} completions per step, up to {budget} new tokens; sizes 3..5")
    print(f"{'threads':>7} {'GRPO samples/s':>15} {'tokens/s':>9} {'s/step':>7} {'generate-only samples/s':>24} "
          f"{'ratio':>6}")
    for threads in opts.threads:
        torch.set_num_threads(threads)
        with tempfile.TemporaryDirectory() as tmp:
            timer = grpo_run(build_tiny(0), boards, opts.steps + 1, opts.prompts, opts.generations, Path(tmp))
        step = statistics.median(timer.times[1:])
        length = statistics.mean(timer.lengths[1:])
        prompts = [policy.prompt(b) for b in boards[:opts.prompts]] * opts.generations
        policy.generate(prompts, max_new_tokens=budget, do_sample=True, seed=0)  # warm-up
        t0 = time.perf_counter()
        for _ in range(opts.steps):
            policy.generate(prompts, max_new_tokens=budget, batch_size=len(prompts), do_sample=True, seed=0)
        gen_rate = per_step * opts.steps / (time.perf_counter() - t0)
        rate = per_step / step
        print(f"{threads:>7} {rate:>15.1f} {rate * length:>9.0f} {step:>7.3f} {gen_rate:>24.1f} "
              f"{rate / gen_rate:>6.2f}")


def qwen3_06b_policy() -> Policy:
    """A random model of Qwen3-0.6B's shape and a word-level tokenizer padded to its vocabulary."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    from envsim.prompts import COMPACT_VOCAB

    vocab_size = 151_936
    words = list(COMPACT_VOCAB) + [f"<x{i}>" for i in range(vocab_size - len(COMPACT_VOCAB))]
    core = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>",
                                  padding_side="left")
    config = Qwen3Config(vocab_size=vocab_size, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                         num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
                         tie_word_embeddings=True, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    return Policy(model=Qwen3ForCausalLM(config), tokenizer=tok, name="qwen3-0.6b-random", prompt_style="compact")


def gpu_bench(opts: argparse.Namespace) -> None:
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in BF16_PEAK.items() if k in name), None)
    policy = qwen3_06b_policy()
    n = sum(p.numel() for p in policy.model.parameters())  # tied: the embedding is the LM head's matmul
    boards = generate(EnvConfig.default(sizes=(6, 7, 8), num_instances=64), 64, seed=0)
    length = opts.gpu_tokens
    with tempfile.TemporaryDirectory() as tmp:
        timer = grpo_run(policy, boards, opts.gpu_steps + 1, opts.gpu_prompts, opts.generations, Path(tmp),
                         max_completion_length=length, generation_kwargs={"min_new_tokens": length},
                         activation_checkpointing=False)
    step = statistics.median(timer.times[1:])
    completions = opts.gpu_prompts * opts.generations
    prompt_len = statistics.mean(len(policy.tokenizer(policy.prompt(b))["input_ids"]) for b in boards)
    tokens = completions * (prompt_len + length)
    flops = 8 * n * tokens  # 2N generating + 6N learning, per token
    print(f"GPU: {name}; random Qwen3-0.6B shape ({n / 1e6:.0f} M parameters), mixed bf16; {completions} "
          f"completions of {length} tokens per step (prompts ~{prompt_len:.0f} tokens)")
    print(f"  {step:.2f} s/step, {completions / step:.1f} samples/s, {completions * length / step:,.0f} completion "
          f"tokens/s, {flops / step / 1e12:.1f} TFLOP/s"
          + (f" = {flops / step / peak:.1%} of the {peak / 1e12:.0f} TFLOP/s bf16 peak" if peak else
             " (no bf16 peak on record for this device)"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="timed GRPO steps (one more runs as a warm-up)")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step")
    parser.add_argument("--generations", type=int, default=8, help="completions per prompt")
    parser.add_argument("--threads", type=lambda s: [int(t) for t in s.split(",")], default=[1, 2],
                        help="CPU thread counts to try, comma-separated")
    parser.add_argument("--gpu-steps", type=int, default=6)
    parser.add_argument("--gpu-prompts", type=int, default=8)
    parser.add_argument("--gpu-tokens", type=int, default=256, help="completion length on the GPU")
    parser.add_argument("--no-cpu", action="store_true", help="only the GPU measurement")
    opts = parser.parse_args(argv)
    if not opts.no_cpu:
        cpu_bench(opts)
    if torch.cuda.is_available():
        gpu_bench(opts)
    else:
        print("GPU: no CUDA device; skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
