"""The headroom screen: how much one stage's gain can depend on the environment at all, before any engineer is
studied (docs/experiments.md, "Headroom screen").

An engineer can only help where some environment trains the policy better than another. So before comparing
engineers, one stage is trained from stage 0 on each config of a small grid (agent mix x hole ratio x wait ratio),
2 seeds each, and on 6 `random` draws; each run's gain is its validation valid rate after that stage minus stage 0's
(the same checkpoint, evaluated once for every run). The **headroom** is the best config's mean gain minus the mean
gain of the random draws: under 3 points, the testbed leaves an engineer little to find.

The screen is two experiments in one database, so nothing is trained that is not used: `NAME` holds the 12 configs
as `static:FILE` arms with 2 seeds, `NAME-random` the `random` arm with 6 seeds (an experiment has one seed count for
all its arms: one experiment of 13 arms would train 6 seeds of every config, 48 runs more). Both are made with the
same settings, so they share stage 0's evaluation (its key names the policy and the boards, not the experiment:
`training.shared`) and `report` refuses two that differ in anything that decides compute or the score.

    envlab headroom make-configs --out DIR [--from-scenario default]
    envlab headroom report NAME --db DB --out DIR [--draws NAME-random]

The grid (the settings below). The rules (docs/rules.md) allow agent counts 1..8, hole ratios 0..0.5 and wait ratios
0..1 per map size; the levels are chosen inside them, to span what the score asks for:
- **agent mix**: the runs train on 2 to 5 agents (`AGENT_COUNTS`) and are scored on 3, 4 and 5 (`VALIDATION_AGENTS`,
  the paper's evaluation counts); the mixes move the weight from the fewest agents (mixA, mostly 2-3), through
  uniform (mixB), to the most (mixC, mostly 4-5). Every mix keeps some boards at every count, so no count is unseen.
- **holes**: the validation boards draw each board's hole ratio uniformly over 0..0.5 (the benchmark's layout), so
  0.1 and 0.4 sit near either end of what is scored; the default scenario's 0.2 is between them.
- **waits**: the validation set holds three wait subsets, 0.25, 0.50 and 0.75 of the boards needing a wait;
  the two levels are its ends.
- **sizes**: every mix has 5-agent boards, and when the screen was made the generator dealt each count's boards over
  every size with data: a 3x3 board cannot hold 5 agents' starts and goals (10 cells), and 4x4 boards with 40% holes
  rarely can. So the screen trains on the scenario's sizes that hold the most agents, the benchmark's rule (K agents
  on sizes max(3, K)..10): 5..10, data spread evenly over them. The experiments' initial config (`initial.json`) has
  these sizes only, because `random` draws data for every size of the initial config: with sizes 3 and 4 beside
  5-agent boards, most of its draws could not be generated then. (The generator now deals each count only to the
  sizes that hold it, `envsim.generator.placement`; the screen keeps its sizes, so its runs stay comparable.)
"""

from __future__ import annotations

import json
import math
import shlex
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from scipy import stats
from sqlalchemy import Engine
from sqlmodel import select

from envsim.config import EnvConfig, mix_text
from lab.settings import counts_text
from lab.study.comparison import (
    LEVEL,
    POOLED,
    Comparison,
    Estimate,
    Rate,
    cell,
    comparison,
    detectable,
    difference_cell,
    estimate,
    markdown_table,
    points,
    seeds_text,
    welch_interval,
    write_csv,
)
from lab.study.experiments import EXPERIMENT_VALIDATION_PER_SIZE, ExperimentError, arms_of, load_scenario
from storage.db import session
from storage.models import Job, JobKind, JobStatus, Stage
from storage.settings import MATCH_MODES

NAME = "headroom"
SCENARIO = "default"
MIXES: dict[str, dict[int, float]] = {
    "mixA": {2: 0.4, 3: 0.4, 4: 0.1, 5: 0.1},  # mostly 2-3 agents
    "mixB": {2: 0.25, 3: 0.25, 4: 0.25, 5: 0.25},  # uniform over 2..5
    "mixC": {2: 0.1, 3: 0.1, 4: 0.4, 5: 0.4},  # mostly 4-5 agents
}
HOLES = (0.1, 0.4)
WAITS = (0.25, 0.75)
AGENT_COUNTS = (2, 3, 4, 5)  # what the runs train on (--agent-counts)
VALIDATION_AGENTS = (3, 4, 5)  # what they are scored on (--validation-agents)
SEEDS = 2  # per config
DRAWS = 6  # random configs: the random arm's seeds
STAGES = 1  # one trained stage after stage 0
# dev boards per (count, size): the fewest the runs take (one per wait subset). Neither `static` nor `random` reads
# them, so the default 30 (630 boards of 3 to 5 agents, drawn for each seed and answered after every stage) is spent
# for nothing here.
DEV_PER_SIZE_SCREEN = 3
THRESHOLD = 0.03  # headroom below 3 points: the environment, as screened, leaves an engineer little to find
STUDY_EFFECT = 0.02  # the difference between engineers a study after the screen is sized to detect (80% power)
STUDY_LEAST_SEEDS = 8
INITIAL = "initial.json"


class HeadroomError(ValueError):
    """The screen cannot be made or read as asked; the message says why."""


# ---------------------------------------------------------------- the configs


def screen_sizes(scenario: EnvConfig) -> tuple[int, ...]:
    """The scenario's map sizes that hold the most agents of any mix: max(3, K)..10, as the benchmark's layout."""
    most = max(k for mix in MIXES.values() for k, share in mix.items() if share > 0)
    sizes = tuple(s for s in scenario.sizes if s >= max(3, most))
    if not sizes:
        raise HeadroomError(f"the scenario's sizes {list(scenario.sizes)} hold no board of {most} agents")
    return sizes


def initial_config(scenario: EnvConfig) -> EnvConfig:
    """The experiments' initial config: the scenario's, on `screen_sizes` only, its data spread evenly over them
    (stage 0 only evaluates, so this decides the sizes every arm trains on and what `random` draws from)."""
    sizes = screen_sizes(scenario)
    return EnvConfig(data_ratio={s: 1 / len(sizes) for s in sizes},
                     hole_ratio={s: scenario.hole_ratio[s] for s in sizes},
                     wait_ratio={s: scenario.wait_ratio[s] for s in sizes},
                     agent_ratio=dict(scenario.agent_ratio), num_instances=scenario.num_instances,
                     random_share=scenario.random_share)


def config_name(mix: str, holes: float, waits: float) -> str:
    return f"{mix}-holes{holes:g}-waits{waits:g}"


def grid(initial: EnvConfig) -> dict[str, EnvConfig]:
    """The screen's configs by name (`mixB-holes0.1-waits0.75`): every mix x hole level x wait level, on the initial
    config's sizes with its data shares and boards per stage."""
    return {config_name(mix, holes, waits): initial.model_copy(update={
        "hole_ratio": dict.fromkeys(initial.sizes, holes), "wait_ratio": dict.fromkeys(initial.sizes, waits),
        "agent_ratio": dict(shares)})
        for mix, shares in MIXES.items() for holes in HOLES for waits in WAITS}


def write_configs(out: Path, scenario: str = SCENARIO) -> dict[str, Path]:
    """`out/initial.json` and one file per config of the grid (`out/<name>.json`), as `static:FILE` reads them;
    returns the grid's files by name."""
    initial = initial_config(load_scenario(scenario).config)
    out.mkdir(parents=True, exist_ok=True)
    (out / INITIAL).write_text(initial.model_dump_json(indent=2) + "\n")
    files = {}
    for name, config in grid(initial).items():
        files[name] = out / f"{name}.json"
        files[name].write_text(config.model_dump_json(indent=2) + "\n")
    return files


@dataclass(frozen=True)
class Plan:
    """What the screen's commands make: the configs' experiment `name` (the draws' is `NAME-random`), the scenario
    the configs come from, the configs held (their names, the files' stems; empty: the whole grid), seeds per config,
    random draws, agent counts trained and scored on, and `envlab experiment new` options beyond those (each a
    flag and its value, quoted for the shell)."""

    name: str = NAME
    scenario: str = SCENARIO
    configs: tuple[str, ...] = ()
    seeds: int = SEEDS
    draws: int = DRAWS
    agent_counts: tuple[int, ...] = AGENT_COUNTS
    validation_agents: tuple[int, ...] = VALIDATION_AGENTS
    dev_per_size: int | None = DEV_PER_SIZE_SCREEN
    options: tuple[str, ...] = ()


def commands(folder: Path, plan: Plan = Plan(), *, db: str = "headroom.db",
             out: str = "docs/results/headroom") -> list[str]:
    """The command lines of the whole screen: its configs written into `folder`, both experiments made and run on
    the database `db`, and the report written into `out`."""
    names = plan.configs or tuple(grid(initial_config(load_scenario(plan.scenario).config)))
    f, d = shlex.quote(str(folder)), shlex.quote(db)
    arms = ",".join(f"{n}=static:{folder / n}.json" for n in names)
    shared = " ".join([f"--stages {STAGES} --scenario {plan.scenario} --config {f}/{INITIAL}",
                       f"--agent-counts {','.join(map(str, plan.agent_counts))}",
                       f"--validation-agents {','.join(map(str, plan.validation_agents))}",
                       *([f"--dev-per-size {plan.dev_per_size}"] if plan.dev_per_size else []), *plan.options,
                       f"--db {d}"])
    name = plan.name
    return [f"envlab headroom make-configs --out {f} --from-scenario {plan.scenario}",
            f"envlab experiment new --name {name} --arms {shlex.quote(arms)} --seeds {plan.seeds} {shared}",
            f"envlab experiment new --name {name}-random --arms random --seeds {plan.draws} {shared}",
            f"envlab experiment run {name} --workers 1 --threads 1 --db {d}",
            f"envlab experiment run {name}-random --workers 1 --threads 1 --db {d}",
            f"envlab headroom report {name} --db {d} --configs {f} --from-scenario {plan.scenario} "
            f"--out {shlex.quote(out)}"]


# ---------------------------------------------------------------- the gains


@dataclass(frozen=True)
class Gain:
    """One arm's gain over the screen's stage: per seed, its stage-`STAGES` rate minus stage 0's, for each rate;
    the config it held (None: `random`, whose seeds drew their own) and stage 0's valid rate."""

    arm: str
    config: EnvConfig | None
    valid: Estimate
    optimal: Estimate
    stage0: Estimate


@dataclass(frozen=True)
class Headroom:
    """The screen read: each config's gain (best first), the random draws' gain and the config each draw trained
    on (by seed), and the best minus the draws with Welch's interval (low, high, degrees of freedom;
    `welch_interval`: None with fewer than 2 values on a side)."""

    experiment: Comparison
    draws_experiment: Comparison
    configs: list[Gain]
    draws: Gain
    drawn: dict[int, EnvConfig]
    welch: tuple[float, float, float] | None

    @property
    def best(self) -> Gain:
        return self.configs[0]

    @property
    def headroom(self) -> float:
        return self.best.valid.mean - self.draws.valid.mean

    @property
    def seed_sd(self) -> float | None:
        """The seed spread of one config's gain: the pooled standard deviation over the configs with 2 or more seeds
        (each config's seeds differ only in the training's random numbers); None without such a config."""
        spread = [(len(g.valid.values) - 1, g.valid.sd) for g in self.configs if len(g.valid.values) > 1]
        dof = sum(d for d, _ in spread)
        return None if not dof else math.sqrt(sum(d * sd * sd for d, sd in spread) / dof)


def seeds_for(sd: float, effect: float = STUDY_EFFECT, least: int = STUDY_LEAST_SEEDS) -> int:
    """The seeds a study needs to detect a true difference of `effect` between two arms with 80% power (two-sided
    paired t test at 0.05), where one arm's seeds spread by `sd`: the difference of two independent arms spreads by
    sqrt(2) x sd; at least `least`."""
    n = least
    while (found := detectable(math.sqrt(2) * sd, n)) is not None and found > effect:
        n += 1
    return n


def _gain(compared: Comparison, arm: str, rate: Rate) -> Estimate | None:
    after = compared.values.get((arm, rate, STAGES, POOLED), {})
    before = compared.values.get((arm, rate, 0, POOLED), {})
    return estimate({seed: after[seed] - before[seed] for seed in after if seed in before})


def gain_of(compared: Comparison, arm: str) -> Gain | None:
    """The arm's gain per seed over the screen's stage (None before a seed of it has both stages evaluated)."""
    valid, optimal = _gain(compared, arm, Rate.VALID), _gain(compared, arm, Rate.OPTIMAL)
    if valid is None or optimal is None:
        return None
    held = next(a for a in arms_of(compared.experiment) if a.name == arm).held
    config = held.configs[0] if held is not None else None
    return Gain(arm, config, valid, optimal, compared.estimate(arm, Rate.VALID, 0))


def _same_compute(a: Comparison, b: Comparison) -> None:
    """Refuse two experiments that differ in anything deciding compute or the score (as `adopt` does), or in the
    agent counts their runs train on."""
    mine, theirs = ({**c.experiment.settings.compute(), "policy": c.experiment.policy,
                     "agent_counts": list(c.experiment.settings.run.agent_counts or [])} for c in (a, b))
    differ = [f"{k} ({mine[k]!r:.80} against {theirs.get(k)!r:.80})" for k in mine if mine[k] != theirs.get(k)]
    if differ:
        raise HeadroomError(f"experiments {a.experiment.name!r} and {b.experiment.name!r} differ in "
                            f"{'; '.join(differ)}: not one screen")


def _trained_configs(engine: Engine, compared: Comparison, arm: str) -> dict[int, EnvConfig]:
    """The config stage `STAGES` of each seed's run of `arm` trained on (what `random` drew), by seed."""
    ids = {run.id: seed for (name, seed), run in compared.runs.items() if name == arm}
    with session(engine) as s:
        stages = s.exec(select(Stage).where(Stage.run_id.in_(list(ids)), Stage.index == STAGES)).all()
    return {ids[stage.run_id]: stage.config for stage in stages}


def headroom(engine: Engine, name: str = NAME, draws: str | None = None) -> Headroom:
    """Read the screen: experiment `name`'s held arms (the configs) and the `random` arm of experiment `draws`
    (default `NAME-random`; `name` itself where it has a random arm and `draws` is not given)."""
    try:
        compared = comparison(engine, name)
        own = any(a.engineer == "random" for a in arms_of(compared.experiment))
        other = compared if draws is None and own else comparison(engine, draws or f"{name}-random")
    except ExperimentError as err:
        raise HeadroomError(str(err)) from None
    if other is not compared:
        _same_compute(compared, other)
    if compared.stages != STAGES:
        raise HeadroomError(f"experiment {compared.experiment.name!r} has {compared.stages} stages; a screen trains "
                            f"{STAGES} after stage 0")
    random_arms = [a.name for a in arms_of(other.experiment) if a.engineer == "random"]
    if not random_arms:
        raise HeadroomError(f"experiment {other.experiment.name!r} has no random arm: its draws are the baseline")
    configs = [g for a in arms_of(compared.experiment) if a.held is not None and (g := gain_of(compared, a.name))]
    drawn = gain_of(other, random_arms[0])
    if not configs or drawn is None:
        raise HeadroomError(f"no gain to read yet: no run of {'a held config' if not configs else 'random'} has both "
                            f"stage 0 and stage {STAGES} evaluated (envlab experiment run)")
    configs.sort(key=lambda g: -g.valid.mean)  # stable: ties keep the grid's order
    return Headroom(compared, other, configs, drawn, _trained_configs(engine, other, random_arms[0]),
                    welch_interval(configs[0].valid.values, drawn.valid.values))


def plan_of(h: Headroom, scenario: str = SCENARIO) -> Plan:
    """The plan that made the screen `h`, read back from its experiments: where an option of `envlab experiment new`
    differs from its default (boards per stage, the validation set, GRPO settings, the policy), it is named."""
    e, chosen = h.experiment.experiment, load_scenario(scenario)
    s, run, options = e.settings, e.settings.run, []
    if s.instances != chosen.config.num_instances:
        options.append(f"--instances {s.instances}")
    if s.validation_per_size != EXPERIMENT_VALIDATION_PER_SIZE:
        options.append(f"--validation-per-size {s.validation_per_size}")
    if run.validation_boards:
        options.append(f"--validation-boards {run.validation_boards}")
    options += [f"--grpo {shlex.quote(f'{k}={json.dumps(v)}')}" for k, v in run.grpo.items()
                if chosen.grpo.get(k) != v]
    if e.policy != "tiny":
        options.append(f"--policy {shlex.quote(e.policy)}")
    held = tuple(Path(a.held.source).stem for a in arms_of(e) if a.held is not None)
    return Plan(e.name, scenario, held, e.seeds, h.draws_experiment.experiment.seeds,
                tuple(run.agent_counts or s.config.agent_counts), tuple(s.validation_agents), run.dev_per_size,
                tuple(options))


STEPS_SUFFIX = "-steps"  # the more-steps probe's experiment: `scripts/headroom-steps.sh` names it NAME-steps


@dataclass(frozen=True)
class Steps:
    """The more-steps probe (`scripts/headroom-steps.sh`): two of the screen's configs trained again for one stage at
    more GRPO steps; each one's gain there (`gains`, by arm) and, paired by seed, the better minus the worse at the
    probe's steps (`spread`) and at the screen's (`screen_spread`); `worse`, `better` as the screen ranked them."""

    experiment: Comparison
    worse: str
    better: str
    gains: dict[str, Estimate]
    spread: Estimate | None
    screen_spread: Estimate | None


def steps_probe(engine: Engine, h: Headroom, name: str) -> Steps | None:
    """Experiment `name` read as the screen's more-steps probe: None where it does not exist or no run of it has
    stage `STAGES` evaluated; refused where its arms are not two of the screen's configs or it has other stages."""
    try:
        probe = comparison(engine, name)
    except ExperimentError:
        return None
    ranked = [g.arm for g in h.configs]
    arms = [a.name for a in arms_of(probe.experiment)]
    if len(arms) != 2 or not set(arms) <= set(ranked) or probe.stages != STAGES:
        raise HeadroomError(f"experiment {name!r} is not a more-steps probe of the screen: it has arms "
                            f"{', '.join(arms)} and {probe.stages} stages, not 2 of the screen's configs and "
                            f"{STAGES} stage")
    worse, better = sorted(arms, key=ranked.index, reverse=True)
    gains = {a: g for a in arms if (g := _gain(probe, a, Rate.VALID)) is not None}
    if not gains:
        return None
    return Steps(probe, worse, better, gains, probe.difference(better, Rate.VALID, STAGES, against=worse),
                 h.experiment.difference(better, Rate.VALID, STAGES, against=worse))


# ---------------------------------------------------------------- words and files


def verdict(h: Headroom) -> str:
    """The sentence the report stands on: `Headroom +1.20 points: under 3 points.`"""
    side = "under" if h.headroom < THRESHOLD else "at least"
    return f"Headroom {points(h.headroom, signed=True)} points: {side} {THRESHOLD * 100:g} points."


def welch_text(h: Headroom) -> str:
    if h.welch is None:
        return "no interval: a side has fewer than 2 seeds"
    low, high, df = h.welch
    return f"95% Welch interval [{points(low, signed=True)}, {points(high, signed=True)}], {df:.1f} degrees of freedom"


def _levels(values: Sequence[float]) -> str:
    """A knob's values over the sizes: `0.1` where they are one, else their range `0.05-0.48`."""
    low, high = min(values), max(values)
    return f"{low:g}" if low == high else f"{low:g}-{high:g}"


def _knobs(config: EnvConfig) -> list[str]:
    return [mix_text(config.agent_ratio), _levels(list(config.hole_ratio.values())),
            _levels(list(config.wait_ratio.values()))]


def gain_rows(h: Headroom) -> tuple[list[str], list[list[str]]]:
    """The report's table: one row per config (best first), then the random draws."""
    headers = ["arm", "agent mix", "holes", "waits", "seeds", f"valid gain, stage 0 -> {STAGES} (points)",
               "every seed (points)", "optimal gain (points)", f"valid rate at stage {STAGES}"]
    rows = []
    for g, compared in [*((g, h.experiment) for g in h.configs), (h.draws, h.draws_experiment)]:
        knobs = _knobs(g.config) if g.config is not None else ["drawn per seed (below)", "", ""]
        rows.append([g.arm, *knobs, str(len(g.valid.values)), difference_cell(g.valid),
                     seeds_text(g.valid, signed=True), difference_cell(g.optimal),
                     cell(compared.estimate(g.arm, Rate.VALID, STAGES))])
    return headers, rows


def draw_rows(h: Headroom) -> tuple[list[str], list[list[str]]]:
    """One row per random draw: its seed, gain and the config it trained on (sizes with data, agent mix, knobs)."""
    initial = h.draws_experiment.experiment.settings.config
    headers = ["seed", "valid gain (points)", "agent mix", "holes", "waits", "note"]
    rows = []
    for seed, value in zip(h.draws.valid.seeds, h.draws.valid.values, strict=True):
        config = h.drawn.get(seed)
        note = "the engineer drew no config: trained on the initial one" if config == initial else ""
        rows.append([str(seed), points(value, signed=True), *(_knobs(config) if config else ["-", "-", "-"]), note])
    return headers, rows


def _experiment_text(c: Comparison) -> str:
    done = sum(r.status == "done" for r in c.runs.values())
    return (f"`{c.experiment.name}` ({len(c.arms)} arm{'s' if len(c.arms) > 1 else ''} x {c.experiment.seeds} "
            f"seeds, {done} of {len(c.runs)} runs done)")


def _few_seeds(h: Headroom) -> str:
    """What a config's interval is worth with its few seeds: `With 2 seeds that is 1 degree of freedom: ...`."""
    n = len(h.best.valid.values)
    if n < 2:
        return "With 1 seed a config has no interval; the screen ranks configs, and the headroom has none either."
    t = float(stats.t.ppf(0.5 + LEVEL / 2, n - 1))
    return (f"With {n} seeds that is {n - 1} degree{'s' if n > 2 else ''} of freedom: the half-width is {t:.1f} "
            "standard errors, so one config's interval is wide and says little alone; the screen ranks configs, and "
            "the headroom compares the best with every draw.")


def _seeds_lines(h: Headroom) -> list[str]:
    """The seeds the second-pass study needs at this spread (`seeds_for`), as a paragraph of the report."""
    if h.seed_sd is None:
        return []
    n = seeds_for(h.seed_sd)
    return ["## Seeds for a study of engineers", "",
            f"One config's gain spreads by {points(h.seed_sd)} points over its seeds (pooled over the configs). A "
            f"difference of two arms then spreads by about {points(math.sqrt(2) * h.seed_sd)} points, and "
            f"{n} seeds detect a true difference of {points(STUDY_EFFECT)} points with 80% power (two-sided paired t "
            f"test at 0.05; at least {STUDY_LEAST_SEEDS} seeds).", ""]


def _steps_lines(h: Headroom, steps: Steps) -> list[str]:
    """The more-steps probe as a section of the report: the two configs' gains at both step counts and the
    better minus the worse at each, paired by seed."""
    screen, probe = h.experiment.experiment.settings, steps.experiment.experiment.settings
    at = {g.arm: g.valid for g in h.configs}
    rows = [[arm, difference_cell(at[arm]), seeds_text(at[arm], signed=True), difference_cell(steps.gains.get(arm)),
             seeds_text(steps.gains[arm], signed=True) if arm in steps.gains else "-"]
            for arm in (steps.better, steps.worse)]
    rows.append([f"{steps.better} - {steps.worse}, paired by seed", difference_cell(steps.screen_spread),
                 seeds_text(steps.screen_spread, signed=True) if steps.screen_spread else "-",
                 difference_cell(steps.spread), seeds_text(steps.spread, signed=True) if steps.spread else "-"])
    a, b = f"{screen.steps_per_stage} steps", f"{probe.steps_per_stage} steps"
    growth = growth_text(steps, a, b)
    return ["## More steps per stage", "",
            f"The screen's best and worst configs trained again for one stage from the same stage 0, on "
            f"{probe.instances} boards ({probe.steps_per_stage} GRPO steps, against the screen's "
            f"{screen.steps_per_stage}): experiment {_experiment_text(steps.experiment)}, made and run by "
            "`bash scripts/headroom-steps.sh`. If the environment mattered more with longer stages, the difference "
            "between the two configs would grow.", "",
            *markdown_table(["config", f"valid gain at {a} (points)", "every seed", f"valid gain at {b} (points)",
                             "every seed"], rows), "", *([growth, ""] if growth else [])]


def growth_text(steps: Steps, a: str, b: str) -> str:
    """How much the better minus the worse changed from the screen's steps (`a`) to the probe's (`b`), paired by seed,
    with its 95% t interval where there are 2 seeds or more; empty until a seed has both."""
    if steps.spread is None or steps.screen_spread is None:
        return ""
    early = dict(zip(steps.screen_spread.seeds, steps.screen_spread.values, strict=True))
    late = dict(zip(steps.spread.seeds, steps.spread.values, strict=True))
    seeds = sorted(set(early) & set(late))
    if not seeds:
        return ""
    grew = [late[k] - early[k] for k in seeds]
    times = ", ".join(f"{late[k] / early[k]:.1f}" if early[k] > 0 else "-" for k in seeds)
    n, mean = len(grew), sum(grew) / len(grew)
    text = (f"Paired by seed, the better minus the worse changed by {points(mean, signed=True)} points from {a} to "
            f"{b} (seeds {', '.join(points(g, signed=True) for g in grew)}; at {b}, {times} times as large)")
    if n < 2:
        return f"{text}: 1 seed, no interval."
    half = float(stats.t.ppf(0.5 + LEVEL / 2, n - 1)) * statistics.stdev(grew) / math.sqrt(n)
    low, high = mean - half, mean + half
    side = ("it excludes zero" if low > 0 or high < 0 else
            f"it includes zero: with {n} seeds the change is a direction, not a finding")
    return (f"{text}; its 95% t interval is [{points(low, signed=True)}, {points(high, signed=True)}] "
            f"({n - 1} degree{'s' if n > 2 else ''} of freedom): {side}.")


def report_markdown(h: Headroom, remake: Sequence[str] = (), steps: Steps | None = None) -> str:
    """The screen's report: the commands that remake it, the headroom sentence and its interval, every config's gain
    and the random draws', the more-steps probe where there is one; where the headroom is under 3 points, what the
    screen varied."""
    s = h.experiment.experiment.settings
    trained = counts_text(s.run.agent_counts or s.config.agent_counts)
    lines = ["# Headroom screen", "", "Remade by:", "", "```bash", *remake, "```", "",
             f"**{verdict(h)}** The best config, {h.best.arm}, gained {points(h.best.valid.mean, signed=True)} "
             f"points of valid rate over one stage; the {len(h.draws.valid.values)} random draws gained "
             f"{points(h.draws.valid.mean, signed=True)} on average. Best minus random: {welch_text(h)} (the best "
             "config's seeds against the draws, unpaired).", "",
             f"Experiments {_experiment_text(h.experiment)} and {_experiment_text(h.draws_experiment)}. One stage "
             f"of {s.instances} boards ({s.steps_per_stage} GRPO steps) after stage 0, on {trained} agents; scored "
             f"on {s.validation_boards:,} validation boards of {counts_text(s.validation_agents)} agents. Stage 0 is "
             f"the same checkpoint for every run, evaluated once: valid rate {h.best.stage0.mean:.1%}.", "",
             "## How to read it", "",
             f"- A gain is a run's validation valid rate after stage {STAGES} minus stage 0's, in points; per arm the "
             f"mean over its seeds with a 95% Student-t interval (n - 1 degrees of freedom). {_few_seeds(h)}",
             "- The headroom is the best config's mean gain minus the random draws' mean gain. Its interval is "
             "Welch's (unpaired, each side its own variance): stage 0 is one checkpoint for every seed, so a seed "
             "shares only the training's random numbers across arms, and pairing by seed would keep "
             f"{len(set(h.best.valid.seeds) & set(h.draws.valid.seeds))} of the {len(h.draws.valid.values)} draws.",
             f"- The best config is picked on the runs that measure it, so its gain is biased upward (the largest "
             f"of {len(h.configs)} noisy means): a config worth keeping is run again on new seeds.", "",
             *_seeds_lines(h),
             "## Every config's gain", "", *markdown_table(*gain_rows(h)), "",
             "## The random draws", "", *markdown_table(*draw_rows(h)), ""]
    if steps is not None:
        lines += _steps_lines(h, steps)
    if h.headroom < THRESHOLD:
        mixes = "; ".join(f"{k} {mix_text(v)}" for k, v in MIXES.items())
        lines += [f"## Under {THRESHOLD * 100:g} points", "",
                  f"No config of this grid moved one stage's gain {THRESHOLD * 100:g} points beyond random configs. "
                  f"It varied the agent mix ({mixes}), the hole ratio ({', '.join(map(str, HOLES))}) and the wait "
                  f"ratio ({', '.join(map(str, WAITS))}), on sizes {counts_text(h.best.config.sizes)} with equal "
                  "data.", ""]
    return "\n".join(lines)


def csv_rows(h: Headroom) -> tuple[list[str], list[list]]:
    """gains.csv: one row per config, one for the random draws (gains as fractions), then the headroom's."""
    header = ["arm", "kind", "agent_ratio", "hole_ratio", "wait_ratio", "seeds", "valid_gain_mean", "valid_gain_low",
              "valid_gain_high", "valid_gain_sd", "optimal_gain_mean", "optimal_gain_low", "optimal_gain_high",
              "valid_gain_per_seed"]
    rows: list[list] = []
    for g in [*h.configs, h.draws]:
        knobs = _knobs(g.config) if g.config is not None else ["", "", ""]
        rows.append([g.arm, "config" if g.config is not None else "random", *knobs, len(g.valid.values),
                     g.valid.mean, g.valid.low, g.valid.high, g.valid.sd, g.optimal.mean, g.optimal.low,
                     g.optimal.high, " ".join(f"{v:.6g}" for v in g.valid.values)])
    low, high = (h.welch[0], h.welch[1]) if h.welch else ("", "")
    rows.append([f"{h.best.arm} - random", "headroom", "", "", "", "", h.headroom, low, high, "", "", "", "", ""])
    return header, rows


def write_report(h: Headroom, out: Path, remake: Sequence[str] = (), steps: Steps | None = None) -> dict[str, Path]:
    """`out/report.md` and `out/gains.csv`."""
    out.mkdir(parents=True, exist_ok=True)
    written = {"report": out / "report.md", "gains": out / "gains.csv"}
    written["report"].write_text(report_markdown(h, remake, steps))
    write_csv(written["gains"], *csv_rows(h))
    return written


# ---------------------------------------------------------------- the study the screen sizes


STUDY_NAME = "second-pass"
STUDY_STAGES = 4
# the `schedule` arm's agent mixes, from the fewest agents up to the counts the score asks for (`schedule_mixes`
# spreads them over a study's stages)
SCHEDULE_MIXES: tuple[dict[int, float], ...] = ({2: 0.5, 3: 0.5}, {3: 0.5, 4: 0.5}, {4: 0.5, 5: 0.5},
                                                {3: 1 / 3, 4: 1 / 3, 5: 1 / 3})
# the arms a study may hold, in the order they are made; `static` is the best config, `schedule` the mixes on it
STUDY_ARMS = ("random", "static", "schedule", "evidence", "bandit", "learnability")
PROBING_ARMS = frozenset({"learnability"})  # the arms whose proposals answer probes (`--match-compute` matches them)
STATIC_FILE, SCHEDULE_FILE = "static.json", "schedule.json"


@dataclass(frozen=True)
class StudyDesign:
    """What the study holds: its arms (a subset of `STUDY_ARMS`, kept in that order), its trained stages, how the
    compute of a probing arm is matched (`envlab experiment new --match-compute`; unused without one), the workers
    that run it (for the estimate of its hours) and its boards per stage (None: the screen's)."""

    arms: tuple[str, ...] = STUDY_ARMS
    stages: int = STUDY_STAGES
    match: str = "extra"
    workers: int = 2
    instances: int | None = None

    def __post_init__(self) -> None:
        unknown = [a for a in self.arms if a not in STUDY_ARMS]
        if unknown:
            raise HeadroomError(f"unknown arm {unknown[0]!r}: the study's arms are {', '.join(STUDY_ARMS)}")
        if len(set(self.arms)) != len(self.arms):
            raise HeadroomError("an arm is named twice")
        if len(self.arms) < 2:
            raise HeadroomError("a study compares at least 2 arms")
        if self.stages < 1 or self.workers < 1 or (self.instances is not None and self.instances < 1):
            raise HeadroomError("the stages, the workers and the boards per stage are at least 1")
        if self.match not in MATCH_MODES:
            raise HeadroomError(f"match {self.match!r}: one of {', '.join(MATCH_MODES)}")
        object.__setattr__(self, "arms", tuple(a for a in STUDY_ARMS if a in self.arms))

    @property
    def probing(self) -> bool:
        return any(a in PROBING_ARMS for a in self.arms)


def schedule_mixes(stages: int) -> tuple[dict[int, float], ...]:
    """`SCHEDULE_MIXES` over `stages` stages: all of them where there are as many stages or more (the last is held
    after), else evenly spaced ones that start at the fewest agents and end at the counts the score asks for."""
    last = len(SCHEDULE_MIXES) - 1
    if stages > last:
        return SCHEDULE_MIXES
    if stages == 1:
        return SCHEDULE_MIXES[-1:]
    return tuple(SCHEDULE_MIXES[int(i * last / (stages - 1) + 0.5)] for i in range(stages))


@dataclass(frozen=True)
class StudyPlan:
    """The study of engineers the screen sizes (docs/experiments.md, "The study the screen sizes"): the best config,
    held for every stage (`static`), a schedule of agent mixes on its holes and waits, the seeds for 80% power at
    `STUDY_EFFECT` from the screen's seed spread, and the median minutes of the screen's trained stage jobs (None
    where none is timed)."""

    best: Gain
    seed_sd: float | None
    seeds: int
    schedule: tuple[EnvConfig, ...]
    stage_minutes: float | None = None

    @property
    def static(self) -> EnvConfig:
        return self.best.config

    def hours(self, design: StudyDesign) -> float | None:
        """The study's wall hours at the screen's pace: every trained stage (arms x seeds x stages) at the screen's
        median stage job, `design.workers` at once (the screen's own workers shared its cores the same way); the
        GRPO steps that matched compute adds are not in it."""
        if self.stage_minutes is None:
            return None
        return len(design.arms) * self.seeds * design.stages * self.stage_minutes / design.workers / 60


def stage_minutes(engine: Engine, h: Headroom) -> float | None:
    """The median wall minutes of the screen's finished stage jobs that trained a stage (stage 0's evaluation, once
    for every run, is not one): a job paused or stopped in the middle counts its whole span, so the median, not
    the mean."""
    return median_stage_minutes(engine, [r.id for c in (h.experiment, h.draws_experiment) for r in c.runs.values()])


def median_stage_minutes(engine: Engine, ids: Sequence[int]) -> float | None:
    """The median wall minutes of runs `ids`' finished stage jobs that trained a stage (None where none did)."""
    with session(engine) as s:
        spans = [(f - st).total_seconds() / 60 for st, f in s.exec(
            select(Job.started_at, Job.finished_at).where(
                Job.run_id.in_(ids), Job.kind == JobKind.STAGE, Job.target >= 1, Job.status == JobStatus.DONE,
                Job.started_at.is_not(None), Job.finished_at.is_not(None)))]
    return statistics.median(spans) if spans else None


def study_plan(h: Headroom, stages: int = STUDY_STAGES, minutes: float | None = None) -> StudyPlan:
    """The study `h` sizes: `seeds_for` the screen's pooled seed spread (at least `STUDY_LEAST_SEEDS` where it has
    none), the best config as `static`, and `schedule_mixes(stages)` on the best config's holes, waits and data
    shares; `minutes` the screen's stage pace (`stage_minutes`)."""
    best = h.best
    if best.config is None:
        raise HeadroomError(f"the best arm {best.arm!r} holds no config")
    sd = h.seed_sd
    schedule = tuple(best.config.model_copy(update={"agent_ratio": dict(mix)}) for mix in schedule_mixes(stages))
    return StudyPlan(best, sd, seeds_for(sd) if sd is not None else STUDY_LEAST_SEEDS, schedule, minutes)


def write_study(plan: StudyPlan, h: Headroom, folder: Path, configs: Path, *, db: str, name: str = STUDY_NAME,
                design: StudyDesign = StudyDesign()) -> list[str]:
    """`folder/static.json` and `folder/schedule.json`, and the commands that make and run the study: the design's
    arms and stages on the screen's initial config, agent counts, validation set and options, compute matched as the
    design says where an arm probes, the valid rate first."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / STATIC_FILE).write_text(plan.static.model_dump_json(indent=2) + "\n")
    (folder / SCHEDULE_FILE).write_text(
        json.dumps([c.model_dump(mode="json") for c in plan.schedule], indent=2) + "\n")
    screen = plan_of(h)
    options = [o for o in screen.options if not (design.instances and o.startswith("--instances "))]
    if design.instances:  # more boards, so more GRPO steps, per stage than the screen's
        options.insert(0, f"--instances {design.instances}")
    f, d = shlex.quote(str(folder)), shlex.quote(db)
    held = {"static": f"static=static:{folder / STATIC_FILE}",
            "schedule": f"schedule=schedule:{folder / SCHEDULE_FILE}"}
    arms = ",".join(held.get(a, a) for a in design.arms)
    new = ["envlab experiment new", f"--name {name}", f"--arms {shlex.quote(arms)}", f"--seeds {plan.seeds}",
           f"--stages {design.stages}", f"--scenario {screen.scenario}",
           f"--config {shlex.quote(str(configs / INITIAL))}",
           f"--agent-counts {','.join(map(str, screen.agent_counts))}",
           f"--validation-agents {','.join(map(str, screen.validation_agents))}", "--primary valid",
           *([f"--match-compute {design.match}"] if design.probing else []), *options, f"--db {d}"]
    return [" ".join(new), f"envlab experiment run {name} --workers {design.workers} --threads 1 --db {d}",
            f"envlab experiment report {name} --db {d} --out {f}/report"]


def compute_text(plan: StudyPlan, design: StudyDesign) -> str:
    """The study's size in words: its trained stages and, where the screen timed its stages, the hours they take."""
    stages = len(design.arms) * plan.seeds * design.stages
    text = (f"{len(design.arms)} arms x {plan.seeds} seeds x {design.stages} stages: {stages} trained stages")
    hours = plan.hours(design)
    if hours is None:
        return text + " (the screen timed no stage)"
    text += (f"; at the screen's median stage job of {plan.stage_minutes:.1f} min on {design.workers} "
             f"worker{'s' if design.workers > 1 else ''}, about {hours:.1f} hours")
    if design.probing and design.match == "extra":
        text += ", before the extra GRPO steps that --match-compute extra gives the arms without probes"
    if design.instances is not None:
        text += f" (timed at the screen's boards per stage: {design.instances} take longer if they are more)"
    return text
