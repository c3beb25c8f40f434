"""Experiments: runs that differ only in the engineer (the arm) and the seed, at equal compute (docs/experiments.md).

An experiment is one `storage.models.Experiment` row and its runs, arms x seeds, each created by
`lab.loop.create_run` with auto-apply. Every run of an experiment shares the policy, the number of stages, the
initial config (and so the boards per stage), the GRPO settings and the validation set, so every arm trains the
same number of GRPO steps on the same number of boards: equal compute by construction, written down in the
experiment's settings (`steps_per_stage`, as TRL counts them: `training.stage.planned_steps`). Seed `k` is the
run seed of every arm's run `k`: the same stage-0 policy evaluated on the same validation boards, so arms
compare pair by pair; each seed's engineers read dev boards of that seed's own (`RunSettings.dev_per_seed`), so a
deterministic engineer's seeds are separate decisions, not one decision repeated.

An engineer that probes configs on the policy (`learnability`) generates answers the training does not count. With
`match_compute` (`envlab experiment new --match-compute`) the other arms' trained stages take extra GRPO steps whose
rollouts equal those probe answers (`extra`, the default), or the probing arm's take fewer (`trim`), rounded to
whole steps and written down in the experiment's settings (`ExperimentSettings.matched`); each run's stages get its
arm's steps through its GRPO settings (`max_steps`).

Runs are ordinary queued jobs, so any worker on the database moves them; `run_experiment` starts `K` worker
processes of its own (they die with it), resumes every run that is not done (`lab.loop.resume`: only dead work
is queued again, so nothing is done twice), and reports progress over runs x stages until every run has ended.

A scenario (`assets/scenarios/<name>.json`) is a named starting point: an initial `EnvConfig` and GRPO overrides.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, func, select

from envsim.config import ConfigError, EnvConfig, project
from envsim.suite import VALIDATION_PER_SIZE, Split, boards_in
from lab.context import CONTEXT_PRESETS, DEFAULT_PRESET
from lab.engineers import ENGINEERS, HeldFileError, check_held, read_held
from lab.jobs.worker import split_gpus, start_worker, visible_gpus
from lab.loop import LoopError, advance, check_engineer, check_policy, create_run, queue_benchmark, resume
from lab.runs import benchmark_checkpoints
from lab.text import NAME_LIMIT, TEXT_LIMIT, too_long
from storage.db import runs_root, session
from storage.models import ACTIVE_JOB, Experiment, Job, JobKind, JobStatus, Run, RunStatus, Stage, StageStatus
from storage.settings import (
    MATCH_MODES,
    PRIMARY_RATES,
    ComputeMatch,
    ExperimentSettings,
    Held,
    HeldConfigs,
    RunSettings,
    SettingsError,
)

SCENARIOS = Path(__file__).resolve().parents[2] / "assets" / "scenarios"
DEFAULT_SCENARIO = "default"
EXPERIMENT_VALIDATION_PER_SIZE = 120  # an experiment's default: 960 validation boards (docs/experiments.md)
ENDED = (RunStatus.DONE, RunStatus.FAILED, RunStatus.CANCELLED)
ADVANCE_EVERY_S = 10.0  # how often `run_experiment` moves every unfinished run itself (the workers' hook does too)


class ExperimentError(ValueError):
    """An experiment cannot be created or run as asked; the message says why."""


# ---------------------------------------------------------------- arms and scenarios


@dataclass(frozen=True)
class Arm:
    """One arm: an engineer, its llm backend and context preset or its held configs, under a name unique in its
    experiment."""

    name: str
    engineer: str
    backend: str = ""
    context: str = DEFAULT_PRESET
    held: HeldConfigs | None = field(default=None, hash=False)  # a static or schedule arm's configs, read once

    @classmethod
    def parse(cls, text: str) -> Arm:
        """`fixed`, `random`, `heuristic`, `learnability`, `evidence`, `llm:BACKEND[@PRESET]` (e.g.
        `llm:openai:qwen3-4b@paper-best`), `static:FILE` or `schedule:FILE` (the file is read here, once:
        `lab.engineers.read_held`), optionally named: `NAME=SPEC`. The name defaults to the spec as written."""
        name, sep, spec = text.strip().partition("=")
        spec = spec.strip() if sep else name
        name = name.strip()
        engineer, _, rest = spec.partition(":")
        if engineer not in ENGINEERS:
            raise ExperimentError(f"arm {text!r}: unknown engineer {engineer!r} (one of {', '.join(ENGINEERS)})")
        if engineer in (Held.STATIC, Held.SCHEDULE):
            if not rest:
                raise ExperimentError(f"arm {text!r}: a {engineer} arm names its file of configs: {engineer}:FILE")
            try:
                return cls(name or spec, engineer, held=read_held(rest, Held(engineer)))
            except HeldFileError as err:
                raise ExperimentError(f"arm {text!r}: {err}") from None
        if engineer != "llm":
            if rest:
                raise ExperimentError(f"arm {text!r}: only an llm arm takes a backend and a context preset")
            return cls(name or engineer, engineer)
        backend, at, preset = rest.rpartition("@") if "@" in rest else (rest, "", DEFAULT_PRESET)
        if not backend:
            raise ExperimentError(f"arm {text!r}: an llm arm names its backend, e.g. llm:openai:MODEL@paper-best")
        if preset not in CONTEXT_PRESETS:
            raise ExperimentError(f"arm {text!r}: unknown context preset {preset!r} "
                                  f"(one of {', '.join(CONTEXT_PRESETS)})")
        return cls(name or spec, engineer, backend, preset)

    @property
    def spec(self) -> str:
        if self.held is not None:
            return f"{self.engineer}:{self.held.source}"
        return self.engineer if self.engineer != "llm" else f"llm:{self.backend}@{self.context}"

    def row(self) -> dict[str, Any]:
        """The arm as its experiment's `arms` stores it (a held arm's configs too: its runs never read the file)."""
        held = {"held": self.held.model_dump(mode="json")} if self.held is not None else {}
        return {"name": self.name, "engineer": self.engineer, "backend": self.backend, "context": self.context,
                **held}

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Arm:
        """The arm an experiment's `arms` stores (`row()`'s inverse); its held configs checked as when made."""
        held = row.get("held")
        return cls(row["name"], row["engineer"], row.get("backend", ""), row.get("context", DEFAULT_PRESET),
                   HeldConfigs.model_validate(held) if held is not None else None)


@dataclass(frozen=True)
class Scenario:
    """A named starting point: the initial config (stage 0's, the round-0 default) and GRPO overrides."""

    name: str
    description: str
    config: EnvConfig
    grpo: dict[str, Any] = field(default_factory=dict)


def scenario_names() -> list[str]:
    return sorted(p.stem for p in SCENARIOS.glob("*.json"))


def load_scenario(name: str = DEFAULT_SCENARIO) -> Scenario:
    """`assets/scenarios/<name>.json`: `{"description", "config": EnvConfig JSON, "grpo": {...}}`, checked strictly."""
    path = SCENARIOS / f"{name}.json"
    if not path.is_file():
        raise ExperimentError(f"unknown scenario {name!r}: one of {', '.join(scenario_names())}")
    raw = json.loads(path.read_text())
    unknown = sorted(set(raw) - {"description", "config", "grpo"})
    if unknown:
        raise ExperimentError(f"{path}: unknown keys {unknown}; a scenario has description, config and grpo")
    try:
        config = project(raw.get("config"), strict=True).config
    except ConfigError as err:
        raise ExperimentError(f"{path}: {err}") from err
    return Scenario(name, raw.get("description", ""), config, dict(raw.get("grpo") or {}))


# ---------------------------------------------------------------- creating one


def compute_settings(*, policy: str, config: EnvConfig, settings: RunSettings, scenario: str,
                     primary: str = "valid", processes: int = 1) -> ExperimentSettings:
    """What every run of the experiment shares (its settings whole, the initial config) and the compute it buys,
    as the experiment records it: a stage's GRPO steps as TRL counts them on `processes` processes (the GPUs each
    worker launches a stage on) and the validation boards; and the rate its report leads with (`primary`)."""
    from training.settings import check_grpo, check_packages  # torch loads here, for the command that makes one

    per_size = settings.validation_per_size or VALIDATION_PER_SIZE
    try:
        check_packages(settings)
        steps = check_grpo(settings, config.num_instances, policy, processes)
    except SettingsError as err:
        raise ExperimentError(str(err)) from err
    from training.policy import prompt_style_of
    from training.stage import planned_rollouts

    rollouts = planned_rollouts(config.num_instances, settings.grpo, prompt_style_of(policy), processes)
    boards = boards_in(Split.VALIDATION, per_size, settings.validation_agents)
    subset = settings.validation_boards
    return ExperimentSettings(run=settings, config=config, steps_per_stage=steps, validation_per_size=per_size,
                              validation_boards=min(subset, boards) if subset else boards, scenario=scenario,
                              rollouts_per_stage=rollouts, primary=primary, processes=processes)


def probe_answers(arm: Arm, settings: RunSettings, config: EnvConfig) -> int:
    """The answers `arm`'s engineer samples probing configs per proposal, as planned from the initial config (0: it
    does not probe); an ExperimentError for an engineer whose probes cannot be counted before it runs (an llm arm
    that measures: how many configs it probes depends on what it answers)."""
    from lab.context import context_preset
    from lab.engineers import needs_of
    from lab.engineers.learnability import planned_answers

    modules = asdict(context_preset(arm.context)) if arm.engineer == "llm" else settings.context
    if needs_of(arm.engineer, settings.model_copy(update={"context": modules})).probe is None:
        return 0
    if arm.engineer == "learnability":
        return planned_answers(config, settings.agent_counts)
    raise ExperimentError(f"arm {arm.name!r}: its engineer probes configs as its answers lead it, so its probe "
                          "answers cannot be matched before it runs; leave out --match-compute, or the arm")


def match_compute(mode: str, probes: dict[str, int], *, instances: int, grpo: dict[str, Any], policy: str,
                  steps: int, rollouts: int, target: int | None = None, processes: int = 1) -> ComputeMatch:
    """Each arm's GRPO steps per trained stage that even the answers generated per stage (rollouts + probe answers),
    rounded to whole steps: `extra` adds steps to every arm below the most probing arm's answers (`target`: an
    experiment's, for an arm added later), `trim` takes them off every arm above the least probing one's. The
    rollouts the steps add are counted as the stage's GRPOConfig samples them on `processes` processes, all
    together (`training.stage.planned_rollouts`), as `steps` and `rollouts` are."""
    from training.policy import prompt_style_of
    from training.stage import planned_rollouts

    if mode not in MATCH_MODES:
        raise ExperimentError(f"match_compute = {mode!r}: one of {', '.join(MATCH_MODES)}")
    target = target if target is not None else max(probes.values()) if mode == "extra" else min(probes.values())
    per_step = rollouts / steps  # rollouts per optimizer step (the tiny policy's defaults: 4,096 / 128 = 32)
    added = {arm: round((target - n) / per_step) for arm, n in probes.items()}
    if wrong := [arm for arm, k in added.items() if (k < 0) == (mode == "extra") and k]:
        raise ExperimentError(f"arm {wrong[0]!r} probes {probes[wrong[0]]:,} answers per proposal, past the "
                              f"{target:,} the experiment's arms were matched to ({mode}): make a new experiment")
    if short := [arm for arm, k in added.items() if steps + k < 1]:
        raise ExperimentError(f"arm {short[0]!r}: its probes ({probes[short[0]]:,} answers per proposal) outweigh a "
                              f"stage's {rollouts:,} rollouts; trimmed, its stages would train no step: match with "
                              "extra steps for the others instead")
    style = prompt_style_of(policy)
    more = {arm: planned_rollouts(instances, {**grpo, "max_steps": steps + k}, style, processes) - rollouts
            if k else 0 for arm, k in added.items()}
    return ComputeMatch(mode=mode, probe_answers=dict(probes), steps=added, rollouts=more)


MATCH_WORDS = {"extra": "extra rollouts for the others", "trim": "the probing arms' stages trimmed"}


def match_text(settings: ExperimentSettings) -> str:
    """What `match_compute` gave each arm, in words: `arms without probes (fixed, heuristic) trained 192 extra GRPO
    steps per stage (6,144 answers) to match learnability's probes (6,144 answers per proposal)`."""
    matched = settings.matched
    if matched is None:
        return ""
    probes = matched.probe_answers
    target = max(probes.values()) if matched.mode == "extra" else min(probes.values())
    groups: dict[tuple[int, int, int], list[str]] = {}
    for arm, k in matched.steps.items():
        if k:
            groups.setdefault((k, matched.rollouts[arm], probes[arm]), []).append(arm)
    if not groups:
        return "no arm probes more than another: every arm trains the same GRPO steps"
    reference = [arm for arm, k in matched.steps.items() if not k and probes[arm] == target]

    def who(arms: list[str], probed: int) -> str:
        what = "without probes" if not probed else f"probing {probed:,} answers per proposal"
        return f"arms {what} ({', '.join(arms)})" if len(arms) > 1 else f"{arms[0]} ({what})"

    to = (f"{', '.join(reference)}'s probes ({target:,} answers per proposal)" if target
          else who(reference, 0) if reference else "the arms without probes")
    return "; ".join(f"{who(arms, probed)} trained {abs(k)} {'extra' if k > 0 else 'fewer'} GRPO steps per stage "
                     f"({abs(r):,} answers)" for (k, r, probed), arms in groups.items()) + f" to match {to}"


def create_experiment(engine: Engine, *, name: str, arms: Sequence[str | Arm], seeds: int, settings: RunSettings,
                      config: EnvConfig | None = None, scenario: str | None = None, policy: str = "tiny",
                      instances: int | None = None, description: str = "", primary: str = "valid",
                      match: str | None = None, processes: int = 1) -> Experiment:
    """Store an experiment and queue its runs (arms x seeds, seed-major, auto-apply), refusing anything that
    would fail later (an unknown arm, a policy that cannot be its own engineer, a bad GRPO field) first.

    `settings` are every run's (checked when they were made; auto-apply is on whatever they say, the context is
    each arm's, the validation set 120 boards per size unless they name one). The initial config is `config`,
    else the scenario's (default `default`, the round-0 config); `instances` replaces its boards per stage;
    `settings.grpo` goes on top of the scenario's overrides. `primary` (valid or optimal) is the rate its report
    and the Compare tab lead with. `match` (`extra` or `trim`, None: not) evens the arms' answers per stage where
    some arm probes (`match_compute`). `processes`: the processes each stage is launched on (the GPUs of the workers
    that train it), for which its steps are counted and its compute matched.
    """
    parsed = [a if isinstance(a, Arm) else Arm.parse(a) for a in arms]
    if not parsed:
        raise ExperimentError("an experiment needs at least one arm")
    if len({a.name for a in parsed}) != len(parsed):
        raise ExperimentError(f"arm names must be unique: {[a.name for a in parsed]}; name one NAME=SPEC")
    if seeds < 1:
        raise ExperimentError(f"seeds = {seeds}: an experiment runs at least 1 seed per arm")
    if primary not in PRIMARY_RATES:
        raise ExperimentError(f"primary = {primary!r}: the primary metric is one of {', '.join(PRIMARY_RATES)}")
    for what, text, limit in (("experiment name", name, NAME_LIMIT), ("experiment description", description,
                                                                         TEXT_LIMIT)):
        if (why := too_long(what, text, limit)) is not None:
            raise ExperimentError(why)
    _check_run_names(name, parsed, seeds)
    chosen = load_scenario(scenario or DEFAULT_SCENARIO)
    origin = chosen.name if config is None else "a config of its own" + (f", scenario {scenario}'s GRPO settings"
                                                                        if scenario else "")
    config = config or chosen.config
    if instances is not None:
        config = config.model_copy(update={"num_instances": instances})
    settings = settings.model_copy(update={
        "grpo": {**chosen.grpo, **settings.grpo}, "auto_apply": True,
        "validation_per_size": settings.validation_per_size or EXPERIMENT_VALIDATION_PER_SIZE})
    try:
        check_policy(policy)
    except LoopError as err:
        raise ExperimentError(str(err)) from None
    _check_arms(parsed, policy, config, settings.agent_counts)
    recorded = compute_settings(policy=policy, config=config, settings=settings, scenario=origin, primary=primary,
                                processes=processes)
    if match is not None:
        probes = {arm.name: probe_answers(arm, settings, config) for arm in parsed}
        recorded = recorded.model_copy(update={"matched": match_compute(
            match, probes, instances=config.num_instances, grpo=settings.grpo, policy=policy,
            steps=recorded.steps_per_stage, rollouts=recorded.rollouts_per_stage, processes=processes)})
    with session(engine) as s:
        experiment = Experiment(name=name, description=description, policy=policy, seeds=seeds, settings=recorded,
                                arms=[a.row() for a in parsed])
        s.add(experiment)
        try:
            s.commit()
        except IntegrityError:
            raise ExperimentError(f"an experiment named {name!r} exists already") from None
        _create_runs(s, experiment, parsed)
    return experiment


def _run_name(experiment: str, arm: str, seed: int) -> str:
    """The name of an experiment's run: what the Runs tab and the Open run list show of it."""
    return f"{experiment} / {arm} / seed {seed}"


def _check_run_names(experiment: str, arms: Sequence[Arm], seeds: int) -> None:
    """Refuse, before anything is stored, an arm whose runs' names (`_run_name`, the last seed's the longest) would
    be longer than a run's name may be: `create_run` would refuse them after the experiment was stored."""
    for arm in arms:
        if (why := too_long("run name", _run_name(experiment, arm.name, seeds - 1), NAME_LIMIT)) is not None:
            raise ExperimentError(f"arm {arm.name!r:.60}: {why} (EXPERIMENT / ARM / seed K): shorten the "
                                  "experiment's or the arm's name")


def _check_arms(arms: Sequence[Arm], policy: str, config: EnvConfig, counts: tuple[int, ...] | None) -> None:
    """Refuse an arm whose engineer the loop cannot run for `policy`, or whose held configs do not fit runs that
    start on `config` with the agent counts `counts` (`lab.engineers.check_held`)."""
    for arm in arms:
        try:
            check_engineer(arm.engineer, arm.backend, policy, arm.held)
        except LoopError as err:
            raise ExperimentError(f"arm {arm.name!r}: {err}") from None
        if arm.held is not None and (why := check_held(arm.held, config, counts)) is not None:
            raise ExperimentError(f"arm {arm.name!r}: {why}")


def _create_runs(s: Session, experiment: Experiment, arms: Sequence[Arm]) -> None:
    """Queue the runs of `arms` (every seed, seed-major), from the settings every run of `experiment` shares."""
    shared, config = experiment.settings.run, experiment.settings.config
    for seed in range(experiment.seeds):
        for arm in arms:
            steps = experiment.settings.arm_steps(arm.name)
            grpo = shared.grpo if steps == experiment.settings.steps_per_stage else {**shared.grpo, "max_steps": steps}
            try:
                create_run(s, name=_run_name(experiment.name, arm.name, seed), config=config,
                           settings=shared.model_copy(update={"context_preset": arm.context, "context": None,
                                                              "held_configs": arm.held, "grpo": grpo,
                                                              "processes": _processes(experiment)}),
                           policy=experiment.policy, engineer=arm.engineer, engineer_backend=arm.backend, seed=seed,
                           description=f"experiment {experiment.name!r}, arm {arm.name!r}, seed {seed}",
                           experiment_id=experiment.id, arm=arm.name)
            except LoopError as err:
                raise ExperimentError(str(err)) from err


def _processes(experiment: Experiment) -> int | None:
    """The processes `experiment`'s runs record (`RunSettings.processes`): None for one, as a run's default says."""
    return experiment.settings.processes if experiment.settings.processes > 1 else None


def add_arms(engine: Engine, key: str | int, arms: Sequence[str | Arm]) -> list[Run]:
    """Add arms to an existing experiment: their runs (every seed) share what the others share (config, stages,
    GRPO settings, validation set), so they compare at equal compute; `run_experiment` then runs only what is
    not done. An arm whose name the experiment has already is refused."""
    experiment = find_experiment(engine, key)
    parsed = [a if isinstance(a, Arm) else Arm.parse(a) for a in arms]
    names = [a.name for a in parsed]
    if not parsed or len(set(names)) != len(names) or set(names) & set(arm_names(experiment)):
        raise ExperimentError(f"arms {names}: give at least one, each named once and not one of the experiment's "
                              f"({', '.join(arm_names(experiment))}); name one NAME=SPEC")
    _check_run_names(experiment.name, parsed, experiment.seeds)
    _check_arms(parsed, experiment.policy, experiment.settings.config, experiment.settings.run.agent_counts)
    matched = experiment.settings.matched
    if matched is not None:  # the new arms matched to the answers the experiment's arms were matched to
        settings = experiment.settings
        target = max(matched.probe_answers.values()) if matched.mode == "extra" else min(
            matched.probe_answers.values())
        added = match_compute(matched.mode, {a.name: probe_answers(a, settings.run, settings.config) for a in parsed},
                              instances=settings.instances, grpo=settings.grpo, policy=experiment.policy,
                              steps=settings.steps_per_stage, rollouts=settings.rollouts_per_stage, target=target,
                              processes=settings.processes)
        matched = matched.model_copy(update={name: {**getattr(matched, name), **getattr(added, name)}
                                              for name in ("probe_answers", "steps", "rollouts")})
    with session(engine) as s:
        row = s.get(Experiment, experiment.id)
        row.arms = [*row.arms, *(a.row() for a in parsed)]
        if matched is not None:
            row.settings = row.settings.model_copy(update={"matched": matched})
        s.add(row)
        s.commit()
        s.refresh(row)
        before = set(s.exec(select(Run.id).where(Run.experiment_id == row.id)))
        _create_runs(s, row, parsed)
    return [r for r in experiment_runs(engine, experiment.id) if r.id not in before]


# What decides a run's compute and its score: two experiments that agree on these train the same number of GRPO
# steps on the same number of boards from the same start and are scored on the same validation boards. The dev
# split is not among them: it is what the reading engineers read, so adopt a reading arm's runs only where they
# reproduce (docs/experiments.md, "Adopting runs").


def _started(s: Session, run_id: int) -> bool:
    """Whether a run has done anything: a job of it that is neither queued nor cancelled."""
    return s.exec(select(Job.id).where(Job.run_id == run_id, Job.status.not_in(
        (JobStatus.QUEUED, JobStatus.CANCELLED)))).first() is not None


def _source_runs(other: Engine, experiment: Experiment, source: Path, arm: str, seeds: list[int],
                 source_experiment: str | None) -> tuple[Experiment, dict[int, Run], list[str]]:
    """`adopt_runs`' look at the other database: its experiment (refused unless at the same compute), its runs
    of `arm` by seed, and what is wrong with the ones asked for."""
    spec = next(a for a in arms_of(experiment) if a.name == arm)
    try:
        theirs = find_experiment(other, source_experiment or experiment.name)
    except ExperimentError as err:
        raise ExperimentError(f"{source}: {err}") from None
    there, here = ({**e.settings.compute(), "policy": e.policy}
                   for e in (theirs, experiment))
    differ = [f"{k} ({there[k]!r} there, {here[k]!r} here)" for k in here if there[k] != here[k]]
    if differ:
        raise ExperimentError(f"{source}: experiment {theirs.name!r} differs from {experiment.name!r} in "
                              f"{'; '.join(differ)}: not the same compute")
    found = {r.seed: r for r in experiment_runs(other, theirs.id) if r.arm == arm}
    problems = []
    for seed in seeds:
        run = found.get(seed)
        if run is None:
            problems.append(f"seed {seed}: no run of arm {arm!r} there")
        elif run.status != RunStatus.DONE:
            problems.append(f"seed {seed}: its run {run.id} there is {run.status}, not done")
        elif (run.engineer, run.engineer_backend) != (spec.engineer, spec.backend):
            problems.append(f"seed {seed}: its run {run.id} there ran engineer {run.engineer!r}, "
                            f"this arm runs {spec.engineer!r}")
        elif run.settings.held_configs != spec.held:
            problems.append(f"seed {seed}: its run {run.id} there held other configs than this arm's")
    return theirs, found, problems


def adopt_runs(engine: Engine, key: str | int, source: str | Path, arm: str, seeds: Sequence[int],
               source_experiment: str | None = None) -> list[tuple[int, Run]]:
    """Take the done runs of `arm`, `seeds`, from an experiment of another database (`source`, a SQLite file,
    read from a copy: it is never changed) into experiment `key` as that arm's seeds, each with new ids.

    The source experiment (named `source_experiment`, default this one's name) must agree with this one on
    every figure of `ExperimentSettings.compute` and the policy, and each source run must be done and ran the arm's
    engineer.
    This experiment's own run of that arm and seed must not have started: it is cancelled and detached
    (`experiment_id` NULL), its queued jobs cancelled. Everything is checked before anything is stored.
    Returns (source run id, adopted run) pairs.
    """
    import shutil
    import tempfile

    from lab.archive import ArchiveError, export_run, import_archive
    from storage.db import DatabaseUnusable, open_database

    experiment = find_experiment(engine, key)
    if arm not in arm_names(experiment):
        raise ExperimentError(f"experiment {experiment.name!r} has no arm {arm!r} "
                              f"(its arms: {', '.join(arm_names(experiment))})")
    seeds = sorted(set(seeds))
    if not seeds or seeds[0] < 0 or seeds[-1] >= experiment.seeds:
        raise ExperimentError(f"seeds {seeds}: experiment {experiment.name!r} has seeds 0..{experiment.seeds - 1}")
    source = Path(source)
    if not source.is_file():
        raise ExperimentError(f"{source}: no such database file")
    with tempfile.TemporaryDirectory(prefix="envlab-adopt-") as tmp:
        copy = Path(tmp) / "source.db"
        shutil.copyfile(source, copy)  # opening migrates: the copy, never the source
        try:
            other = open_database(str(copy))
        except DatabaseUnusable as err:
            raise ExperimentError(f"{source}: {err}") from None
        theirs, found, problems = _source_runs(other, experiment, source, arm, seeds, source_experiment)
        with session(engine) as s:
            mine = {r.seed: r for r in s.exec(select(Run).where(Run.experiment_id == experiment.id,
                                                                 Run.arm == arm, Run.seed.in_(seeds)))}
            problems += [f"seed {seed}: its run {mine[seed].id} here has run already ({mine[seed].status}); "
                         "cancel it first, or adopt other seeds" for seed in seeds
                         if seed in mine and _started(s, mine[seed].id)]
        if problems:
            raise ExperimentError(f"{source}, experiment {theirs.name!r}, arm {arm!r}: " + "; ".join(problems))
        adopted = []
        for seed in seeds:
            archive = Path(tmp) / f"run-{found[seed].id}.zip"
            try:
                export_run(other, found[seed].id, archive)
                adopted.append((found[seed].id, import_archive(engine, archive).run_id))
            except ArchiveError as err:
                raise ExperimentError(f"{source}, run {found[seed].id}: {err}") from None
        other.dispose()
    note = f"adopted from {source.name}, experiment {theirs.name!r}"
    with session(engine) as s:
        for seed, (theirs_id, new_id) in zip(seeds, adopted, strict=True):
            if seed in mine:
                replaced = s.get(Run, mine[seed].id)
                replaced.experiment_id = None
                replaced.status = RunStatus.CANCELLED
                replaced.status_reason = f"replaced in experiment {experiment.name!r} by run {new_id}, {note}"
                s.add(replaced)
                for job in s.exec(select(Job).where(Job.run_id == replaced.id, Job.status == JobStatus.QUEUED)):
                    job.status = JobStatus.CANCELLED
                    s.add(job)
            run = s.get(Run, new_id)
            run.experiment_id, run.arm = experiment.id, arm
            run.description = f"experiment {experiment.name!r}, arm {arm!r}, seed {seed}; {note}, run {theirs_id}"
            s.add(run)
        s.commit()
        return [(theirs_id, s.get(Run, new_id)) for theirs_id, new_id in adopted]


# ---------------------------------------------------------------- reading one


def find_experiment(engine: Engine, key: str | int) -> Experiment:
    """An experiment by name, or by id when `key` is a number that no experiment is named."""
    with session(engine) as s:
        found = s.exec(select(Experiment).where(Experiment.name == str(key))).first()
        if found is None and str(key).isdigit():
            found = s.get(Experiment, int(key))
    if found is None:
        raise ExperimentError(f"no experiment {key!r} (envlab experiment list shows them)")
    return found


def experiment_runs(engine: Engine, experiment_id: int) -> list[Run]:
    """The experiment's runs in the order they were created (seed-major)."""
    with session(engine) as s:
        return list(s.exec(select(Run).where(Run.experiment_id == experiment_id).order_by(Run.id)))


def arms_of(experiment: Experiment) -> list[Arm]:
    """The experiment's arms, typed, in the order they were made."""
    return [Arm.from_row(a) for a in experiment.arms]


def arm_names(experiment: Experiment) -> list[str]:
    return [a.name for a in arms_of(experiment)]


@dataclass(frozen=True)
class ExperimentProgress:
    """Stages evaluated over all of them (stage 0 counts: it is an evaluation too), and each run's state."""

    experiment: Experiment
    runs: list[Run]
    stages_done: dict[int, int]  # run id -> stages done
    benchmarks_done: int = 0

    @property
    def total(self) -> int:
        return len(self.runs) * (self.experiment.settings.stages + 1)

    @property
    def done(self) -> int:
        return sum(self.stages_done.values())

    @property
    def ended(self) -> bool:
        return all(r.status in ENDED for r in self.runs)

    def count(self, status: RunStatus) -> int:
        return sum(r.status == status for r in self.runs)


def experiment_progress(engine: Engine, experiment_id: int) -> ExperimentProgress:
    with session(engine) as s:
        experiment = s.get(Experiment, experiment_id)
        runs = list(s.exec(select(Run).where(Run.experiment_id == experiment_id).order_by(Run.id)))
        done = dict(s.exec(select(Stage.run_id, func.count()).join(Run, Run.id == Stage.run_id)
                           .where(Run.experiment_id == experiment_id, Stage.status == StageStatus.DONE)
                           .group_by(Stage.run_id)).all())
        benchmarks = s.exec(select(func.count()).select_from(Job).join(Run, Run.id == Job.run_id)
                            .where(Run.experiment_id == experiment_id, Job.kind == JobKind.BENCHMARK,
                                   Job.status.not_in(ACTIVE_JOB))).one()
    return ExperimentProgress(experiment, runs, {r.id: done.get(r.id, 0) for r in runs}, benchmarks)


def time_left(engine: Engine, progress: ExperimentProgress) -> str:
    """How long the experiment's work left should take, in one line (`envlab experiment status`): each job still
    to come (stage 0, a trained stage, a proposal) at the median time its kind took in this experiment, shared over
    the workers running its jobs now (over one when none is). "" once every run has ended."""
    if progress.ended:
        return ""
    active = [r.id for r in progress.runs if r.status not in ENDED]
    stages = progress.experiment.settings.stages
    with session(engine) as s:
        jobs = s.exec(select(Job.kind, Job.target, Job.started_at, Job.finished_at).join(Run, Run.id == Job.run_id)
                      .where(Run.experiment_id == progress.experiment.id, Job.status == JobStatus.DONE,
                             Job.kind.in_([JobKind.STAGE, JobKind.PROPOSE]))).all()
        workers = len(set(s.exec(select(Job.worker).where(Job.run_id.in_(active), Job.status == JobStatus.RUNNING))))
        proposed = s.exec(select(func.count()).select_from(Job).where(
            Job.run_id.in_(active), Job.kind == JobKind.PROPOSE, Job.status == JobStatus.DONE)).one()
    kinds = {"stage 0": lambda kind, k: kind == JobKind.STAGE and k == 0,
             "trained stages": lambda kind, k: kind == JobKind.STAGE and k > 0,
             "proposals": lambda kind, k: kind == JobKind.PROPOSE}
    minutes = {name: sorted((end - start).total_seconds() / 60 for kind, k, start, end in jobs
                            if test(kind, k) and start and end) for name, test in kinds.items()}
    left = {"stage 0": sum(progress.stages_done[r] == 0 for r in active),
            "trained stages": sum(stages - max(progress.stages_done[r] - 1, 0) for r in active),
            "proposals": len(active) * stages - proposed}
    median = {name: m[len(m) // 2] for name, m in minutes.items() if m}
    if "trained stages" not in median:
        return "time left: not known until a stage has trained"
    median.setdefault("stage 0", median["trained stages"])
    total = sum(left[name] * median.get(name, 0.0) for name in left)
    share = max(workers, 1)
    over = (f"the {workers} worker{'s' if workers > 1 else ''} running its jobs now" if workers
            else "one worker (none is running its jobs now)")
    words = {"stage 0": ("stage 0 evaluation", "stage 0 evaluations"),
             "trained stages": ("trained stage", "trained stages"), "proposals": ("proposal", "proposals")}
    parts = ", ".join(f"{left[name]} {words[name][left[name] != 1]} at "
                      f"{median[name]:.1f} min" for name in left if left[name] and name in median)
    if not parts:
        return "time left: no stage or proposal; the runs are ending"
    return f"time left: about {total / share / 60:.1f} h over {over} ({parts}; each a median of this experiment's)"


def list_experiments(engine: Engine) -> list[ExperimentProgress]:
    """Every experiment with its progress, newest first."""
    with session(engine) as s:
        ids = list(s.exec(select(Experiment.id).order_by(Experiment.id.desc())))
    return [experiment_progress(engine, i) for i in ids]


def experiment_choices(engine: Engine) -> list[tuple[str, int]]:
    """(label, id) of every experiment, newest first: for a dropdown."""
    return [(f"{p.experiment.name} ({len(p.experiment.arms)} arms x {p.experiment.seeds} seeds, "
             f"{p.done}/{p.total} stages)", p.experiment.id) for p in list_experiments(engine)]


# ---------------------------------------------------------------- running one


def restart(engine: Engine, experiment_id: int) -> list[str]:
    """Put every run that is not done back in motion: dead work queued again (`lab.loop.resume`), then the
    next step queued (`lab.loop.advance`). Returns one line per run that had stopped."""
    lines = []
    for run in experiment_runs(engine, experiment_id):
        if run.status == RunStatus.DONE:
            continue
        requeued = resume(engine, run.id)
        state = advance(engine, run.id)
        if requeued or run.status in (RunStatus.FAILED, RunStatus.CANCELLED):
            lines.append(f"run {run.id} ({run.arm}, seed {run.seed}) was {run.status}: "
                         f"{len(requeued)} job(s) queued again; now {state.text}")
    return lines


def queue_benchmarks(engine: Engine, experiment_id: int) -> list[str]:
    """Queue the 3,150-board benchmark for each finished run's last stage, once; one line per run."""
    lines = []
    for run in experiment_runs(engine, experiment_id):
        last = run.settings.stages
        if run.status != RunStatus.DONE:
            lines.append(f"run {run.id} ({run.arm}, seed {run.seed}): not done yet ({run.status})")
            continue
        try:
            job = queue_benchmark(engine, run.id, last)
            lines.append(f"run {run.id} ({run.arm}, seed {run.seed}): benchmark job {job.id} queued for stage {last}")
        except LoopError as err:
            lines.append(f"run {run.id} ({run.arm}, seed {run.seed}): {err}")
    return lines


def _benchmarks_pending(engine: Engine, experiment_id: int) -> int:
    """Finished runs whose last stage has no finished benchmark job yet; queues the missing ones."""
    pending = 0
    with session(engine) as s:
        ended = {(j.run_id, j.status) for j in s.exec(select(Job).join(Run, Run.id == Job.run_id).where(
            Run.experiment_id == experiment_id, Job.kind == JobKind.BENCHMARK))}
    for run in experiment_runs(engine, experiment_id):
        if run.status != RunStatus.DONE:
            continue
        statuses = {status for run_id, status in ended if run_id == run.id}
        if not statuses:
            try:
                queue_benchmark(engine, run.id, run.settings.stages)
            except LoopError:
                continue  # evaluated already (by an earlier command)
            pending += 1
        elif statuses & set(ACTIVE_JOB):
            pending += 1
    return pending


def log_dir(engine: Engine, experiment: Experiment) -> Path:
    """Where `run_experiment` writes its workers' logs: `<runs root>/experiments/<id>/`."""
    return runs_root(engine) / "experiments" / str(experiment.id)


def worker_gpus(settings: ExperimentSettings, visible: Sequence[str], workers: int) -> list[list[str]]:
    """The GPUs each of an experiment's `workers` owns, of those `visible`: a block of as many as its stages were
    planned for (`processes`), one more for the worker's vLLM server where its runs generate in vLLM's server mode
    (a worker trains on its GPUs less its server's); none where fewer are left (`split_gpus`)."""
    return split_gpus(visible, workers, settings.processes + settings.run.overrides.vllm_server)


def task_gpus_refusal(experiment: Experiment, gpus: int) -> str | None:
    """Why a worker of `gpus` GPUs (a Slurm array task's `--slurm-gpus`) could not claim `experiment`'s stages, or
    None: a worker claims only stages planned for as many processes as it has GPUs (less its vLLM server's in vLLM's
    server mode; none counts as one), so a task needs exactly the experiment's processes, and one GPU more in server
    mode (`worker_gpus`); 0 or 1 where its stages run on one process without a server."""
    processes, served = experiment.settings.processes, experiment.settings.run.overrides.vllm_server
    needed = processes + served
    if gpus == needed or needed == 1 and gpus == 0:
        return None
    server = " and one for its vLLM server (vLLM's server mode)" if served else ""
    return (f"experiment {experiment.name!r} is planned for {processes} process(es) a stage, one per GPU{server}: "
            f"its tasks need --slurm-gpus {needed}, not {gpus}, or none of them claims its stages")


def run_experiment(engine: Engine, db: str | None, key: str | int, *, workers: int = 1, benchmark: bool = False,
                   on_progress: Callable[[ExperimentProgress], None] | None = None,
                   say: Callable[[str], None] | None = None, poll_s: float = 1.0,
                   threads: int | None = None) -> ExperimentProgress:
    """Run an experiment to its end with `workers` worker processes of its own (on the database `db`, a path
    or URL; None: `$ENVLAB_DB`), which stop when it returns and die with it when it is killed.

    First every run that is not done is resumed (`restart`), so running the command again after a crash picks
    up every run where it stopped. `on_progress` is called after every poll. With `benchmark`, each run's last
    stage is then evaluated on the benchmark (`queue_benchmarks`) before the workers stop. `say` hears what was
    resumed. `threads` sets each worker's torch threads (OMP_NUM_THREADS; None: torch's own choice). The
    visible GPUs are shared out between the workers (`lab.jobs.worker.split_gpus`): worker k owns a block of as many
    as the experiment's stages were planned for (`ExperimentSettings.processes`; one more, for its vLLM server, in
    vLLM's server mode), the only stages it claims; an
    experiment of more processes than this machine shows GPUs is refused before anything runs. The workers claim
    the oldest run's jobs first (`storage.queue.claim`'s `by_run`): a study stopped midway has its first seeds whole,
    every arm paired, rather than every run half-trained.
    """
    if workers < 1:
        raise ExperimentError(f"workers = {workers}: run at least 1 worker")
    experiment = find_experiment(engine, key)
    visible, processes = visible_gpus(), experiment.settings.processes
    served = experiment.settings.run.overrides.vllm_server  # a GPU more a worker, for its vLLM server (on GPUs)
    if (processes > 1 or served and visible) and len(visible) < processes + served:
        raise ExperimentError(f"experiment {experiment.name!r} is planned for {processes} processes a stage, one per "
                              f"GPU{', beside a GPU for its vLLM server' if served else ''}, and this machine shows "
                              f"{len(visible)} GPU(s) (CUDA_VISIBLE_DEVICES): run it on a machine of "
                              f"{processes + served} GPUs or more")
    for line in restart(engine, experiment.id):
        if say is not None:
            say(line)
    folder = log_dir(engine, experiment)
    folder.mkdir(parents=True, exist_ok=True)
    env = {"OMP_NUM_THREADS": str(threads)} if threads else None
    shares = worker_gpus(experiment.settings, visible, workers)
    # `--by-run`: the oldest run's jobs first, so the runs (queued seed by seed) end seed by seed
    procs = [start_worker(db, options=["--poll", str(min(poll_s, 1.0)), "--gpus", ",".join(gpus) or "none",
                                       "--by-run"], die_with_parent=True, log=folder / f"worker-{i}.log", env=env)
             for i, gpus in enumerate(shares)]
    try:
        moved = time.monotonic()
        while True:
            progress = experiment_progress(engine, experiment.id)
            if on_progress is not None:
                on_progress(progress)
            if progress.ended and not (benchmark and _benchmarks_pending(engine, experiment.id)):
                return progress
            if dead := [p for p in procs if p.poll() is not None]:
                raise ExperimentError(f"worker process {dead[0].pid} exited with status {dead[0].returncode}; its "
                                      f"log: {folder}. Run the command again to resume.")
            if time.monotonic() - moved > ADVANCE_EVERY_S:  # a safety net: the workers' hook advances runs too
                for run in progress.runs:
                    if run.status not in ENDED:
                        advance(engine, run.id)
                moved = time.monotonic()
            time.sleep(poll_s)
    finally:
        _stop(procs)


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM (a worker ends after its current job; none runs by now), then SIGKILL after a grace period."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 30
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


# ---------------------------------------------------------------- the leaderboard's labels


def benchmark_choices(engine: Engine) -> list[tuple[str, str]]:
    """Every (run, stage) with episodes on the benchmark as `(label, "run_id:stage_index")`, runs of experiments
    first, grouped by experiment, arm and seed (`exp NAME / ARM / seed K, stage S`), then the other runs."""
    checkpoints = benchmark_checkpoints(engine)
    with session(engine) as s:
        runs = {r.id: r for r in s.exec(select(Run).where(Run.id.in_([run_stage[0] for run_stage in checkpoints])))}
        names = {e.id: e.name for e in s.exec(select(Experiment))}
    grouped, others = [], []
    for run_id, stage_index, name in checkpoints:
        run = runs.get(run_id)
        if run is not None and run.experiment_id is not None:
            order = (run.experiment_id, run.arm or "", run.seed, stage_index)
            grouped.append((order, (f"exp {names.get(run.experiment_id, run.experiment_id)} / {run.arm} / seed "
                                    f"{run.seed}, stage {stage_index}", f"{run_id}:{stage_index}")))
        else:
            others.append((f"run #{run_id} {name}, stage {stage_index}", f"{run_id}:{stage_index}"))
    return [choice for _, choice in sorted(grouped)] + others
