"""Experiment throughput: runs per hour of one experiment with one worker process and with two (two `envlab worker`
processes sharing one SQLite database, as `envlab experiment run NAME --workers 2` starts them).

Both figures come from the same script on the same budget, each on a fresh database (the validation set and
the tiny policy are the same files), so their ratio holds on a loaded machine even where the runs per hour do
not. Each worker gets `--threads` torch threads (OMP_NUM_THREADS; default 1, the fastest setting for the tiny
policy on a shared 2-core machine, docs/training.md; 0: cores / workers). With `--quick` the budget is tiny
(1 stage of 8 boards, 1 GRPO step, 8 validation boards) and the figure is mostly the workers' start-up
(importing torch and TRL) and the database: a check that the path works and what a run costs at least.
Without it: the default experiment (3 arms x 3 seeds x 3 stages of 512 boards, 960 validation boards), hours
on a CPU.

    python benchmarks/bench_experiment.py --quick
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from envsim.config import EnvConfig
from lab.study.experiments import create_experiment, experiment_runs, run_experiment
from storage.db import make_engine, upgrade
from storage.models import RunStatus
from storage.settings import RunSettings

QUICK = dict(arms="fixed,heuristic", seeds=2, stages=1, instances=8, validation_per_size=30, validation_boards=8,
             grpo="num_generations=2,per_device_train_batch_size=16")


@dataclass
class Study:
    """What an experiment benchmark measures: the shipped study's shape by default (`bench_slurm.py` too)."""
    arms: str = "fixed,random,heuristic"
    seeds: int = 3
    stages: int = 3
    instances: int = 512
    validation_per_size: int = 120
    validation_boards: int = 0  # 0: the whole validation set
    grpo: str = ""  # k=v,k=v
    threads: int = 1
    quick: bool = False


@dataclass
class Args(Study):
    workers: str = "1,2"


def grpo_of(text: str) -> dict:
    pairs = [p.partition("=") for p in text.split(",") if p]
    return {k: int(v) if v.isdigit() else v for k, _, v in pairs}


def runs_per_hour(args: Args, workers: int, config: EnvConfig) -> tuple[float, float, int]:
    """(runs per hour, seconds, runs done) of one experiment on a fresh SQLite database with `workers` workers."""
    with tempfile.TemporaryDirectory() as folder:
        db = str(Path(folder) / "lab.db")
        engine = make_engine(db)
        upgrade(engine)
        experiment = create_experiment(engine, name="bench", arms=args.arms.split(","), seeds=args.seeds,
                                       config=config, settings=RunSettings(
                                           stages=args.stages, validation_per_size=args.validation_per_size,
                                           validation_boards=args.validation_boards or None, grpo=grpo_of(args.grpo)))
        t0 = time.perf_counter()
        run_experiment(engine, db, "bench", workers=workers, poll_s=0.5,
                       threads=args.threads or max(1, (os.cpu_count() or 1) // workers))
        seconds = time.perf_counter() - t0
        done = sum(r.status == RunStatus.DONE for r in experiment_runs(engine, experiment.id))
        engine.dispose()
    return done / seconds * 3600, seconds, done


def main(args: Args) -> None:
    if args.quick:
        args = Args(**{**vars(args), **QUICK})
    config = EnvConfig.default(num_instances=args.instances)
    print(f"experiment: arms {args.arms}, {args.seeds} seeds, {args.stages} stages of {args.instances} boards, "
          f"validation {args.validation_per_size} per size" + (f" ({args.validation_boards} boards used)"
                                                               if args.validation_boards else "")
          + f", GRPO {grpo_of(args.grpo) or 'defaults'}; {os.cpu_count()} cores, "
          + (f"{args.threads} torch thread(s) per worker" if args.threads else "cores / workers threads per worker"))
    figures = {}
    for workers in map(int, args.workers.split(",")):
        figures[workers] = runs_per_hour(args, workers, config)
        rate, seconds, done = figures[workers]
        print(f"{workers} worker(s): {rate:7.1f} runs/hour ({done} runs in {seconds:.0f} s)", flush=True)
    if 1 in figures and 2 in figures:
        print(f"ratio 2 workers / 1 worker: {figures[2][0] / figures[1][0]:.2f}x")


if __name__ == "__main__":
    from flags import parse

    main(parse(Args, __doc__))
