"""Warm start by imitation: teach the tiny policy the solver's plans before any RL.

GRPO learns nothing from a policy whose answers are never valid (every reward is the same), and a model
trained from scratch starts out writing noise. So the tiny policy first learns, by plain next-token
prediction, to copy the solver's SoC-optimal reference plans: prompt = the compact board line, target =
`compact_answer(reference_plan, board)` (each move followed by the cell it leads to) + eos, with the loss on
the target tokens only.

Boards are streamed fresh, made a few steps ahead by a second process (the solver labels a board in a few
milliseconds, which adds up to about as much CPU as a training step), drawn the way the validation and
benchmark boards are drawn (a hole ratio uniform in 0..0.5 per board) but from the training seed namespace,
a third of them needing a wait. Each step's batch holds boards of one size, so there is no padding to pay
for; the size is drawn from a curriculum that starts on 3..5 and opens up to 10x10 over the first 30% of
training, weighted toward 3..6 throughout.

Learning rate and curriculum follow `progress = max(step / steps, elapsed / minutes)`: with enough CPU the
run makes `--steps` steps and is a pure function of `--seed` (the shipped checkpoint: 11,000 steps in about
45 minutes on 2 cores, well inside the 58-minute cap); on a slower or busier machine the schedule compresses
to end annealed at the time cap, and the checkpoint then depends on how many steps fitted.

    python -m training.warmstart --out assets/tiny-policy --seed 0 --threads 1
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import multiprocessing
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from envsim.generator import TRAINING, random_board, round_half_up, stratified
from envsim.instance import Instance
from envsim.prompts import compact_answer
from envsim.suite import Split, build
from training.evaluate import evaluate, metrics_table, size_metrics
from training.policy import Policy, build_tiny
from training.tokenizer import compact_text

PREFETCH = 3  # steps' boards made ahead by the labelling process
# Share of steps per size once every size is open: small boards are cheap and are what GRPO stages start on.
SIZE_WEIGHTS = {3: 0.16, 4: 0.18, 5: 0.18, 6: 0.18, 7: 0.09, 8: 0.08, 9: 0.07, 10: 0.06}


@dataclass
class Args:
    out: str = "assets/tiny-policy"
    """where the checkpoint is written"""
    seed: int = 0
    steps: int = 11000
    """optimizer steps, unless the time cap comes first"""
    minutes: float = 58.0
    """wall-clock cap: the schedule ends (annealed) and training stops when it is reached"""
    batch_size: int = 16
    """small batches: more updates per CPU-minute, which is what a tiny model short of compute needs"""
    lr: float = 2e-3
    min_lr_ratio: float = 0.05
    warmup: int = 50
    weight_decay: float = 0.05
    open_at: float = 0.3
    """share of training after which every size is drawn (before: sizes open one by one from 3..5)"""
    eval_every: int = 2000
    """steps between validation runs on `eval_sizes` (the end runs one on all sizes); 0: no validation at all"""
    eval_sizes: str = "3,4,5,6"
    """sizes of the validation boards checked every `eval_every` steps (the end checks all of 3..10)"""
    threads: int = 2
    """torch threads; on a machine shared with other jobs 1 is faster (2 threads stall on each other)"""
    shape: str = ""
    """overrides of the tiny model's shape, e.g. "hidden_size=192,num_hidden_layers=8" """


def size_weights(progress: float, open_at: float) -> dict[int, float]:
    """The curriculum: sizes up to `5 + 5 * progress / open_at` are drawn, in proportion to SIZE_WEIGHTS."""
    largest = 5 + (5 * progress / open_at if open_at > 0 else 5)
    weights = {s: w for s, w in SIZE_WEIGHTS.items() if s <= largest}
    total = sum(weights.values())
    return {s: w / total for s, w in weights.items()}


def boards(size: int, count: int, rng: np.random.Generator) -> list[Instance]:
    """`count` labelled 2-agent boards of one size, a third needing a wait, hole ratio uniform in 0..0.5 per board.

    A third, not the validation set's average of a half: only 5-15% of random boards need a wait, so every
    extra one costs several solver calls, and a third is enough for the model to learn to wait.
    """
    def draw(r: np.random.Generator) -> Instance | None:
        holes = min(round_half_up(r.uniform(0.0, 0.5) * size * size), size * size - 4)
        while holes >= 0:
            board = random_board(size, holes, 2, r)
            if board is not None:
                return board
            holes -= 1
        return None

    return list(stratified(draw, count, count // 3, rng, f"warm start size {size}"))


def step_boards(args: Args, step: int, progress: float) -> tuple[int, list[Instance]]:
    """The size and boards of one step: a pure function of (seed, step, progress), so any process can make them."""
    rng = np.random.default_rng([TRAINING, args.seed, 7919, step])
    weights = size_weights(progress, args.open_at)
    size = int(rng.choice(list(weights), p=list(weights.values())))
    return size, boards(size, args.batch_size, rng)


def batch(policy: Policy, instances: list[Instance]) -> dict[str, torch.Tensor]:
    """Input ids, attention mask and labels (-100 on prompt and padding) for one right-padded batch."""
    tok = policy.tokenizer
    rows = []
    for inst in instances:
        prompt = tok(policy.prompt(inst))["input_ids"]
        answer = tok(compact_text(compact_answer(inst.reference_plan, inst)))["input_ids"] + [tok.eos_token_id]
        rows.append((prompt, answer))
    width = max(len(p) + len(a) for p, a in rows)
    ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (p, a) in enumerate(rows):
        ids[i, : len(p) + len(a)] = torch.tensor(p + a)
        labels[i, len(p) : len(p) + len(a)] = torch.tensor(a)
        mask[i, : len(p) + len(a)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def lr_at(progress: float, args: Args) -> float:
    """Linear warm-up over `warmup` steps' worth of progress, then cosine decay to `min_lr_ratio * lr`."""
    warm = args.warmup / args.steps
    if progress < warm:
        return args.lr * (progress + 1 / args.steps) / warm
    t = min(1.0, (progress - warm) / max(1e-9, 1 - warm))
    return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def validate(policy: Policy, validation: list[Instance]) -> dict[int, dict]:
    metrics = size_metrics(evaluate(policy, validation))
    print(metrics_table(metrics), flush=True)
    return metrics


def train(args: Args) -> tuple[Policy, list[float]]:
    """Run the warm start; returns the trained policy and the loss of every step."""
    torch.set_num_threads(args.threads)
    shape = {k: int(v) for k, v in (kv.split("=") for kv in args.shape.split(",") if kv)}
    policy = build_tiny(seed=args.seed, **shape)
    model = policy.model
    model.train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optim = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                               {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))
    eval_sizes = {int(s) for s in args.eval_sizes.split(",")}
    validation = [e.instance for e in build(Split.VALIDATION)[0]] if args.eval_every > 0 else []
    params = sum(p.numel() for p in model.parameters())
    print(f"tiny policy: {params:,} parameters; {args.steps} steps of {args.batch_size}; "
          f"{len(validation)} validation boards", flush=True)

    losses: list[float] = []
    t0 = time.perf_counter()
    # Progress is the share of steps done or of the time cap used, whichever is larger: on a loaded machine
    # the schedule (learning rate and curriculum) compresses to end inside the time cap instead of being cut off.
    def progress_at(step: int) -> float:
        # In whole steps' worth, so that a run the clock never overtakes is exactly a function of its seed.
        clock = math.floor((time.perf_counter() - t0) / 60 / args.minutes * args.steps)
        return min(1.0, max(step, clock) / args.steps)

    # Labelling boards costs about as much CPU as a training step, so a second process makes them a few
    # steps ahead (a few only: boards made for steps the time cap never reaches would be CPU thrown away).
    pool = multiprocessing.get_context("spawn").Pool(1)
    ahead: deque = deque(pool.apply_async(step_boards, (args, s, progress_at(s))) for s in range(PREFETCH))
    bar = tqdm(range(args.steps), desc="warm start", mininterval=10)
    for step in bar:
        size, instances = ahead.popleft().get()
        if step + PREFETCH < args.steps:
            ahead.append(pool.apply_async(step_boards, (args, step + PREFETCH, progress_at(step + PREFETCH))))
        data = batch(policy, instances)
        progress = progress_at(step)
        for group in optim.param_groups:
            group["lr"] = lr_at(progress, args)
        loss = model(**data).loss
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{np.mean(losses[-50:]):.3f}", size=size, refresh=False)
        last = step + 1 == args.steps or (time.perf_counter() - t0) / 60 >= args.minutes
        if validation and (last or (step + 1) % args.eval_every == 0):
            print(f"\nstep {step + 1}, {(time.perf_counter() - t0) / 60:.1f} min, "
                  f"loss {np.mean(losses[-50:]):.4f}", flush=True)
            validate(policy, validation if last else [i for i in validation if i.size in eval_sizes])
            policy.save(args.out)  # a run cut short still leaves its latest checkpoint
            model.train()
        if last:
            break
    bar.close()
    pool.terminate()
    policy.save(args.out)
    print(f"saved {args.out} after {len(losses)} steps in {(time.perf_counter() - t0) / 60:.1f} min", flush=True)
    return policy, losses


def parse_args(argv: list[str] | None = None) -> Args:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for field in dataclasses.fields(Args):
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=type(field.default), default=field.default)
    return Args(**vars(parser.parse_args(argv)))


if __name__ == "__main__":
    train(parse_args())
