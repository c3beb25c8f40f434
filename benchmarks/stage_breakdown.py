"""Where a stage's time goes: one small run of the tiny policy (stage 0 evaluated, one GRPO stage, evaluated again)
on boards of 3 to 5 agents, in the worker's process, with a clock on each part: loading the policy, making the
training boards, GRPO's set-up, its rollouts (token generation), reward scoring, log-prob passes and the rest of
its step (loss, backward, optimizer), saving the policy, the validation and dev boards' sets, their evaluations
(token generation apart), storing the episodes, and database commits. Each part's time is its own, without the
parts inside it (the clock is a stack), so the rows add up to the run; "other" is what no clock covers (the
worker, the queue, the engineer, TRL's work outside its step).

    OMP_NUM_THREADS=1 python benchmarks/stage_breakdown.py                 # 64 boards, 16 GRPO steps, 210 boards
    OMP_NUM_THREADS=1 python benchmarks/stage_breakdown.py --steps 4 --boards 24 --instances 16

`--quick` is the CI budget (1 GRPO step, 6 validation boards, dev boards of 3 agents only): it checks that every
clock is reached and the rows add up, not the shares.
"""

from __future__ import annotations

import functools
import os
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from sqlalchemy.orm import Session
from transformers.generation.utils import GenerationMixin
from trl import GRPOTrainer

import training.decode
import training.evaluate
import training.stage
from envsim.config import EnvConfig
from lab.jobs.worker import WorkerOptions, handlers, run_worker
from lab.loop import after_job, create_run, drive
from storage.db import RUNS_SETTING, make_engine, upgrade
from storage.models import RunStatus
from storage.settings import RunSettings

AGENTS = {3: 1 / 3, 4: 1 / 3, 5: 1 / 3}
SIZES = (5, 6, 7, 8)


@dataclass
class Args:
    boards: int = 210  # validation boards per evaluation (3 to 5 agents)
    dev: int = 3  # dev boards per (agent count, size)
    validation_agents: str = "3,4,5"  # the agent counts of the validation and dev boards
    instances: int = 64  # training boards of stage 1
    steps: int = 16  # GRPO steps of stage 1
    generations: int = 8  # completions per board (GRPO's group)
    threads: int = 1
    quick: bool = False  # the CI budget: 1 GRPO step, 6 validation boards, dev boards of 3 agents


class Clock:
    """Time spent in each wrapped callable, its own (the callables it calls, wrapped too, counted apart), by the
    path of wrapped callables it ran under ("evaluation > token generation")."""

    def __init__(self) -> None:
        self.own: dict[str, float] = defaultdict(float)
        self.calls: Counter[str] = Counter()
        self.inclusive: dict[str, float] = defaultdict(float)  # by label, the callables inside it included
        self.label_calls: Counter[str] = Counter()
        self._stack: list[list[Any]] = []  # [label, time of the wrapped callables inside it]

    def wrap(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            path = " > ".join([*(frame[0] for frame in self._stack[-1:]), label])
            self._stack.append([label, 0.0])
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                _, inside = self._stack.pop()
                self.own[path] += elapsed - inside
                self.calls[path] += 1
                if label not in (frame[0] for frame in self._stack):  # a recursive call is counted once
                    self.inclusive[label] += elapsed
                    self.label_calls[label] += 1
                if self._stack:
                    self._stack[-1][1] += elapsed

        return timed


# (label, owner, attribute): what the clock wraps; a module's name is looked up where the stage calls it
CLOCKED: tuple[tuple[str, Any, str], ...] = (
    ("loading the policy", training.stage, "load_policy"),
    ("training boards", training.stage, "generate"),
    ("evaluation", training.evaluate, "evaluate"),
    ("validation boards", training.evaluate, "validation_entries"),
    ("dev boards", training.evaluate, "dev_entries"),
    ("storing episodes", training.evaluate, "store_episodes"),
    ("storing the whole evaluation", training.evaluate, "store_whole"),
    ("GRPO set-up", GRPOTrainer, "__init__"),
    ("saving the policy", GRPOTrainer, "save_model"),
    ("rollouts", GRPOTrainer, "_generate"),
    ("rewards", GRPOTrainer, "_calculate_rewards"),
    ("log-probs", GRPOTrainer, "_get_per_token_logps_and_entropies"),
    ("GRPO step", GRPOTrainer, "training_step"),
    ("token generation", GenerationMixin, "generate"),
    ("token generation", training.decode, "decode"),  # the decode loop (training.decode)
    ("token generation", training.decode, "decode_drafted"),  # and the loop with drafts, the default
    ("backward", torch.Tensor, "backward"),
    ("optimizer", torch.optim.AdamW, "step"),
    ("database commits", Session, "commit"),
)


@contextmanager
def clocked(clock: Clock) -> Iterator[None]:
    """Every callable of `CLOCKED` wrapped by `clock` while inside; put back after."""
    saved = [(owner, name, owner.__dict__[name] if name in vars(owner) else getattr(owner, name))
             for _, owner, name in CLOCKED]
    try:
        for label, owner, name in CLOCKED:
            setattr(owner, name, clock.wrap(label, getattr(owner, name)))
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def run_once(args: Args, clock: Clock) -> tuple[float, int]:
    """One run, stage 0 and one GRPO stage, in this process: its seconds and the GRPO steps it took."""
    with tempfile.TemporaryDirectory() as folder:
        os.environ[RUNS_SETTING] = str(Path(folder) / "runs")
        engine = make_engine(str(Path(folder) / "lab.db"))
        upgrade(engine)
        config = EnvConfig.default(sizes=SIZES, num_instances=args.instances).model_copy(update={"agent_ratio": AGENTS})
        grpo = {"max_steps": args.steps, "num_generations": args.generations,
                "per_device_train_batch_size": args.generations}
        settings = RunSettings(stages=1, auto_apply=True, validation_boards=args.boards, dev_per_size=args.dev,
                               agent_counts=tuple(AGENTS), grpo=grpo,
                               validation_agents=tuple(int(k) for k in args.validation_agents.split(",")))
        from storage.db import session

        with session(engine) as s:
            run = create_run(s, name="breakdown", config=config, settings=settings, engineer="fixed")
        options = WorkerOptions(once=True, after=after_job, poll_s=0.01, run_id=run.id)
        start = time.perf_counter()
        with clocked(clock):
            state = drive(engine, run.id, lambda: run_worker(engine, handlers(in_child=False), options) > 0,
                          poll_s=0.01)
        seconds = time.perf_counter() - start
        engine.dispose()
    if state.status != RunStatus.DONE:
        raise SystemExit(f"the run ended {state.text}")
    return seconds, clock.label_calls["GRPO step"]


def main(args: Args) -> dict[str, float]:
    if args.quick:
        args.boards, args.instances, args.steps, args.generations, args.validation_agents = 6, 4, 1, 4, "3"
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    torch.set_num_threads(args.threads)
    before = os.environ.get(RUNS_SETTING)
    clock = Clock()
    try:
        seconds, steps = run_once(args, clock)
    finally:
        if before is None:
            os.environ.pop(RUNS_SETTING, None)
        else:
            os.environ[RUNS_SETTING] = before
    rows = dict(sorted(clock.own.items(), key=lambda kv: -kv[1]))
    rows["other"] = seconds - sum(rows.values())
    print(f"tiny policy, agents 3-5, sizes {SIZES[0]}-{SIZES[-1]}; stage 1: {args.instances} boards, {steps} GRPO "
          f"steps of {args.generations} completions; {args.boards} validation boards and {args.dev} dev boards a "
          f"cell per evaluation; {args.threads} thread(s); {seconds:.1f} s in all")
    print(f"{'part (its own time)':58} {'seconds':>8} {'share':>6} {'calls':>6}")
    for path, own in rows.items():
        print(f"{path:58} {own:8.1f} {own / seconds:6.1%} {clock.calls.get(path, 0):6d}")
    if steps:
        print(f"a GRPO step: {clock.inclusive['GRPO step'] / steps:.2f} s, of which its rollouts "
              f"{clock.inclusive['rollouts'] / steps:.2f} s (token generation "
              f"{rows.get('rollouts > token generation', 0.0) / steps:.2f} s)")
    return {"seconds": seconds, "steps": steps, "step_s": clock.inclusive["GRPO step"] / max(steps, 1), **rows}


if __name__ == "__main__":
    from flags import parse

    main(parse(Args, __doc__))
