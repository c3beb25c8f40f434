"""What a stage's own process costs: a tiny-policy run (stage 0 evaluated, one proposal, stage 1 trained and
evaluated) with every stage in the worker's process, then with every stage in a child process as `envlab worker`
runs it (`lab.jobs.worker.run_child`): started cold (`ENVLAB_ZYGOTE=0`: a Python process importing torch, transformers
and TRL), then forked from a zygote that imported them once (`lab.jobs.zygote`, started by the run's first stage as a
worker's first job starts it), timed in the same process on the same machine.

A stage's time is its job row's, from the claim to its end, so the child's start-up is inside it. The figures to
quote are the ratios of stage time, in a child against in the worker's process, and the seconds a child adds per
stage, cold and forked.

    OMP_NUM_THREADS=1 python benchmarks/bench_child.py

`--quick` is the CI budget (2 boards, 2 GRPO steps), in the worker's process and forked only: a cold child is the
forked measurement's code with `ENVLAB_ZYGOTE=0`, and costs most of the time (`--cold` adds it).

On this 2-core machine, shared and loaded, 2026-11-24: see docs/worker.md ("What the child costs").
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from sqlmodel import select

from envsim.config import EnvConfig
from envsim.suite import VALIDATION_PER_SIZE
from lab.jobs import zygote
from lab.jobs.worker import WorkerOptions, handlers, run_worker
from lab.loop import after_job, create_run, drive
from storage.db import RUNS_SETTING, make_engine, session, upgrade
from storage.models import Job, JobKind, JobStatus, RunStatus
from storage.settings import RunSettings
from training.evaluate import validation_entries


@dataclass
class Args:
    boards: int = 24  # validation boards per stage
    instances: int = 16  # training boards of stage 1
    steps: int = 4  # GRPO steps of stage 1
    threads: int = 1
    quick: bool = False  # the CI budget: 2 boards, 2 steps, no cold children (unless --cold)
    cold: bool = False  # with --quick, measure cold children too (always measured at the full budget)


def stage_seconds(args: Args, in_child: bool, forked: bool = False) -> list[float]:
    """Each stage job's seconds (claim to end) of one run, its stages in the worker or in child processes (cold,
    or forked from a zygote this measurement starts)."""
    zygote.close_all()
    os.environ[zygote.SETTING] = "1" if forked else "0"
    with tempfile.TemporaryDirectory() as folder:
        engine = make_engine(str(Path(folder) / "lab.db"))
        upgrade(engine)
        grpo = {"max_steps": args.steps, "num_generations": 2, "per_device_train_batch_size": 4}
        with session(engine) as s:
            run = create_run(s, name="bench", config=EnvConfig.default(sizes=(3, 4), num_instances=args.instances),
                             settings=RunSettings(stages=1, auto_apply=True, validation_boards=args.boards, grpo=grpo),
                             engineer="fixed")
        jobs = handlers(in_child=in_child)
        options = WorkerOptions(once=True, after=after_job, poll_s=0.01, run_id=run.id)
        state = drive(engine, run.id, lambda: run_worker(engine, jobs, options) > 0, poll_s=0.01)
        if state.status != RunStatus.DONE:
            raise SystemExit(f"the run ended {state.text}")
        with session(engine) as s:
            rows = s.exec(select(Job).where(Job.kind == JobKind.STAGE, Job.status == JobStatus.DONE)
                          .order_by(Job.target)).all()
        engine.dispose()
        return [(j.finished_at - j.started_at).total_seconds() for j in rows]


def main(args: Args) -> dict[str, float]:
    cold = args.cold or not args.quick
    if args.quick:
        args.boards, args.instances, args.steps = 2, 4, 2
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the children's too
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    before = os.environ.get(RUNS_SETTING)
    with tempfile.TemporaryDirectory() as root:  # one runs root: its validation boards built once, before the clock
        os.environ[RUNS_SETTING] = root
        try:
            validation_entries(Path(root), VALIDATION_PER_SIZE)
            inside = stage_seconds(args, in_child=False)
            child = stage_seconds(args, in_child=True) if cold else None
            forked = stage_seconds(args, in_child=True, forked=True)
        finally:
            zygote.close_all()
            if before is None:
                del os.environ[RUNS_SETTING]
            else:
                os.environ[RUNS_SETTING] = before
    added_forked = [f - i for f, i in zip(forked, inside, strict=True)]
    figures = {"ratio_forked": sum(forked) / sum(inside), "added_forked_s": added_forked}
    print(f"tiny policy, {args.boards} validation boards, stage 1: {args.steps} GRPO steps; {args.threads} thread(s)")
    for k, (i, f) in enumerate(zip(inside, forked, strict=True)):
        c = f"{child[k]:.1f} s in a cold child (+{child[k] - i:.1f} s), " if child else ""
        print(f"stage {k}: {i:.1f} s in the worker's process, {c}{f:.1f} s in a forked child (+{f - i:.1f} s)")
    if child:
        added = [c - i for c, i in zip(child, inside, strict=True)]
        figures |= {"ratio": sum(child) / sum(inside), "added_s": sum(added) / len(added)}
        print(f"stages in cold child processes / in the worker's process: {figures['ratio']:.2f}x; a cold child adds "
              f"{figures['added_s']:.1f} s per stage")
    else:
        print("stages in cold child processes: not measured at this budget (--quick; --cold adds them)")
    print(f"stages in forked child processes / in the worker's process: {figures['ratio_forked']:.2f}x; a forked "
          f"child adds {sum(added_forked) / len(added_forked):.1f} s per stage, the first (the zygote's start) "
          f"{added_forked[0]:.1f} s ({time.perf_counter() - t0:.0f} s in all)")
    return figures


if __name__ == "__main__":
    from flags import parse

    main(parse(Args, __doc__))
