"""Warm start by imitation: teach the tiny policy the solver's plans for 2 to 5 agents before any RL.

GRPO learns nothing from a policy whose answers are never valid (every reward is the same), and a model trained
from scratch starts out writing noise. So the tiny policy first learns, by plain next-token prediction, to copy
the solver's SoC-optimal reference plans: prompt = the compact board line, target =
`compact_answer(reference_plan, board)` (each move followed by the cell it leads to) + eos, with the loss on the
target tokens only.

The boards come labelled from disk (`training.labels`, made once on every core), never from a held-out set: every
board of the benchmark, the validation sets and the dev sets is dropped before training (`held_out_ids`). Each
step's batch holds boards of one (agents, size) cell, so there is no padding to pay for; the cell is drawn from a
curriculum that starts on sizes 3..5 with 2 and 3 agents and opens every cell over the first `open_at` of training,
each open cell weighted by its share of the labels.

Everything follows the step count, never the clock, and the run saves its whole state (weights, optimizer, step,
losses) every `save_every` steps and when `minutes` or a SIGTERM stops it: run the same command again and it goes
on from there, to the same checkpoint an unbroken run would have written.

    python -m training.labels --out ~/envlab-labels --boards 120000
    python -m training.warmstart --labels ~/envlab-labels --out assets/tiny-policy --steps 30000 --threads 1
"""

from __future__ import annotations

import dataclasses
import json
import math
import signal
import time
from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from envsim.instance import Instance
from envsim.prompts import compact_answer
from envsim.suite import (
    DEV_PER_SIZE,
    SUITE_SEED,
    VALIDATION_PER_SIZE,
    Split,
    SuiteCell,
    build_cell,
    cells,
    dev_cells,
    pool,
    validation_cells,
)
from training.evaluate import evaluate
from training.labels import command_line, read_shards
from training.policy import Policy, build_tiny
from training.tokenizer import compact_text

STATE = "warmstart-state.pt"  # beside the checkpoint folder: `<out>.state/warmstart-state.pt`
HELD_OUT = "held-out.json"  # the held-out board ids, cached beside the labels
LARGEST_VALIDATION = 120  # the largest validation set per size a run can score on (960 boards)


@dataclass
class Args:
    labels: str = "labels"
    """the folder of labelled boards (`python -m training.labels`)"""
    out: str = "assets/tiny-policy"
    """where the checkpoint is written; the resumable state goes to `<out>.state/`"""
    seed: int = 0
    steps: int = 30000
    batch_size: int = 16
    """small batches: more updates per CPU-minute, which is what a tiny model short of compute needs"""
    lr: float = 2e-3
    min_lr_ratio: float = 0.05
    warmup: int = 100
    weight_decay: float = 0.05
    open_at: float = 0.3
    """share of training after which every (agents, size) cell is drawn"""
    eval_every: int = 2000
    """steps between checks on the check boards (the end checks too); 0: none"""
    check_per_cell: int = 3
    """check boards per (agents, size, wait subset) cell of agents 2..5 (validation namespace, held out)"""
    save_every: int = 500
    """steps between saves of the resumable state"""
    minutes: float = 0.0
    """stop (saving the state, to be resumed) after this long; 0: run to the end"""
    stop_at: int = 0
    """stop (saving the state, to be resumed) after this step, e.g. to keep a checkpoint on the way; 0: none"""
    threads: int = 1
    shape: str = ""
    """overrides of the tiny model's shape, e.g. "hidden_size=192,num_hidden_layers=8" """
    agents: str = ""
    """train on these agent counts only, e.g. "2,3" (the paper's question: does it carry to 4 and 5?); "": all"""
    device: str = "cpu"


HELD_OUT_AGENTS = ((2,), (3, 4, 5))  # the validation sets' agent counts: today's default and the paper's
DEV_SEEDS = tuple(range(10))  # runs' own dev sets (`dev_per_seed`) at the default size: the seeds studies use
# what the held-out list holds, stored with its cache: a cache made by another recipe is stale and made anew
HELD_OUT_RECIPE = {"agents": [list(a) for a in HELD_OUT_AGENTS], "largest_validation": LARGEST_VALIDATION,
                   "dev_per_size": DEV_PER_SIZE, "dev_seeds": list(DEV_SEEDS)}


def held_out_ids(cache: Path | None = None, sizes: Collection[int] | None = None) -> frozenset[str]:
    """Every board id the warm start must never train on: the benchmark, the largest and the standard validation
    set and the dev sets beside each (the shared one and each of `DEV_SEEDS`' own), at 2 agents and at 3..5
    (`HELD_OUT_AGENTS`, a run's `validation_agents`), and the validation cells of every agent count 2..5 (the check
    boards among them); only boards of `sizes` where given (a test's cheap subset). Cached in `cache` with its
    recipe (`HELD_OUT_RECIPE`, the sizes): a cache of another recipe, or of the older bare list, is made anew."""
    recipe = {**HELD_OUT_RECIPE, "sizes": None if sizes is None else sorted(sizes)}
    if cache is not None and cache.is_file():
        stored = json.loads(cache.read_text())
        if isinstance(stored, dict) and stored.get("recipe") == recipe:
            return frozenset(stored["ids"])

    def wanted(cell: SuiteCell) -> bool:
        return sizes is None or cell.size in sizes

    todo = [c for c in cells(Split.BENCHMARK) + cells(Split.VALIDATION, agents=(3, 4, 5))
            + [v for agents in HELD_OUT_AGENTS for v in validation_cells(LARGEST_VALIDATION, agents)] if wanted(c)]
    with pool(2) as workers:
        ids = {e.instance.id for part, *_ in workers.map(build_cell, todo) for e in part}
        for agents in HELD_OUT_AGENTS:
            for per_size in (VALIDATION_PER_SIZE, LARGEST_VALIDATION):
                beside = frozenset(e.instance.id for c in validation_cells(per_size, agents) if wanted(c)
                                   for e in build_cell(c)[0])
                dev = [c for draw in (None, *DEV_SEEDS) for c in dev_cells(DEV_PER_SIZE, agents, draw) if wanted(c)]
                ids |= {e.instance.id for part, *_ in workers.map(build_cell, dev, [SUITE_SEED] * len(dev),
                                                                  [beside] * len(dev)) for e in part}
    if cache is not None:
        cache.write_text(json.dumps({"recipe": recipe, "ids": sorted(ids)}))
    return frozenset(ids)


def check_boards(per_cell: int) -> list[Instance]:
    """The boards the warm start checks itself on: `per_cell` per (agents 2..5, size, wait subset) validation cell."""
    todo = [dataclasses.replace(c, count=per_cell) for c in cells(Split.VALIDATION, agents=(2, 3, 4, 5))]
    with pool(2) as workers:
        return [e.instance for part, *_ in workers.map(build_cell, todo) for e in part]


def load_labels(folder: str | Path, held_out: frozenset[str]) -> tuple[dict[tuple[int, int], list[Instance]], int]:
    """The labelled boards by (agents, size) cell, without any held-out board; and how many were dropped."""
    by_cell: dict[tuple[int, int], list[Instance]] = defaultdict(list)
    dropped = 0
    for shard, boards in read_shards(folder):
        kept = [b for b in boards if b.id not in held_out]
        dropped += len(boards) - len(kept)
        by_cell[(shard.agents, shard.size)].extend(kept)
    return dict(by_cell), dropped


def cell_weights(data: dict[tuple[int, int], list[Instance]], progress: float, open_at: float) -> dict:
    """The curriculum: sizes up to `5 + 5 * progress / open_at` and agents up to `3 + 2 * progress / open_at`,
    each open cell in proportion to its boards."""
    opened = 1.0 if open_at <= 0 else min(1.0, progress / open_at)
    open_cells = {c: len(b) for c, b in data.items() if b and c[1] <= 5 + 5 * opened and c[0] <= 3 + 2 * opened}
    total = sum(open_cells.values())
    return {c: n / total for c, n in sorted(open_cells.items())}


def step_batch(data: dict[tuple[int, int], list[Instance]], args: Args, step: int) -> tuple[tuple[int, int], list]:
    """The cell and boards of one step: a pure function of (labels, seed, step)."""
    rng = np.random.default_rng([args.seed, 7919, step])
    weights = cell_weights(data, step / args.steps, args.open_at)
    cell = list(weights)[int(rng.choice(len(weights), p=list(weights.values())))]
    picks = rng.choice(len(data[cell]), size=min(args.batch_size, len(data[cell])), replace=False)
    return cell, [data[cell][i] for i in picks]


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


def lr_at(step: int, args: Args) -> float:
    """Linear warm-up over `warmup` steps, then cosine decay to `min_lr_ratio * lr` at the last step."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    t = min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))
    return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def check(policy: Policy, boards: list[Instance]) -> dict[int, float]:
    """Valid rate (%) per agent count on the check boards, printed as one line."""
    results = evaluate(policy, boards)
    rates = {}
    for k in sorted({b.num_agents for b in boards}):
        mine = [r for r in results if r.instance.num_agents == k]
        rates[k] = 100 * sum(r.outcome.valid for r in mine) / len(mine)
    print("valid % by agents: " + ", ".join(f"{k}: {v:.1f}" for k, v in rates.items()), flush=True)
    return rates


def _resumable(args: Args) -> dict:
    """The settings a saved state must share to be resumed (not the clock cap, threads or checks)."""
    keep = ("labels", "seed", "steps", "batch_size", "lr", "min_lr_ratio", "warmup", "weight_decay", "open_at",
            "shape", "agents")
    return {k: getattr(args, k) for k in keep}


def train(args: Args) -> tuple[Policy, list[float]]:
    """Run (or resume) the warm start; returns the trained policy and the loss of every step so far."""
    torch.set_num_threads(args.threads)
    shape = {k: int(v) for k, v in (kv.split("=") for kv in args.shape.split(",") if kv)}
    policy = build_tiny(seed=args.seed, **shape)
    model = policy.model.to(args.device)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optim = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                               {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))
    state_dir = Path(f"{args.out}.state")
    state_file = state_dir / STATE
    losses: list[float] = []
    history: list[dict] = []
    if state_file.is_file():
        state = torch.load(state_file, weights_only=False, map_location=args.device)
        if state["settings"] != _resumable(args):
            raise SystemExit(f"{state_file} was saved with other settings: remove it to start again")
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        losses, history = state["losses"], state["history"]
    state_dir.mkdir(parents=True, exist_ok=True)

    held_out = held_out_ids(Path(args.labels) / HELD_OUT)
    data, dropped = load_labels(args.labels, held_out)
    if args.agents:
        only = {int(a) for a in args.agents.split(",")}
        data = {cell: boards for cell, boards in data.items() if cell[0] in only}
    boards = sum(len(b) for b in data.values())
    policy.trained_agents = tuple(sorted({agents for agents, _ in data}))  # said in its envlab.json
    checks = check_boards(args.check_per_cell) if args.eval_every > 0 else []
    params = sum(p.numel() for p in model.parameters())
    print(f"tiny policy: {params:,} parameters; {boards:,} labelled boards in {len(data)} cells "
          f"({dropped} held-out boards dropped); step {len(losses)} of {args.steps}", flush=True)

    def save_state() -> None:
        part = state_dir / f"{STATE}.part"
        torch.save({"settings": _resumable(args), "model": model.state_dict(), "optim": optim.state_dict(),
                    "losses": losses, "history": history}, part)
        part.replace(state_file)

    stop = {"now": False}
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    t0 = time.perf_counter()
    model.train()
    bar = tqdm(range(len(losses), args.steps), desc="warm start", mininterval=10, initial=len(losses),
               total=args.steps)
    try:
        for step in bar:
            cell, instances = step_batch(data, args, step)
            for group in optim.param_groups:
                group["lr"] = lr_at(step, args)
            loss = model(**{k: v.to(args.device) for k, v in batch(policy, instances).items()}).loss
            optim.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optim.step()
            losses.append(loss.item())
            bar.set_postfix(loss=f"{np.mean(losses[-50:]):.3f}", cell=f"{cell[0]}a {cell[1]}x{cell[1]}",
                            refresh=False)
            done = step + 1
            if checks and (done % args.eval_every == 0 or done == args.steps):
                print(f"\nstep {done}, loss {np.mean(losses[-50:]):.4f}", flush=True)
                history.append({"step": done, "valid": check(policy, checks)})
                model.train()
            pause = args.minutes > 0 and (time.perf_counter() - t0) / 60 >= args.minutes or done == args.stop_at
            if done % args.save_every == 0 or done == args.steps or pause or stop["now"]:
                save_state()
                policy.save(args.out)  # a run cut short still leaves its latest checkpoint
            if pause or stop["now"]:
                print(f"\nstopped at step {done} of {args.steps}: run the same command to go on", flush=True)
                break
    finally:
        bar.close()
        signal.signal(signal.SIGTERM, previous)
    (state_dir / "history.json").write_text(json.dumps(history, indent=1) + "\n")
    return policy, losses


if __name__ == "__main__":
    train(command_line(Args, __doc__))
