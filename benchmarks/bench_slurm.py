"""Experiment throughput on Slurm: runs per hour of one experiment whose workers are the tasks of a Slurm job array
(`envlab experiment run NAME --slurm`), with 1 array task and with 2, measured side by side.

Both figures come from the same script on the same budget and the same cluster, each on a fresh SQLite database,
so their ratio holds on a loaded machine even where the runs per hour do not. The clock runs from the array's
submission to the last run's end (Slurm's scheduling and each task's start-up included); the tasks of one
measurement have exited before the next starts. Each task asks for `--cpus` CPUs and runs `--threads` torch
threads (default 1 and 1). With `--quick` the budget is tiny (1 stage of 8 boards, 1 GRPO step, 8 validation
boards, as `bench_experiment.py --quick`): the figure is mostly the tasks' start-up and the database.

The cluster: the one `SLURM_CONF` (or Slurm's default configuration) names; with `--local-cluster`, a one-node
cluster of this machine's own, started for the measurement and stopped after it (root, Debian's slurmctld, slurmd
and munge: tests/slurm_cluster.py).

    sudo python benchmarks/bench_slurm.py --quick --local-cluster
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench_experiment import QUICK, Study, grpo_of

from envsim.config import EnvConfig
from lab.study.experiments import create_experiment, experiment_runs
from lab.study.slurm import SlurmOptions, experiment_arrays, run_on_slurm, sweep
from storage.db import make_engine, upgrade
from storage.models import RunStatus
from storage.settings import RunSettings


@dataclass
class Args(Study):
    tasks: str = "1,2"
    cpus: int = 1
    partition: str = ""
    gpus: int = 0
    local_cluster: bool = False


def runs_per_hour(args: Args, tasks: int, config: EnvConfig, root: Path) -> tuple[float, float, int]:
    """(runs per hour, seconds, runs done) of one experiment on a fresh SQLite database under `root` (a folder the
    nodes see) with an array of `tasks` tasks."""
    folder = Path(tempfile.mkdtemp(prefix=f"bench-slurm-{tasks}-", dir=root))
    db = str(folder / "lab.db")
    os.environ["ENVLAB_RUNS"] = str(folder)
    engine = make_engine(db)
    upgrade(engine)
    settings = RunSettings(stages=args.stages, auto_apply=True, validation_per_size=args.validation_per_size,
                           validation_boards=args.validation_boards or None, grpo=grpo_of(args.grpo), dev_per_size=3)
    experiment = create_experiment(engine, name="bench", arms=args.arms.split(","), seeds=args.seeds,
                                   settings=settings, config=config)
    options = SlurmOptions(tasks=tasks, cpus=args.cpus, threads=args.threads, idle_exit=2,
                           partition=args.partition or None, gpus=args.gpus)
    t0 = time.perf_counter()
    run_on_slurm(engine, db, "bench", options, poll_s=0.5, wait_for_tasks_s=0)
    seconds = time.perf_counter() - t0
    runs = experiment_runs(engine, experiment.id)
    done = sum(r.status == RunStatus.DONE for r in runs)
    deadline = time.monotonic() + 120  # the next measurement starts on a quiet cluster
    arrays = experiment_arrays(engine, experiment.id)
    while time.monotonic() < deadline and sweep(engine, arrays, [r.id for r in runs]).alive:
        time.sleep(0.5)
    engine.dispose()
    return done / seconds * 3600, seconds, done


def main(args: Args) -> None:
    if args.quick:  # the tiny budget, where the command line left a field at its default
        args = Args(**{**vars(args), **{k: v for k, v in QUICK.items() if getattr(args, k) == getattr(Args(), k)}})
    cluster = None
    if args.local_cluster:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from tests import slurm_cluster

        cluster = slurm_cluster.start()
        os.environ.update(cluster.env)
    try:
        config = EnvConfig.default(num_instances=args.instances)
        print(f"experiment: arms {args.arms}, {args.seeds} seeds, {args.stages} stages of {args.instances} boards, "
              f"validation {args.validation_per_size} per size"
              + (f" ({args.validation_boards} boards used)" if args.validation_boards else "")
              + f", GRPO {grpo_of(args.grpo) or 'defaults'}; {os.cpu_count()} cores here; each array task "
              f"{args.cpus} CPU(s), {args.threads} torch thread(s)", flush=True)
        figures = {}
        with tempfile.TemporaryDirectory(prefix="bench-slurm-", dir=os.environ.get("ENVLAB_BENCH_ROOT")) as root:
            for tasks in map(int, args.tasks.split(",")):
                figures[tasks] = runs_per_hour(args, tasks, config, Path(root))
                rate, seconds, done = figures[tasks]
                print(f"{tasks} array task(s): {rate:7.1f} runs/hour ({done} runs in {seconds:.0f} s)", flush=True)
        if 1 in figures and 2 in figures:
            print(f"ratio 2 tasks / 1 task: {figures[2][0] / figures[1][0]:.2f}x")
    finally:
        if cluster is not None:
            cluster.stop()


if __name__ == "__main__":
    from flags import parse

    main(parse(Args, __doc__))
