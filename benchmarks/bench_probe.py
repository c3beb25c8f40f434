"""What measuring costs: the probe of a config over the 8 map sizes, a `learnability` proposal, and (with `--db`) a
proposal against the stage it precedes, timed in the same experiment on the same machine.

The probe's defaults (`training.probe`: 8 boards per size, 8 sampled answers each, 512 completions) should take at
most 15 s on one CPU thread; a learnability proposal (sampling for learnability: 8 sizes x 6 cells x 16 boards x
4 answers, 3,072 completions) at most a quarter of a default stage's wall time. Stage and proposal times come
from the job rows of an experiment's `learnability` runs (`--db`), which ran side by side on the same worker, so
their ratio holds on a loaded machine even where the seconds do not.

    OMP_NUM_THREADS=1 python benchmarks/bench_probe.py --db runs/hardstart/study.db

`--boards`/`--answers` set the probe's size (default the probe's, `training.probe`) and `--learn-boards`/
`--learn-answers` the learnability proposal's (default the engineer's, `lab.engineers.learnability`): smaller for a
quick check of the path.

On this 2-core machine, 2026-11-24, once its load had dropped (load average 4): a scenario's probe 9.0 s
(`default` and `hard-start`), a proposal of the learnability engineer SFL replaced (1,024 completions) 15.4 s of
probing; in the `hardstart` study's learnability runs (the machine loaded), such a proposal took 7% of a training
stage's wall time (docs/results/README.md). An SFL proposal on `hard-start` took 2.8x the replaced one's seconds
in the same run (500 s against 177 s at a load average of 10): about 43 s at load 4.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
from sqlmodel import select

from lab.context import Evidence, StageResult
from lab.engineers import LEARN_ANSWERS, LEARN_BOARDS, learnability
from lab.study.experiments import load_scenario
from storage.db import make_engine, session
from storage.models import Job, JobKind, JobStatus, Run
from training.policy import load_policy
from training.probe import PROBE_ANSWERS, PROBE_BOARDS, probe_config


@dataclass
class Args:
    threads: int = 1
    seed: int = 0
    db: str = ""  # an experiment's database with a `learnability` arm: its stage and propose jobs, timed
    arm: str = "learnability"
    boards: int = PROBE_BOARDS  # per size, in the probes and the Measure panel's columns
    answers: int = PROBE_ANSWERS  # per board
    learn_boards: int = LEARN_BOARDS  # per (size, cell), in the learnability proposal
    learn_answers: int = LEARN_ANSWERS


def main(args: Args) -> None:
    torch.set_num_threads(args.threads)
    policy = load_policy("tiny")
    print(f"tiny policy, {args.threads} torch thread(s)")
    for name in ("default", "hard-start"):
        config = load_scenario(name).config
        result = probe_config(policy, config, seed=args.seed, boards=args.boards, answers=args.answers)
        print(f"probe of `{name}`: {len(config.sizes)} sizes x {args.boards} boards x {args.answers} answers = "
              f"{result.completions} "
              f"completions in {result.seconds:.1f} s; signal share {result.signal_share:.0%}")
    three_columns(policy, args.seed, args.boards, args.answers)
    config = load_scenario("hard-start").config
    t0 = time.perf_counter()
    answer = learnability(Evidence(StageResult(0, config, {})), seed=args.seed, probe_fn=lambda c: probe_config(
        policy, c, seed=args.seed, boards=args.learn_boards, answers=args.learn_answers))
    print(f"a learnability proposal on `hard-start`: {answer.compute['completions']} completions, "
          f"{answer.compute['seconds']:.1f} s probing, {time.perf_counter() - t0:.1f} s in all")
    if args.db:
        stage_s, propose_s = job_seconds(args.db, args.arm)
        if stage_s and propose_s:
            stage, propose = statistics.mean(stage_s), statistics.mean(propose_s)
            print(f"in {args.db}, arm {args.arm}: a training stage {stage:.0f} s (mean of {len(stage_s)}), a proposal "
                  f"{propose:.0f} s (mean of {len(propose_s)}): {propose / stage:.0%} of a stage")


def three_columns(policy, seed: int, boards: int = PROBE_BOARDS, answers: int = PROBE_ANSWERS) -> float:
    """The Measure panel's three columns at a probe size (default the probe's), as its job measures them (`measure`,
    on a fresh table): the config in force (`default`), a proposal that changes every size (`hard-start`, the worst
    case) and a person's edit of it that changes one size, whose other seven sizes are reused."""
    import tempfile
    from pathlib import Path

    from storage.db import upgrade
    from training.probe import measure

    in_force, proposed = load_scenario("default").config, load_scenario("hard-start").config
    size = max(proposed.sizes)
    edit = proposed.model_copy(update={"hole_ratio": {**proposed.hole_ratio, size: 0.1}})
    with tempfile.TemporaryDirectory() as folder:
        engine = make_engine(str(Path(folder) / "probes.db"))
        upgrade(engine)
        t0 = time.perf_counter()
        results = [measure(engine, c, "tiny", policy=policy, seed=seed, boards=boards, answers=answers)
                   for c in (in_force, proposed, edit)]
        seconds = time.perf_counter() - t0
        engine.dispose()
    sampled = " + ".join(f"{len(r.sizes) - r.reused}" for r in results)
    print(f"the Measure panel's three columns (in force, proposed, your edit): {sampled} sizes sampled, "
          f"{sum(r.completions for r in results)} completions in {seconds:.1f} s (target <= 30 s on one thread)")
    return seconds


def job_seconds(db: str, arm: str) -> tuple[list[float], list[float]]:
    """Wall seconds of the arm's finished training-stage jobs (stage 1 on) and propose jobs."""
    engine = make_engine(db)
    with session(engine) as s:
        jobs = s.exec(select(Job).join(Run, Run.id == Job.run_id).where(Run.arm == arm,
                                                                          Job.status == JobStatus.DONE)).all()
    seconds = {kind: [(j.finished_at - j.started_at).total_seconds() for j in jobs
                      if j.kind == kind and (kind != JobKind.STAGE or j.target > 0)]
               for kind in (JobKind.STAGE, JobKind.PROPOSE)}
    return seconds[JobKind.STAGE], seconds[JobKind.PROPOSE]


if __name__ == "__main__":
    from flags import parse

    main(parse(Args, __doc__))
