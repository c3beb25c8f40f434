"""The GPU path in one command: a chat policy of Qwen3-0.6B's shape trained one GRPO stage through the lab's own
path, then LoRA on a model of Qwen3-4B's shape, then a stage on two processes (`envlab run --processes 2`: 0.6B's
shape on two GPUs, or on a machine of one the tiny model on two CPU processes over gloo), with the figures a person
needs to trust a GPU machine.

A GPU machine has PyTorch and the libraries around it (`MACHINE`, and what they require) but no TRL and no
network: it gets the rest from the wheels it carries (`--wheels DIR`), those `benchmarks/gpu_check_wheels.txt`
names, 17 MB in all (tests/benchmarks/test_gpu_check.py runs this check in a virtual environment of only those
packages, so an import the list misses fails there). Fetch them on a machine with the registry:

    pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp -d wheels \\
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \\
        -r benchmarks/gpu_check_wheels.txt

The models have random weights (no hub here) but the real shapes, vocabulary size (151,936) and a Qwen3-style
chat template with its thinking switch, so memory and speed are those of the real model. Each model goes through
`envlab run` (a worker, the stage's child process, TRL's GRPOTrainer, validation, the database) exactly as a user's
run does: stage 0 evaluated, one stage of `--steps` GRPO steps with thinking off and completion length 256, its
validation. Printed per model: GRPO tokens/s, MFU (6 x parameters x tokens / time over the card's dense bf16
peak), peak GPU memory per GPU (nvidia-smi, polled), the saved checkpoint's dtype, and whether every stored
metric is there.

    python benchmarks/gpu_check.py --wheels wheels          # 0.6B full, 4B LoRA, two processes (one H100/H200)
    python benchmarks/gpu_check.py --wheels wheels --shapes 4b   # the 4B LoRA part alone
    python benchmarks/gpu_check.py --tiny                   # the same path on a CPU at a tiny size (CI)
    python benchmarks/gpu_check.py --wheels wheels --shapes 4b --scratch /dev/shm   # models written to memory

The random models are written to a scratch folder and read back by the stage: 8 GB for 4B's shape, which a slow
disk turns into minutes (on one H200 machine the 4B part was still writing its weights after 230 s); `--scratch`
puts them on a faster one, a memory-backed /dev/shm where it is large enough.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QWEN3_VOCAB = 151_936
SHAPES = {  # Qwen3's published configs, and a tiny one for CPUs
    "0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128),
    "4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=32),
}
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}
WHEELS = ROOT / "benchmarks" / "gpu_check_wheels.txt"  # what the check carries: one `name==version` a line
# What it counts on a GPU machine to have (the 'cuda' image's packages), with what each of them requires
MACHINE = ("torch", "transformers", "accelerate", "peft", "pandas", "pyarrow", "requests", "scipy")
# A Qwen3-style chat template: ChatML turns, and with thinking off an empty think block before the answer.
CHAT_TEMPLATE = (
    "{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}{%- endif %}")


def carried() -> list[str]:
    """The wheels the check carries, `name==version` each (`WHEELS`)."""
    return [line.strip() for line in WHEELS.read_text().splitlines() if line.strip() and not line.startswith("#")]


def install_missing(wheels: str | None) -> None:
    """Install the carried packages this machine lacks from `wheels` (nothing is downloaded; each wheel's needs are
    the machine's or carried too, so none is resolved)."""
    missing = [pinned for pinned in carried() if not _installed(pinned.partition("==")[0])]
    if not missing:
        return
    if not wheels:
        raise SystemExit(f"missing {', '.join(missing)}: give --wheels DIR (see this file's docstring)")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--find-links", wheels,
                    *missing], check=True)


def _installed(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def tokenizer(vocab_size: int):
    """A byte-level BPE tokenizer learnt from the lab's own chat prompts and answers, with Qwen3's special tokens and
    a Qwen3-style chat template (the real one cannot be fetched here)."""
    import numpy as np
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from envsim.generator import random_board
    from envsim.prompts import chat_text
    from envsim.solver import label

    rng = np.random.default_rng(0)
    texts = []
    for i in range(60):
        board = random_board(3 + i % 8, i % 5, 2 + i % 4, rng)
        labelled = board and label(board)
        if labelled is not None and getattr(labelled, "reference_plan", None):
            plan = "\n".join(f"Agent {k}: {' '.join(a)}" for k, a in enumerate(labelled.reference_plan))
            texts += [chat_text(labelled), plan]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=min(vocab_size, 2048), special_tokens=specials))
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def model_config(shape: str, vocab_size: int, eos: int | None = None, pad: int | None = None):
    """The Qwen3 config of `shape`. Qwen3 ties its input and output embeddings at 0.6B and at 4B alike
    (Qwen/Qwen3-4B's config.json: `tie_word_embeddings: true`): 4B's shape has its 4.02 B parameters, where an
    untied head would add 0.39 B that the real model does not train."""
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=vocab_size, tie_word_embeddings=True, max_position_embeddings=4096,
                       eos_token_id=eos, pad_token_id=pad, bos_token_id=None, **SHAPES[shape])


def build_model(folder: Path, shape: str, vocab_size: int, dtype: str) -> int:
    """A random-weight Qwen3 of `shape` saved in `folder` (weights in `dtype`); returns its parameter count."""
    import torch
    from transformers import Qwen3ForCausalLM

    tok = tokenizer(vocab_size)
    config = model_config(shape, vocab_size, tok.eos_token_id, tok.pad_token_id)
    torch.manual_seed(0)
    # Made on the GPU where there is one: 4B parameters initialised on a CPU take minutes of the check's time.
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen3ForCausalLM(config).to(getattr(torch, dtype))
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    params = sum(p.numel() for p in model.parameters())
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the stage's child process gets the card
    return params


class MemoryWatch:
    """The most memory each GPU held while it ran, from nvidia-smi once a second (the stage runs in a child)."""

    def __init__(self) -> None:
        self.peak: dict[int, int] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self.stop.wait(1.0):
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=10).stdout
            except (OSError, subprocess.TimeoutExpired):
                return
            for line in out.strip().splitlines():
                index, used = (int(x) for x in line.split(","))
                self.peak[index] = max(self.peak.get(index, 0), used)

    def __enter__(self) -> MemoryWatch:
        if shutil.which("nvidia-smi"):
            self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()


def card() -> tuple[str, float | None]:
    """The GPU's name and its dense bf16 peak in TFLOP/s (None where unknown, e.g. a CPU)."""
    import torch

    if not torch.cuda.is_available():
        return "CPU", None
    name = torch.cuda.get_device_name(0)
    return name, next((peak for key, peak in PEAK_BF16_TFLOPS.items() if key in name), None)


def two_processes() -> tuple[str, dict[str, str]]:
    """The two-process part's model and GPUs: Qwen3-0.6B's shape on this machine's first two GPUs where it has two;
    else the tiny model on two CPU processes meeting over gloo (the ranks' stand-in for two GPUs), given two GPU
    numbers past this machine's last, so that `envlab run --processes 2` launches two and neither rank sees a GPU."""
    import torch

    count = torch.cuda.device_count()
    if count >= 2:
        return "0.6b", {"CUDA_VISIBLE_DEVICES": "0,1"}
    return "tiny", {"CUDA_VISIBLE_DEVICES": f"{count + 8},{count + 9}"}


def check(name: str, shape: str, args: argparse.Namespace, work: Path, processes: int = 1,
          env: dict[str, str] | None = None) -> dict:
    """One model through `envlab run` on `processes` processes (`env`: their GPUs); the figures of the module
    docstring."""
    from safetensors import safe_open
    from sqlmodel import select

    from storage.db import make_engine, session
    from storage.models import Run, Stage, StageMetric, TrainingLog

    folder, db = work / name, work / f"{name}.db"
    vocab = 2048 if shape == "tiny" else QWEN3_VOCAB
    params = build_model(folder, shape, vocab, "float32" if shape == "tiny" else "bfloat16")
    command = [sys.executable, "-m", "lab.cli", "run", "--db", str(db), "--policy", str(folder), "--stages", "1",
               "--engineer", "fixed", "--auto-apply", "--instances", str(args.instances), "--thinking", "off",
               "--completion-length", str(args.completion_length), "--validation-boards", str(args.boards),
               "--dev-per-size", "3", "--grpo", f"max_steps={args.steps}", "--grpo", "num_generations=4",
               "--grpo", "per_device_train_batch_size=4", "--name", f"gpu-check {name}", "--allow-cpu",
               "--processes", str(processes)]
    if shape == "4b" or args.lora:
        command += ["--lora", "16"]
    t0 = time.perf_counter()
    with MemoryWatch() as memory:
        done = subprocess.run(command, cwd=ROOT, env={**os.environ, "ENVLAB_RUNS": str(work / "runs"), **(env or {})})
    seconds = time.perf_counter() - t0
    engine = make_engine(str(db))
    with session(engine) as s:
        run = s.exec(select(Run)).first()
        stages = s.exec(select(Stage).where(Stage.run_id == run.id).order_by(Stage.index)).all()
        metrics = s.exec(select(StageMetric).where(StageMetric.run_id == run.id)).all()
        logs = s.exec(select(TrainingLog).where(TrainingLog.run_id == run.id).order_by(TrainingLog.step)).all()
    tokens = sum(log.metrics.get("num_tokens", 0) for log in logs[-1:])  # TRL's count is cumulative
    train_s = sum(log.metrics.get("step_time", 0.0) for log in logs) or None
    dtype = None
    trained = stages[-1].checkpoint if stages else None
    if trained:
        files = sorted((work / "runs").rglob("model*.safetensors"))
        if files:
            with safe_open(str(files[-1]), "pt") as f:
                dtype = str(f.get_slice(next(iter(f.keys()))).get_dtype())
    # the two-process part's stand-in trains on the CPU whatever GPU the machine has: no GPU peak for its MFU
    gpu, peak = ("CPU", None) if processes > 1 and shape == "tiny" else card()
    tokens_s = tokens / train_s if train_s else None
    result = {
        "model": name, "shape": shape, "parameters": params, "device": gpu, "processes": processes,
        "exit": done.returncode,
        "seconds": round(seconds, 1), "grpo_steps": len(logs), "grpo_tokens_per_s": tokens_s and round(tokens_s),
        "mfu": round(6 * params * tokens_s / (peak * 1e12), 4) if tokens_s and peak else None,
        "peak_gpu_memory_mib": memory.peak or None, "saved_dtype": dtype,
        "stored": {"stages": [(st.index, str(st.status)) for st in stages],
                   "metric_rows": len(metrics), "training_logs": len(logs),
                   "all_there": len(stages) == 2 and bool(metrics) and len(logs) == args.steps
                   and all(st.status == "done" for st in stages)},
    }
    print(json.dumps(result), flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="a tiny model on whatever device there is (CI's CPU part)")
    p.add_argument("--wheels", help="a folder of wheels for what this machine lacks")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--instances", type=int, default=16)
    p.add_argument("--boards", type=int, default=16, help="validation boards per stage")
    p.add_argument("--completion-length", type=int, default=256)
    p.add_argument("--lora", action="store_true", help="LoRA on the first model too")
    p.add_argument("--out", help="write the figures here as JSON")
    p.add_argument("--shapes", default="0.6b,4b,two",
                   help="the parts to check, of 0.6b (full), 4b (LoRA) and two (a stage on two processes: 0.6b's "
                        "shape on two GPUs, or the tiny model on two CPU processes where there are fewer), in order")
    p.add_argument("--scratch", help="the folder the models and their run are written in (default: the system's "
                   "temporary folder)")
    args = p.parse_args(argv)
    named = {"0.6b": "qwen3-0.6b-shape", "4b": "qwen3-4b-shape-lora", "two": "two-processes"}
    shapes = args.shapes.split(",")
    if unknown := [shape for shape in shapes if shape not in named]:
        p.error(f"--shapes {args.shapes}: {', '.join(unknown)} is not one of {', '.join(named)}")
    if args.scratch and not Path(args.scratch).is_dir():
        p.error(f"--scratch {args.scratch}: no such folder")
    install_missing(args.wheels)
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(prefix="gpu-check-", dir=args.scratch) as tmp:
        models = [("tiny", "tiny")] if args.tiny else [(named[shape], shape) for shape in shapes]
        results = []
        for name, shape in models:
            if shape == "two":
                model, gpus = two_processes()
                results.append(check(name, model, args, Path(tmp), processes=2, env=gpus))
            else:
                results.append(check(name, shape, args, Path(tmp)))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0 if all(r["exit"] == 0 and r["stored"]["all_there"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
