"""A GRPO stage's peak memory on this machine, measured, beside `training.memory`'s estimate of it.

Run: `python benchmarks/bench_memory.py [--lengths 128,256] [--policy gemma3-270m] [--lora 8] [--boards 2]
[--size 10] [--agents 5] [--threads 2] [--stop-gb 14]`; `--tiny` for the shipped tiny policy at lengths 8,16
(CI's shape: tests/benchmarks/test_bench_memory.py).

Each completion length trains one GRPO step in a child process of its own, as a stage would (`training.stage`:
the policy loaded as stage 1 loads it, `grpo_config`'s defaults for its prompt style, LoRA as `trainer_for` asks
for it), on `boards` boards of the largest size (the longest prompts), every completion held to the full length
(`min_new_tokens`: the budget's worst case, which a base model that seldom stops reaches anyway). The child
reports its resident memory: after loading, and the peak while TRL generates, while it scores and steps, and the
kernel's high-water mark (`ru_maxrss`), beside the estimate of `training.memory.stage_memory` with its real
prompt length. A sampling thread stops the child where its resident memory passes `--stop-gb` (and an
address-space limit a few GB above it stops an allocation that outruns the sampler), so that a length that does
not fit never drives the machine into the kernel's OOM killer: such a length reports "stopped".
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runs from a checkout without an install

import argparse  # noqa: E402
import ctypes  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402

GB = 1e9
PAGE = os.sysconf("SC_PAGE_SIZE")
ADDRESS_MARGIN_GB = 4  # the address space a child may reserve beyond --stop-gb (torch's and glibc's reservations)
STOPPED = 3  # a child's exit status where it stopped itself at --stop-gb


@dataclass
class Measured:
    """One length: the estimate by part and in all, and what the child held (bytes); `stopped` where it stopped
    itself at the limit before the step ended."""

    length: int
    prompt: int
    estimate: dict[str, int]
    loaded: int
    generate: int
    step: int
    peak: int
    seconds: float
    free: int = 0  # the allocator's free heap at the step's peak: resident, used by nothing
    stopped: bool = False

    @property
    def total(self) -> int:
        return self.estimate["total"]

    def row(self) -> str:
        peak = f">{self.peak / GB:.2f} (stopped)" if self.stopped else f"{self.peak / GB:.2f}"
        ratio = "" if self.stopped else f"{self.total / self.peak:6.2f}"
        return (f"{self.length:>6} {self.prompt:>6} {self.total / GB:>9.2f} {peak:>14} {ratio:>6} "
                f"{self.loaded / GB:>7.2f} {self.generate / GB:>9.2f} {self.step / GB:>7.2f} {self.seconds:>7.0f} "
                f"{self.free / GB:>9.2f}")


HEADER = (f"{'length':>6} {'prompt':>6} {'estimate':>9} {'measured peak':>14} {'ratio':>6} {'loaded':>7} "
          f"{'generate':>9} {'step':>7} {'seconds':>7} {'heap free':>9}")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def heap_free() -> int:
    """Bytes glibc's allocator holds free in its heaps (`mallinfo2().fordblks`): resident memory nobody uses, which
    the allocator keeps instead of returning; 0 where the C library has no mallinfo2."""
    try:
        call = ctypes.CDLL(None).mallinfo2
    except AttributeError:
        return 0
    call.restype = _Mallinfo2
    return int(call().fordblks)


class Watch:
    """Samples this process's resident memory every few milliseconds: the peak per phase ("load", "generate",
    "step"), and a stop (exit status `STOPPED`, its figures printed first) where it passes `stop` bytes."""

    def __init__(self, stop: float, report: dict):
        self.stop, self.report, self.phase = stop, report, "load"
        self.peaks: dict[str, int] = {}
        self.free: dict[str, int] = {}  # the allocator's free heap bytes at each phase's peak (`heap_free`)
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            now, phase = rss(), self.phase
            if now > self.peaks.get(phase, 0):
                self.peaks[phase], self.free[phase] = now, heap_free()
            if now > self.stop:
                print(json.dumps({**self.report, "peaks": self.peaks, "free": self.free, "stopped": True}),
                      flush=True)
                os._exit(STOPPED)
            time.sleep(0.005)


def child(opts: argparse.Namespace) -> None:
    """One GRPO step at completion length `opts.child`, as a stage trains it; prints its figures as JSON."""
    resource.setrlimit(resource.RLIMIT_AS, ((int((opts.stop_gb + ADDRESS_MARGIN_GB) * GB),) * 2))
    report: dict = {"length": opts.child}
    watch = Watch(opts.stop_gb * GB, report)
    import torch

    torch.set_num_threads(opts.threads)
    from envsim.config import EnvConfig
    from envsim.generator import generate
    from training import memory
    from training.policy import load_policy, lora_config
    from training.rewards import REWARDS
    from training.stage import DEFAULT_SETTINGS, StageArgs, Trainer, dataset, grpo_config, start_dtype

    config = EnvConfig.default(sizes=(opts.size,), num_agents=opts.agents, num_instances=opts.boards)
    with tempfile.TemporaryDirectory() as tmp:
        args = StageArgs(run_id=0, stage_index=1, seed=0, policy=opts.policy, config=config, run_dir=Path(tmp),
                         run_uuid="bench", settings=DEFAULT_SETTINGS.model_copy(update={"lora": opts.lora}))
        policy = load_policy(opts.policy, dtype=start_dtype(args))
        boards = generate(config, opts.boards, seed=0)
        data = dataset(policy, boards)
        prompt = max(len(policy.tokenizer(p)["input_ids"]) for p in data["prompt"])
        grpo = {"max_steps": 1, "save_strategy": "no", "report_to": "none",
                "generation_kwargs": {"min_new_tokens": opts.child}, **json.loads(opts.grpo)}
        trl_config = grpo_config(args, grpo, opts.child, policy.prompt_style)
        estimate = memory.stage_memory(policy.model, memory.plan_of(trl_config, lora=opts.lora, prompt=prompt))
        if not opts.glibc_default:  # as a CPU stage sets its allocator (`training.stage.trainer_for`)
            memory.return_freed_memory()
        report.update(prompt=prompt, estimate={**vars(estimate), "total": estimate.total})

        class Phased(Trainer):
            def _generate_single_turn(self, prompt_ids, *rest, **kwargs):
                watch.phase = "sample"
                try:
                    if not opts.stand_in:
                        return super()._generate_single_turn(prompt_ids, *rest, **kwargs)
                    words = torch.randint(policy.tokenizer.vocab_size // 2, policy.tokenizer.vocab_size,
                                          (len(prompt_ids), opts.child), generator=torch.Generator().manual_seed(0))
                    return words.tolist(), None
                finally:
                    watch.phase = "generate"

            def _generate_and_score_completions(self, inputs):
                watch.phase = "generate"
                out = super()._generate_and_score_completions(inputs)
                watch.phase = "step"
                return out

        trainer = Phased(model=policy.model, reward_funcs=list(REWARDS), args=trl_config, train_dataset=data,
                         processing_class=policy.tokenizer, peft_config=lora_config(opts.lora) if opts.lora else None,
                         cell_of={p: (0, 0) for p in data["prompt"]}, on_cells=lambda cells: None)
        start = time.perf_counter()
        trainer.train()
        report["seconds"] = time.perf_counter() - start
    report["peaks"], report["free"] = dict(watch.peaks), dict(watch.free)
    report["maxrss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps(report), flush=True)


def measure(opts: argparse.Namespace, length: int) -> Measured:
    """Length `length` measured in a child process of its own (`child`)."""
    command = [sys.executable, __file__, "--child", str(length), "--policy", opts.policy, "--lora", str(opts.lora),
               "--boards", str(opts.boards), "--size", str(opts.size), "--agents", str(opts.agents),
               "--threads", str(opts.threads), "--stop-gb", str(opts.stop_gb), "--grpo", opts.grpo]
    command += ["--stand-in"] if opts.stand_in else []
    command += ["--glibc-default"] if opts.glibc_default else []
    env = {**os.environ, "OMP_NUM_THREADS": str(opts.threads), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode not in (0, STOPPED) or not lines:
        raise RuntimeError(f"length {length}: the child ended with {done.returncode}:\n{done.stderr[-3000:]}")
    report = json.loads(lines[-1])
    peaks = report["peaks"]
    return Measured(length=length, prompt=report.get("prompt", 0), estimate=report.get("estimate", {"total": 0}),
                    loaded=peaks.get("load", 0), generate=max(peaks.get("sample", 0), peaks.get("generate", 0)),
                    step=peaks.get("step", 0), free=report.get("free", {}).get("step", 0),
                    peak=max(report.get("maxrss", 0), *peaks.values()), seconds=report.get("seconds", 0.0),
                    stopped=bool(report.get("stopped")))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="128,256", help="completion lengths, comma-separated")
    p.add_argument("--policy", default="gemma3-270m")
    p.add_argument("--lora", type=int, default=8, help="LoRA rank (0: every weight trains)")
    p.add_argument("--boards", type=int, default=2, help="boards a step (times num_generations completions)")
    p.add_argument("--size", type=int, default=10, help="the boards' size (10: the longest prompts)")
    p.add_argument("--agents", type=int, default=5, help="agents a board (5: the longest prompts)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--stop-gb", type=float, default=14.0, help="a child stops itself past this resident memory")
    p.add_argument("--grpo", default="{}", help="GRPOConfig fields as JSON, on top of the stage's defaults")
    p.add_argument("--stand-in", action="store_true",
                   help="completions of random tokens instead of the policy's samples: the same shapes, so the same "
                        "step, in seconds instead of the minutes a CPU takes to sample them (generation unmeasured)")
    p.add_argument("--glibc-default", action="store_true",
                   help="leave glibc's malloc as it starts (a threshold for blocks of their own that rises), where a "
                        "CPU stage fixes it (`training.memory.return_freed_memory`): what the setting saves")
    p.add_argument("--tiny", action="store_true", help="the shipped tiny policy at lengths 8,16 (CI's shape)")
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    return p


def run(opts: argparse.Namespace) -> list[Measured]:
    if opts.tiny:
        opts.policy, opts.lengths, opts.lora, opts.size, opts.agents, opts.boards = "tiny", "8,16", 0, 3, 2, 4
    lengths = [int(n) for n in opts.lengths.split(",")]
    print(f"{opts.policy}, LoRA {opts.lora or 'off'}, {opts.boards} boards of size {opts.size} with {opts.agents} "
          f"agents a step, {opts.threads} threads, stop at {opts.stop_gb:g} GB, glibc's malloc "
          f"{'as it starts' if opts.glibc_default else 'as a CPU stage sets it'}; GB of resident memory")
    print(HEADER)
    rows = []
    for length in lengths:
        rows.append(measure(opts, length))
        print(rows[-1].row(), flush=True)
    return rows


def main() -> None:
    opts = parser().parse_args()
    if opts.child is not None:
        child(opts)
    else:
        run(opts)


if __name__ == "__main__":
    main()
