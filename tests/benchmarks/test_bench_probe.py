"""`benchmarks/bench_probe.py` at a tiny budget (probes of 1 board x 2 answers a size, a learnability proposal of
1 x 1 a cell): the completions each measurement samples, and, read from a study's database, a proposal's seconds
against a training stage's."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

from envsim.config import EnvConfig
from lab.engineers.learnability import grid
from lab.loop import create_run
from lab.study.experiments import load_scenario
from storage.db import make_engine, session, upgrade
from storage.models import Job, JobKind, JobStatus
from storage.settings import RunSettings
from tests.benchmark_scripts import load


def learnability_study(path: Path) -> None:
    """A database with a `learnability` run whose finished jobs took 100 s and 200 s (training stages 1 and 2), 30 s
    and 60 s (proposals), beside the ones the benchmark leaves out: stage 0, a failed job, another arm's."""
    engine = make_engine(str(path))
    upgrade(engine)
    start = datetime(2026, 11, 1, tzinfo=UTC)
    jobs = [("learnability", JobKind.STAGE, 0, 5, JobStatus.DONE),
            ("learnability", JobKind.STAGE, 1, 100, JobStatus.DONE),
            ("learnability", JobKind.STAGE, 2, 200, JobStatus.DONE),
            ("learnability", JobKind.PROPOSE, 0, 30, JobStatus.DONE),
            ("learnability", JobKind.PROPOSE, 1, 60, JobStatus.DONE),
            ("learnability", JobKind.PROPOSE, 2, 999, JobStatus.FAILED),
            ("fixed", JobKind.STAGE, 1, 999, JobStatus.DONE),
            ("fixed", JobKind.PROPOSE, 0, 999, JobStatus.DONE)]
    with session(engine) as s:
        runs = {arm: create_run(s, name=arm, config=EnvConfig.default(), settings=RunSettings(stages=2), arm=arm).id
                for arm in ("learnability", "fixed")}
        for arm, kind, target, seconds, status in jobs:
            s.add(Job(kind=kind, run_id=runs[arm], target=target, status=status, started_at=start,
                      finished_at=start + timedelta(seconds=seconds)))
        s.commit()
    engine.dispose()


def test_each_measurement_samples_what_it_says(request, capsys, tmp_path):
    db = tmp_path / "study.db"
    learnability_study(db)
    bench = load("bench_probe", request)
    bench.main(bench.Args(boards=1, answers=2, learn_boards=1, learn_answers=1, db=str(db)))
    out = capsys.readouterr().out
    for name in ("default", "hard-start"):  # 8 sizes x 1 board x 2 answers
        assert re.search(rf"^probe of `{name}`: 8 sizes x 1 boards x 2 answers = 16 completions in \d+\.\d s; "
                         r"signal share \d+%$", out, re.M), out
    # the config in force and the proposal sample every size; the edit of one size reuses the other seven
    assert ("the Measure panel's three columns (in force, proposed, your edit): 8 + 8 + 1 sizes sampled, "
            "34 completions in") in out
    config = load_scenario("hard-start").config
    cells = len(config.sizes) * len(grid(config.agent_counts[0]))  # one board, one answer a cell
    assert re.search(rf"^a learnability proposal on `hard-start`: {cells} completions, \d+\.\d s probing", out, re.M)
    assert (f"in {db}, arm learnability: a training stage 150 s (mean of 2), a proposal 45 s (mean of 2): 30% of a "
            "stage") in out
