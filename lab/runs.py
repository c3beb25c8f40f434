"""What the web lab reads about runs: the run list, a stage's review, episodes, a run's progress, benchmark
results.

Each function opens its own session on `engine`, reads in it and returns plain values or rows that stay
readable afterwards (`storage.db.session` keeps them loaded), so the page holds no query of its own. A
stage's rates come from `lab.results` like everywhere else.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, func
from sqlmodel import Session, select

from envsim.config import EnvConfig
from envsim.instance import Instance
from envsim.suite import Entry, Report, Split, report
from lab.loop import create_run, jobs_of, set_auto_apply, stages_of
from lab.proposals import Change, current_proposal, decision_of, diff
from lab.results import StageSummary, stage_summaries
from storage.db import UnsafePath, run_folder, session
from storage.models import (
    Action,
    Decision,
    Episode,
    Evaluation,
    Job,
    Proposal,
    Run,
    RunStatus,
    Stage,
    StageMetric,
    StageStatus,
    TrainingLog,
)
from training import trackers


@dataclass(frozen=True)
class RunRow:
    """A run in the run list, with how many of its training stages are done (stage 0 is not trained) and the
    bytes its folder holds on disk (None: it has no folder here)."""

    run: Run
    trained: int
    disk: int | None = None


_DISK: dict[str, tuple[tuple[int, ...], int]] = {}  # a run folder -> (its folders' mtimes, its bytes)


def disk_use(folder: Path) -> int | None:
    """The bytes under `folder` (links not followed), or None when there is no such folder. Cheap on every poll:
    a run's files are written into its stage folders, so the sum is reused while neither the run folder's nor a
    stage folder's (nor their subfolders') modification times changed."""
    if not folder.is_dir():
        return None
    dirs = [folder, *(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink())]
    dirs += [p for d in dirs[1:] for p in d.iterdir() if p.is_dir() and not p.is_symlink()]
    key = tuple(d.stat().st_mtime_ns for d in dirs)
    cached = _DISK.get(str(folder))
    if cached is not None and cached[0] == key:
        return cached[1]
    total, stack = 0, [folder]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
                else:
                    total += entry.stat(follow_symlinks=False).st_size
    _DISK[str(folder)] = (key, total)
    return total


def _run_disk(engine: Engine, run: Run) -> int | None:
    try:
        return disk_use(run_folder(engine, run.uuid))
    except (UnsafePath, OSError):
        return None


def run_list(engine: Engine) -> list[RunRow]:
    """Every run, newest first."""
    with session(engine) as s:
        runs = list(s.exec(select(Run).order_by(Run.id.desc())))
        done = dict(s.exec(select(Stage.run_id, func.count()).where(Stage.status == StageStatus.DONE)
                           .group_by(Stage.run_id)).all())  # one query, not a run's stages each
    return [RunRow(r, max(done.get(r.id, 0) - 1, 0), _run_disk(engine, r)) for r in runs]


@dataclass(frozen=True)
class LabVersion:
    """What the page has drawn, in a few numbers: when one part differs from the last poll's, the page redraws
    what depends on it, and nothing else. Each part grows (or changes) with every row that matters to it."""

    runs: tuple[tuple[int, str], ...]  # (id, status) of every run
    proposals: tuple[int, int]  # the newest proposal id, the newest decision id
    stages: tuple[int, int]  # the newest stage id, how many stages are done
    jobs: tuple[int, str]  # the newest job id, the latest heartbeat or end of any job


def lab_version(engine: Engine) -> LabVersion:
    """A cheap read of what changed in the database (the page polls it every few seconds): a few aggregates."""
    with session(engine) as s:
        runs = tuple((i, str(status)) for i, status in s.exec(select(Run.id, Run.status).order_by(Run.id)))
        proposal = s.exec(select(func.max(Proposal.id))).one() or 0
        decision = s.exec(select(func.max(Decision.id))).one() or 0
        stage, done = s.exec(select(func.max(Stage.id), func.count(Stage.id).filter(
            Stage.status == StageStatus.DONE))).one()
        job, beat, end = s.exec(select(func.max(Job.id), func.max(Job.heartbeat_at), func.max(Job.finished_at))).one()
    return LabVersion(runs, (proposal, decision), (stage or 0, done or 0), (job or 0, f"{beat}|{end}"))


@dataclass(frozen=True)
class Waiting:
    """A proposal that waits for a person: its run's current proposal, undecided, the run not auto-applying."""

    proposal_id: int
    run_id: int
    run_name: str
    for_stage: int
    failed: bool  # the engineer's answer failed: it waits for an edit or a rejection


def waiting_proposals(engine: Engine) -> list[Waiting]:
    """Every proposal that waits for a decision, across runs, oldest run first."""
    out = []
    with session(engine) as s:
        for run in s.exec(select(Run).where(Run.status == RunStatus.WAITING).order_by(Run.id)):
            p = current_proposal(s, run.id)
            if p is not None and decision_of(s, p.id) is None:
                out.append(Waiting(p.id, run.id, run.name, p.after_stage + 1, p.error is not None))
    return out


def new_run(engine: Engine, **options: Any) -> Run:
    """`lab.loop.create_run` in a transaction of its own: the run, its stage 0, and that stage's job queued."""
    with session(engine) as s:
        return create_run(s, **options)


def set_run_auto_apply(engine: Engine, run_id: int, on: bool) -> None:
    with session(engine) as s:
        set_auto_apply(s, run_id, on)


def run_of_proposal(engine: Engine, proposal_id: int) -> int | None:
    with session(engine) as s:
        proposal = s.get(Proposal, proposal_id)
    return proposal.run_id if proposal else None


def run_of_episode(engine: Engine, episode_id: int) -> int | None:
    with session(engine) as s:
        episode = s.get(Episode, episode_id)
    return episode.run_id if episode else None


# ---------------------------------------------------------------- a stage's review


@dataclass(frozen=True)
class StageReview:
    """What the Stage review tab shows of a run: its stages and their validation summaries, the decision each
    stage's config came from, and for the chosen stage its training log and the failure types it shows."""

    stages: list[Stage]
    summaries: dict[int, StageSummary]
    decided: dict[int, tuple[Proposal, Decision]]  # stage k+1 -> the proposal after stage k and its decision
    stage_index: int | None  # the chosen stage: the one asked for, else the latest evaluated, else the last
    logs: list[tuple[int, dict[str, Any]]]  # (step, metrics) in step order
    failure_kinds: list[str]


def stage_review(engine: Engine, run_id: int, stage_index: int | None) -> StageReview:
    with session(engine) as s:
        stages = stages_of(s, run_id)
        summaries = stage_summaries(s, run_id)
        decided = _decided(s, run_id)
        if stage_index is None or stage_index not in [stage.index for stage in stages]:
            evaluated = [stage.index for stage in stages if stage.index in summaries]
            stage_index = evaluated[-1] if evaluated else (stages[-1].index if stages else None)
        logs = [] if stage_index is None else [
            (log.step, log.metrics) for log in s.exec(select(TrainingLog).where(
                TrainingLog.run_id == run_id, TrainingLog.stage_index == stage_index).order_by(TrainingLog.step))]
        kinds = sorted(s.exec(select(Episode.failure).where(
            Episode.run_id == run_id, Episode.stage_index == stage_index, Episode.failure.is_not(None)).distinct()))
    return StageReview(stages, summaries, decided, stage_index, logs, kinds)


def _decided(s: Session, run_id: int) -> dict[int, tuple[Proposal, Decision]]:
    """Stage k+1's config came from the decision on a proposal made after stage k (not a rejection)."""
    rows = s.exec(select(Proposal, Decision).join(Decision, Decision.proposal_id == Proposal.id)
                  .where(Proposal.run_id == run_id).order_by(Proposal.id))
    return {p.after_stage + 1: (p, d) for p, d in rows if d.action != Action.REJECT}


class Setter(StrEnum):
    """Who set a value of a stage's config."""

    ENGINEER = "engineer"  # the engineer proposed it and a person accepted it (or kept it in an edit)
    PERSON = "person"  # a person's edit changed the engineer's value
    AUTO = "auto-apply"  # the run applied the engineer's proposal by itself


@dataclass(frozen=True)
class ConfigStep:
    """The config one stage trained on, where it came from (`origin`, and `by`: who decided, when a decision made it),
    and who set each value that changed from the stage before (`set_by`: field, e.g. `wait_ratio[3]` or
    `agent_ratio[2]`, to its setter; `changes`: those values, old and new)."""

    stage_index: int
    origin: str
    config: EnvConfig
    set_by: dict[str, Setter]
    changes: tuple[Change, ...] = ()
    by: str | None = None

    @property
    def source(self) -> str:
        """Where the config came from and who decided: `proposal #4, accepted by ann`."""
        return f"{self.origin} by {self.by}" if self.by is not None else self.origin


APPLIED = {Action.ACCEPT: "accepted", Action.EDIT: "edited", Action.AUTO: "auto-applied"}


def config_timeline(engine: Engine, run_id: int) -> list[ConfigStep]:
    """Each stage's config as trained, derived from its stage row and the decision that made it: a value a
    person's edit changed from the engineer's is the person's; every other change is the engineer's (or
    auto-apply's)."""
    with session(engine) as s:
        stages, decided = stages_of(s, run_id), _decided(s, run_id)
    out, before = [], None
    for stage in stages:
        config = stage.config
        origin, by, set_by, changes = "initial config", None, {}, ()
        if stage.index in decided and before is not None:
            p, d = decided[stage.index]
            origin, by = f"proposal #{p.id}, {APPLIED[d.action]}", d.user
            engineer = p.projected_config or before
            changes = tuple(change for change in diff(before, config) if change.change != 0)
            for change in changes:
                proposed = change.value(engineer)
                set_by[change.field] = Setter.AUTO if d.action == Action.AUTO else \
                    Setter.PERSON if d.action == Action.EDIT and proposed != change.new else Setter.ENGINEER
        elif stage.index > 0:
            origin = "the stage before's config"
        out.append(ConfigStep(stage.index, origin, config, set_by, changes, by))
        before = config
    return out


def failed_episodes(engine: Engine, run_id: int, stage_index: int, size: int | None = None,
                    failure: str | None = None, limit: int = 200, agents: int | None = None,
                    offset: int = 0) -> tuple[list[Episode], int]:
    """A stage's failed validation episodes, by size then id, optionally of one size, one failure type and one agent
    count: `limit` of them from the `offset`-th on (a page of the gallery), and how many match in all."""
    with session(engine) as s:
        match = [Episode.run_id == run_id, Episode.stage_index == stage_index, Episode.split == Split.VALIDATION,
                 Episode.failure.is_not(None)]
        match += [column == value for column, value in ((Episode.size, size), (Episode.failure, failure),
                                                        (Episode.num_agents, agents)) if value is not None]
        total = s.exec(select(func.count()).select_from(Episode).where(*match)).one()
        page = s.exec(select(Episode).where(*match).order_by(Episode.size, Episode.id).offset(offset).limit(limit))
        return list(page), total


def first_failure(engine: Engine, run_id: int) -> Episode | None:
    """The episode a run opens on when none is asked for: its latest evaluated stage's first failed validation
    episode (by size, then id), else that stage's first validation episode; None for a run with none. A stage
    evaluated is one whose evaluation is stored whole (its metrics): the episodes of one under way are stored batch
    by batch, and stored again in board order as it ends."""
    with session(engine) as s:
        latest = s.exec(select(StageMetric.stage_index).where(StageMetric.run_id == run_id,
                                                              StageMetric.split == Split.VALIDATION)
                        .order_by(StageMetric.stage_index.desc()).limit(1)).first()
        if latest is None:
            return None
        query = select(Episode).where(Episode.run_id == run_id, Episode.stage_index == latest,
                                      Episode.split == Split.VALIDATION)
        failed = s.exec(query.where(Episode.failure.is_not(None)).order_by(Episode.size, Episode.id).limit(1)).first()
        return failed or s.exec(query.order_by(Episode.size, Episode.id).limit(1)).first()


def episode_across_stages(engine: Engine, episode_id: int) -> tuple[Episode, list[Episode]] | None:
    """An episode, and every episode of its run on the same board and split (itself included), by stage."""
    with session(engine) as s:
        episode = s.get(Episode, episode_id)
        if episode is None:
            return None
        same = list(s.exec(select(Episode).where(
            Episode.run_id == episode.run_id, Episode.instance_id == episode.instance_id,
            Episode.split == episode.split).order_by(Episode.stage_index, Episode.id)))
    return episode, same


# ---------------------------------------------------------------- a run's progress


@dataclass(frozen=True)
class RunProgress:
    """A run as the worker last wrote it: its stages, its jobs (oldest first), the latest stage's results."""

    run: Run
    stages: list[Stage]
    jobs: list[Job]
    latest: StageSummary | None  # the validation results of the last evaluated stage
    training: tuple[int, list[tuple[int, dict[str, Any]]]] | None = None  # the last trained stage: (index, logs)
    shared: tuple[Evaluation, ...] = ()  # evaluations copied from another run's equal one (stage 0: evaluated once)
    trackio: str | None = None  # the command that shows the run's curves in Trackio, when it reports to Trackio


def run_progress(engine: Engine, run_id: int) -> RunProgress | None:
    with session(engine) as s:
        run = s.get(Run, run_id)
        if run is None:
            return None
        summaries = stage_summaries(s, run_id)
        shared = s.exec(select(Evaluation).where(Evaluation.run_id == run_id, Evaluation.source_run_id.is_not(None))
                        .order_by(Evaluation.stage_index, Evaluation.id)).all()
        return RunProgress(run, stages_of(s, run_id), jobs_of(s, run_id),
                           summaries[max(summaries)] if summaries else None, _last_training(s, run_id), tuple(shared),
                           trackers.where_to_see(engine, run))


def _last_training(s: Session, run_id: int) -> tuple[int, list[tuple[int, dict[str, Any]]]] | None:
    """The training-log rows of the run's last stage that logged any (the one training now, while it does)."""
    index = s.exec(select(func.max(TrainingLog.stage_index)).where(TrainingLog.run_id == run_id)).one()
    if index is None:
        return None
    rows = s.exec(select(TrainingLog).where(TrainingLog.run_id == run_id, TrainingLog.stage_index == index)
                  .order_by(TrainingLog.step))
    return index, [(row.step, row.metrics) for row in rows]


# ---------------------------------------------------------------- the benchmark


def benchmark_checkpoints(engine: Engine) -> list[tuple[int, int, str]]:
    """Every (run id, stage index, run name) with episodes on the benchmark."""
    with session(engine) as s:
        pairs = list(s.exec(select(Episode.run_id, Episode.stage_index).where(Episode.split == Split.BENCHMARK)
                            .distinct().order_by(Episode.run_id, Episode.stage_index)))
        names = {r.id: r.name for r in s.exec(select(Run))}
    return [(run_id, stage_index, names.get(run_id, "")) for run_id, stage_index in pairs]


def benchmark_report(engine: Engine, run_id: int, stage_index: int) -> Report:
    """The paper's tables of a stage's benchmark episodes (`envsim.suite.report`), with the hash of the boards they
    were scored on, in the order they were stored (the suite's table order); an episode stored before episodes kept
    their wait subset counts in subset -1."""
    with session(engine) as s:
        episodes = list(s.exec(select(Episode).where(Episode.run_id == run_id, Episode.stage_index == stage_index,
                                                     Episode.split == Split.BENCHMARK).order_by(Episode.id)))
    entries = [Entry(split=Split.BENCHMARK, subset=-1.0 if ep.subset is None else ep.subset,
                     instance=Instance.model_validate(ep.instance)) for ep in episodes]
    return report(entries, [ep.valid for ep in episodes], [ep.optimal for ep in episodes])
