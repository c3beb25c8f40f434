"""What evaluating stage 0 once saves: an experiment's stage-0 jobs on one database, where the runs share the
first run's evaluation (`training.shared`), against the same runs each on a database of its own, where every run
evaluates the starting policy again (the path without sharing).

Both figures come from the same script on the same boards, the same tiny policy and one in-process worker with
`--threads` torch threads, after one stage 0 that is not counted (the imports, the board sets built once per
process), so their ratio holds on a loaded machine even where the seconds do not. Only stage 0 runs (no `after`
hook queues what comes next). The stage-0 episodes of every run are compared with the unshared ones: the script
fails if any differs.

    OMP_NUM_THREADS=1 python benchmarks/bench_stage0.py --seeds 3 --arms fixed,heuristic
    OMP_NUM_THREADS=1 python benchmarks/bench_stage0.py --quick   # 2 arms x 2 seeds, 8 + 63 boards
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from sqlmodel import select

from envsim.config import EnvConfig
from envsim.suite import DEV_PER_SIZE, Split, boards_in
from lab.jobs.worker import WorkerOptions, run_worker
from lab.study.experiments import create_experiment, experiment_runs
from storage.db import make_engine, session, upgrade
from storage.models import Episode, Evaluation
from storage.settings import RunSettings
from training.stage import run_stage_job

QUICK = dict(seeds=2, validation_boards=8, dev_per_size=3)


@dataclass
class Args:
    arms: str = "fixed,heuristic"
    seeds: int = 3
    validation_per_size: int = 30
    validation_boards: int = 0  # 0: the whole validation set
    dev_per_size: int = DEV_PER_SIZE
    threads: int = 1
    quick: bool = False


@dataclass(frozen=True)
class Figure:
    seconds: float
    runs: int
    generated: int  # runs whose stage 0 generated its answers (the others copied them)
    episodes: list[list[tuple[str, str, str]]]  # per run, seed-major: (split, board, completion)


def stage0(args: Args, folder: Path, arms: list[str], seeds: int, name: str) -> Figure:
    """Stage 0 of every run of one experiment of `arms` x `seeds` on a fresh database in `folder`."""
    engine = make_engine(str(folder / f"{name}.db"))
    upgrade(engine)
    experiment = create_experiment(engine, name=name, arms=arms, seeds=seeds, config=EnvConfig.default(), settings=(
        RunSettings(stages=1, validation_per_size=args.validation_per_size, dev_per_size=args.dev_per_size,
                    validation_boards=args.validation_boards or None)))
    t0 = time.perf_counter()
    ran = run_worker(engine, {"stage": run_stage_job}, WorkerOptions(poll_s=0.01, once=True))
    seconds = time.perf_counter() - t0
    runs = experiment_runs(engine, experiment.id)
    with session(engine) as s:
        episodes = [[(e.split, e.instance_id, e.completion) for e in s.exec(
            select(Episode).where(Episode.run_id == r.id).order_by(Episode.id))] for r in runs]
        copied = {e.run_id for e in s.exec(select(Evaluation).where(Evaluation.source_run_id.is_not(None)))}
    engine.dispose()
    assert ran == len(runs), f"{ran} of {len(runs)} stage-0 jobs ran"
    return Figure(seconds, len(runs), len(runs) - len(copied), episodes)


def main(args: Args) -> None:
    if args.quick:
        args = Args(**{**vars(args), **QUICK})
    torch.set_num_threads(args.threads)
    arms = args.arms.split(",")
    boards = (f"{args.validation_boards or boards_in(Split.VALIDATION, args.validation_per_size)} validation + "
              f"{boards_in(Split.DEV, args.dev_per_size)} dev")
    print(f"stage 0 of an experiment: arms {','.join(arms)} x {args.seeds} seeds, tiny policy, {boards} boards, "
          f"{args.threads} torch thread(s)")
    with tempfile.TemporaryDirectory() as folder:
        stage0(args, Path(folder), arms[:1], 1, "warm-up")  # imports, the board sets, the first load: not counted
        shared = stage0(args, Path(folder), arms, args.seeds, "shared")
        alone = [stage0(args, Path(folder), [arm], 1, f"alone-{seed}-{arm}")
                 for seed in range(args.seeds) for arm in arms]
    unshared = sum(f.seconds for f in alone)
    assert shared.episodes == [e for f in alone for e in f.episodes], "a shared stage 0 differs from its run alone"
    print(f"shared (one database): {shared.seconds:6.1f} s for {shared.runs} runs, {shared.generated} generated")
    print(f"unshared (a database per run): {unshared:6.1f} s for {len(alone)} runs, {len(alone)} generated")
    print(f"ratio shared / unshared: {shared.seconds / unshared:.2f} (stage-0 episodes identical)")


if __name__ == "__main__":
    from flags import parse

    main(parse(Args, __doc__))
