"""An experiment's results compared: per arm and stage, every seed's rate, their mean and a 95% interval, the
differences between arms paired by seed, each arm against the baseline Holm-adjusted, what this many seeds can
detect, and the area under the valid-rate curve (docs/experiments.md).

Every rate is a stage's rate as `lab.results.stage_summaries` reads it (docs/results.md): pooled over the stage's
validation boards, or over one map size's. The statistics, each computed here only:

- mean over seeds: the plain mean of the seeds' rates; `sd` their standard deviation (n - 1 in the denominator);
- 95% interval: Student's t over seeds (`t_interval`): mean +- t(0.975, n - 1) x sd / sqrt(n). With one seed
  the interval is the value itself (no spread to measure);
- paired difference: per seed, one arm's rate minus another's on the same seed (every pair of arms; the
  baseline, `fixed` when the experiment has it, else its first arm, for the summary), then mean, sd and t interval
  as above over the seeds both have: the paired t interval with n - 1 degrees of freedom;
- unpaired difference (`welch_interval`, the headroom screen's best config against the random draws): Welch's t
  interval, each sample's own variance, Welch-Satterthwaite degrees of freedom;
- p: the two-sided paired t test of a zero mean difference (`paired_p`), n - 1 degrees of freedom;
- against the baseline (`Comparison.versus_baseline`): every other arm minus the baseline at one stage is one family
  of comparisons, their p Holm-adjusted together (`holm`), each with its paired t interval at the level of its Holm
  step (`holm_levels`), so that an interval excludes zero exactly where its Holm p is below 0.05;
- detectable difference (`detectable`): the smallest true mean difference a two-sided paired t test at alpha 0.05
  finds with 80% power with this many seeds, were the differences' sd the one observed (the noncentral t);
- AUC: the trapezoid area under a run's valid-rate curve over stages 0..S divided by S, so it is the curve's
  mean rate (the same for the optimal rate); only for runs with every stage evaluated.

What every arm spent (`Spent`, `compute_rows`), summed over its runs and per run: GRPO optimizer steps and rollouts
(the completions GRPO samples for training boards, as the stage's `GRPOConfig` makes them: `stage_rollouts`), the
answers its engineer sampled probing configs (`Proposal.compute`), its validation and dev answers (episodes), its
jobs' wall time by kind, and every answer it generated per run against the cheapest arm's; where an arm's probes add
more than 5% to the answers it generated otherwise, the compute statement says the arms are not at equal compute in
answers (`answers_statement`).

Rates are fractions here and percent in words; a difference between two rates is in points (`+1.20`, never `%`).
`finding` says in one sentence what the comparisons with the baseline show for the experiment's primary metric at
the last stage. Where the validation boards have several agent counts, the report and the page add the last stage's
rate per count (`agents_rows`). `report_markdown`, `write_report` (CSV and PNG) and `curves_figure` (the page's
Compare tab and the PNG) all read one `Comparison`.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from sqlalchemy import Engine, func
from sqlmodel import Session, select

from envsim.suite import FIRST_AGENTS, Split
from lab.results import runs_summaries
from lab.settings import counts_text
from lab.study.experiments import MATCH_WORDS, arm_names, arms_of, experiment_runs, find_experiment, match_text
from lab.text import as_text
from storage.db import session
from storage.models import Experiment, Job, JobKind, ProbeCompute, Proposal, Run, Stage, StageMetric, StageStatus
from storage.settings import ExperimentSettings, Held, HeldConfigs

if TYPE_CHECKING:
    import plotly.graph_objects as go

LEVEL = 0.95  # the intervals' coverage
ALPHA = 0.05  # the paired t tests' level (two-sided): the detectable difference's, and Holm's family-wise
POWER = 0.8  # and the power it is detected with
BASELINE = "fixed"
POOLED = 0  # the `size` of a pooled rate in `Comparison.values` (map sizes start at 3)
AUC = -1  # the `stage` of an area-under-the-curve value in `Comparison.values`
PROBE_SHARE = 0.05  # probes that add more than this to an arm's other answers: not at equal compute in answers
TIMED = (JobKind.STAGE, JobKind.PROPOSE, JobKind.PROBE)  # the job kinds whose wall time the compute table shows


class Rate(StrEnum):
    """The two rates an experiment compares (docs/results.md)."""

    VALID = "valid"
    OPTIMAL = "optimal"


@dataclass(frozen=True)
class Estimate:
    """Seeds' values of one quantity: their mean, sd and 95% t interval; `seeds` in the order of `values`.
    For a paired difference, `detectable` is the smallest true difference this many seeds detect with 80% power
    and `p` the paired t test's two-sided p (both None with fewer than 2 seeds)."""

    seeds: tuple[int, ...]
    values: tuple[float, ...]
    mean: float
    low: float
    high: float
    sd: float = 0.0
    detectable: float | None = None
    p: float | None = None


def t_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float]:
    """Student's t interval of the mean of `values`: mean +- t((1 + level) / 2, n - 1) x sd / sqrt(n)."""
    from scipy import stats  # here, not at the top: the page starts without scipy (`lab.pages.web.warm`)

    x = np.asarray(values, dtype=float)
    mean = float(x.mean())
    if len(x) == 1:
        return mean, mean
    half = float(stats.t.ppf((1 + level) / 2, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)))
    return mean - half, mean + half


def welch_interval(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> tuple[float, float, float] | None:
    """Welch's t interval of mean(a) - mean(b) for two unpaired samples of unequal spread: the difference +-
    t((1 + level) / 2, df) x sqrt(var(a) / n_a + var(b) / n_b), df by Welch-Satterthwaite; returns (low, high, df).
    None where either sample has fewer than 2 values (no spread to measure); a point where neither has spread."""
    from scipy import stats

    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(x) < 2 or len(y) < 2:
        return None
    diff = float(x.mean() - y.mean())
    vx, vy = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    if vx + vy == 0:
        return diff, diff, float(len(x) + len(y) - 2)
    df = float((vx + vy) ** 2 / (vx ** 2 / (len(x) - 1) + vy ** 2 / (len(y) - 1)))
    half = float(stats.t.ppf((1 + level) / 2, df) * np.sqrt(vx + vy))
    return diff - half, diff + half, df


def t_power(difference: float, sd: float, n: int, alpha: float = ALPHA) -> float:
    """The power of a two-sided paired (one-sample) t test at `alpha` on `n` pairs whose differences have this sd,
    when the true mean difference is `difference`: P(|T| > t(1 - alpha/2, n-1)) under the noncentral t."""
    from scipy import stats

    df, crit = n - 1, stats.t.ppf(1 - alpha / 2, n - 1)
    ncp = difference / (sd / np.sqrt(n))
    return float(stats.nct.sf(crit, df, ncp) + stats.nct.sf(crit, df, -ncp))  # the far tail by symmetry: no NaN


@cache  # a pure function, asked again for the same difference by each table that shows it
def detectable(sd: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float | None:
    """The smallest true mean difference that `n` paired seeds detect with `power` (two-sided paired t test at
    `alpha`, differences of standard deviation `sd`); None with fewer than 2 seeds."""
    if n < 2:
        return None
    if sd == 0:
        return 0.0
    se = sd / np.sqrt(n)
    from scipy import optimize

    high = 4 * se  # power grows with the difference: double the bracket until it holds the answer
    while t_power(high, sd, n, alpha) < power:
        high *= 2
    return float(optimize.brentq(lambda d: t_power(d, sd, n, alpha) - power, 0.0, high, xtol=1e-12 * se))


def paired_p(values: Sequence[float]) -> float | None:
    """The two-sided p of the paired t test that the mean difference is 0: 2 P(T > |mean| / (sd / sqrt(n))), T
    Student's t with n - 1 degrees of freedom. None with fewer than 2 values; with no spread, 1 when every difference
    is 0 and 0 otherwise (as the t interval: a point)."""
    from scipy import stats

    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        return None
    sd = float(x.std(ddof=1))
    if sd == 0:
        return 1.0 if x.mean() == 0 else 0.0
    return float(2 * stats.t.sf(abs(x.mean()) / (sd / np.sqrt(len(x))), len(x) - 1))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of a family of m p-values, in their order: the i-th smallest times (m - i + 1),
    at most 1, and never below the adjusted p of the one before it."""
    m, running = len(pvalues), 0.0
    adjusted = [0.0] * m
    for step, i in enumerate(sorted(range(m), key=lambda i: pvalues[i])):
        running = max(running, min(1.0, (m - step) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def holm_levels(pvalues: Sequence[float], alpha: float = ALPHA) -> list[float]:
    """The coverage of each comparison's interval that goes with Holm's step-down at `alpha`, in their order: the
    i-th smallest p's step tests at alpha / (m - i + 1), so its interval has level 1 - alpha / (m - i + 1) while
    every step before it rejected; from the first step that does not reject on, every interval has that step's
    level (1 - alpha / (m - r), r the rejections). So an interval excludes zero exactly where the Holm p is below
    `alpha`; with one comparison it is the plain 1 - alpha interval, and it is never narrower than that."""
    m, rejecting, step_alpha = len(pvalues), True, alpha
    levels = [0.0] * m
    for step, i in enumerate(sorted(range(m), key=lambda i: pvalues[i])):
        if rejecting:
            step_alpha = alpha / (m - step)
            rejecting = pvalues[i] < step_alpha
        levels[i] = 1 - step_alpha
    return levels


def estimate(by_seed: dict[int, float], paired: bool = False) -> Estimate | None:
    """Mean, sd and t interval of the values by seed (None when there is none); for a paired difference
    (`paired`) also the difference this many seeds detect with 80% power and the paired t test's p."""
    if not by_seed:
        return None
    seeds = tuple(sorted(by_seed))
    values = tuple(by_seed[k] for k in seeds)
    low, high = t_interval(values)
    sd = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    if not paired:
        return Estimate(seeds, values, float(np.mean(values)), low, high, sd)
    return Estimate(seeds, values, float(np.mean(values)), low, high, sd, detectable(sd, len(values)),
                    paired_p(values))


@dataclass(frozen=True)
class Adjusted:
    """One arm minus the baseline as one of the comparisons with it at a stage, Holm-adjusted together: the
    paired difference (its raw p is `difference.p`), the Holm-adjusted p, and the paired t interval at the level of
    its Holm step (`holm_levels`), which excludes zero exactly where `holm_p` is below ALPHA."""

    arm: str
    difference: Estimate
    holm_p: float
    level: float
    low: float
    high: float

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


def auc(curve: Sequence[float]) -> float:
    """Trapezoid area under rates at stages 0..S, divided by S: the curve's mean rate."""
    s = len(curve) - 1
    return sum((curve[k] + curve[k + 1]) / 2 for k in range(s)) / s


Key = tuple[str, Rate, int, int]  # (arm, rate, stage or AUC, size or POOLED)


@dataclass(frozen=True)
class Spent:
    """What an arm's runs spent, summed over them: GRPO optimizer steps and rollouts (completions sampled for
    training boards) of their trained stages, the answers their engineers sampled probing configs
    (`Proposal.compute`), their validation and dev answers (the episodes of every evaluated stage, as stored), and
    their jobs' wall time (finished minus started) by `JobKind`, in seconds."""

    runs: int
    steps: int
    rollouts: int
    probe_answers: int
    evaluated: int
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def answers(self) -> int:
        """Every answer the runs generated: rollouts, probe answers, validation and dev answers."""
        return self.rollouts + self.probe_answers + self.evaluated

    @property
    def answers_per_run(self) -> float | None:
        return self.answers / self.runs if self.runs else None


@dataclass(frozen=True)
class Comparison:
    """An experiment's numbers: `values[key][seed]` per (arm, rate, stage, size); `runs[(arm, seed)]` the run."""

    experiment: Experiment
    arms: list[str]
    seeds: list[int]
    stages: int
    sizes: list[int]
    runs: dict[tuple[str, int], Run]
    values: dict[Key, dict[int, float]]
    episodes: dict[tuple[str, int, int, int], int]  # (arm, seed, stage, size or POOLED) -> validation episodes
    probe_compute: dict[str, dict[str, float]] = field(default_factory=dict)  # arm -> what its proposals measured
    spent: dict[str, Spent] = field(default_factory=dict)  # arm -> what its runs spent, every arm of the experiment
    stage_rollouts: int = 0  # completions GRPO samples in a trained stage (`stage_rollouts`; 0 before any trained)
    agents: list[int] = field(default_factory=list)  # the validation boards' agent counts, fewest first
    by_agents: dict[Key, dict[int, float]] = field(default_factory=dict)  # (arm, rate, stage, agent count) -> seed

    @property
    def ended(self) -> bool:
        """Every run done (what it spent is then final)."""
        return all(r.status == "done" for r in self.runs.values())

    def progress_text(self) -> str:
        """While runs go on: `, 63 of 120 stages evaluated` (stage 0 counts); once every run is done, ""."""
        if self.ended:
            return ""
        evaluated = sum(size == POOLED and (arm, seed) in self.runs for arm, seed, _, size in self.episodes)
        return f", {evaluated} of {len(self.runs) * (self.stages + 1)} stages evaluated"

    def agents_estimate(self, arm: str, rate: Rate, stage: int, agents: int) -> Estimate | None:
        """The rate over the boards with `agents` agents (of every size) at `stage`, over seeds."""
        return estimate(self.by_agents.get((arm, rate, stage, agents), {}))

    @property
    def baseline(self) -> str:
        return BASELINE if BASELINE in self.arms else self.arms[0]

    @property
    def rates(self) -> tuple[Rate, Rate]:
        """Both rates, the experiment's primary metric (`ExperimentSettings.primary`) first."""
        primary = Rate(self.experiment.settings.primary)
        return primary, next(r for r in Rate if r != primary)

    def estimate(self, arm: str, rate: Rate, stage: int, size: int = POOLED) -> Estimate | None:
        return estimate(self.values.get((arm, rate, stage, size), {}))

    def difference(self, arm: str, rate: Rate, stage: int, size: int = POOLED,
                   against: str | None = None) -> Estimate | None:
        """The arm minus the baseline (or the arm `against`), seed by seed (None for the baseline itself or
        without common seeds)."""
        other = against or self.baseline
        if arm == other:
            return None
        mine = self.values.get((arm, rate, stage, size), {})
        base = self.values.get((other, rate, stage, size), {})
        return estimate({k: mine[k] - base[k] for k in mine if k in base}, paired=True)

    def versus_baseline(self, rate: Rate, stage: int, size: int = POOLED) -> list[Adjusted]:
        """Every other arm minus the baseline at `stage`, paired by seed, in the arms' order: the family of those
        with 2 or more seeds paired (an arm with fewer has no p and is left out), Holm-adjusted together."""
        tested = [(arm, d) for arm in self.arms
                  if (d := self.difference(arm, rate, stage, size)) is not None and d.p is not None]
        ps = [d.p for _, d in tested]
        return [Adjusted(arm, d, p, level, *t_interval(d.values, level))
                for (arm, d), p, level in zip(tested, holm(ps), holm_levels(ps), strict=True)]

    def pairs(self) -> list[tuple[str, str]]:
        """Every pair of arms as (arm, against): each arm against every arm before it (the baseline first)."""
        arms = [self.baseline, *(a for a in self.arms if a != self.baseline)]
        return [(arms[j], arms[i]) for i in range(len(arms)) for j in range(i + 1, len(arms))]


def comparison(engine: Engine, key: str | int) -> Comparison:
    """Read an experiment's runs and their validation results (`runs_summaries`, one query for all), and what
    every arm spent (`Spent`: its proposals' probes, trained stages, validation and dev episodes and jobs' times)."""
    experiment = find_experiment(engine, key)
    stages = experiment.settings.stages
    runs = {(r.arm, r.seed): r for r in experiment_runs(engine, experiment.id)}
    values: dict[Key, dict[int, float]] = {}
    by_agents: dict[Key, dict[int, float]] = {}
    episodes: dict[tuple[str, int, int, int], int] = {}
    sizes: set[int] = set()
    counts: set[int] = set()
    with session(engine) as s:
        read = runs_summaries(s, [run.id for run in runs.values()])
        for (arm, seed), run in runs.items():
            summaries = read.get(run.id, {})
            for k, summary in summaries.items():
                tallies = {POOLED: summary.pooled, **summary.by_size}
                sizes.update(summary.by_size)
                for size, tally in tallies.items():
                    episodes[(arm, seed, k, size)] = tally.episodes
                    values.setdefault((arm, Rate.VALID, k, size), {})[seed] = tally.valid_rate
                    values.setdefault((arm, Rate.OPTIMAL, k, size), {})[seed] = tally.optimal_rate
                counts.update(summary.by_agents)
                for agents, tally in summary.by_agents.items():
                    by_agents.setdefault((arm, Rate.VALID, k, agents), {})[seed] = tally.valid_rate
                    by_agents.setdefault((arm, Rate.OPTIMAL, k, agents), {})[seed] = tally.optimal_rate
            if all(k in summaries for k in range(stages + 1)):
                for rate in Rate:
                    curve = [values[(arm, rate, k, POOLED)][seed] for k in range(stages + 1)]
                    values.setdefault((arm, rate, AUC, POOLED), {})[seed] = auc(curve)
        probed = s.exec(select(Run.arm, Proposal.compute).join(Run, Run.id == Proposal.run_id)
                        .where(Run.experiment_id == experiment.id)).all()
        probe_compute: dict[str, dict[str, float]] = {}
        for arm, compute in probed:
            if compute:
                cost = ProbeCompute.model_validate(compute)
                total = probe_compute.setdefault(arm, {"proposals": 0, "completions": 0, "seconds": 0.0})
                total["proposals"] += 1
                total["completions"] += cost.completions
                total["seconds"] += cost.seconds
        per_stage, spent = _spent(s, experiment, [arm for arm, _ in runs], probe_compute)
    return Comparison(experiment, arm_names(experiment), sorted({seed for _, seed in runs}), stages, sorted(sizes),
                      runs, values, episodes, probe_compute, spent, per_stage, sorted(counts), by_agents)


def stage_rollouts(settings: ExperimentSettings, policy: str) -> int:
    """The completions GRPO samples for the training boards of one stage (its rollouts), as the experiment recorded
    them when it was made (`training.stage.planned_rollouts`); an experiment made before that: counted now from its
    settings, as the stage's `GRPOConfig` makes them (torch and TRL load for it, once)."""
    if settings.rollouts_per_stage is not None:
        return settings.rollouts_per_stage
    from training.policy import prompt_style_of
    from training.stage import planned_rollouts

    return planned_rollouts(settings.instances, settings.grpo, prompt_style_of(policy), settings.processes)


def _spent(s: Session, experiment: Experiment, run_arms: list[str],
           probe_compute: dict[str, dict[str, float]]) -> tuple[int, dict[str, Spent]]:
    """A trained stage's rollouts and what every arm's runs spent (`Spent`), `run_arms` the arm of each run: one
    query each for the trained stages, the validation and dev episodes and the jobs' times."""
    ours = Run.experiment_id == experiment.id
    trained = dict(s.exec(select(Run.arm, func.count()).select_from(Stage).join(Run, Run.id == Stage.run_id)
                          .where(ours, Stage.index > 0, Stage.status == StageStatus.DONE).group_by(Run.arm)).all())
    evaluated = dict(s.exec(select(Run.arm, func.sum(StageMetric.episodes)).select_from(StageMetric)
                            .join(Run, Run.id == StageMetric.run_id)
                            .where(ours, StageMetric.split.in_([Split.VALIDATION, Split.DEV])).group_by(Run.arm)).all())
    seconds: dict[str, dict[str, float]] = {}
    for arm, kind, started, finished in s.exec(
            select(Run.arm, Job.kind, Job.started_at, Job.finished_at).select_from(Job).join(Run, Run.id == Job.run_id)
            .where(ours, Job.started_at.is_not(None), Job.finished_at.is_not(None))):
        by_kind = seconds.setdefault(arm, {})
        by_kind[kind] = by_kind.get(kind, 0.0) + (finished - started).total_seconds()
    settings = experiment.settings
    per_stage = stage_rollouts(settings, experiment.policy) if trained else 0  # no torch before then
    matched = settings.matched.rollouts if settings.matched is not None else {}
    return per_stage, {arm: Spent(run_arms.count(arm), trained.get(arm, 0) * settings.arm_steps(arm),
                                  trained.get(arm, 0) * (per_stage + matched.get(arm, 0) if per_stage else 0),
                                  int(probe_compute.get(arm, {}).get("completions", 0)), int(evaluated.get(arm) or 0),
                                  seconds.get(arm, {}))
                       for arm in arm_names(experiment)}


# ---------------------------------------------------------------- words


def pct(x: float) -> str:
    return f"{x:.1%}"


def points(x: float | None, signed: bool = False) -> str:
    """A difference of rates (or its sd) in points, two decimals: `+1.20`; `-` for nothing."""
    return "-" if x is None else f"{x * 100:{'+' if signed else ''}.2f}"


def p_text(p: float | None) -> str:
    """`0.012`; `<0.001`; `-` for none (fewer than 2 seeds)."""
    return "-" if p is None else "<0.001" if p < 0.001 else f"{p:.3f}"


def cell(e: Estimate | None) -> str:
    """A rate: `57.9% [55.0, 60.1]` (percent, the interval's ends in percent); `57.9% [1 seed: no interval]`; `-`
    for nothing."""
    if e is None:
        return "-"
    if len(e.values) < 2:
        return f"{e.mean * 100:.1f}% [1 seed: no interval]"
    return f"{e.mean * 100:.1f}% [{e.low * 100:.1f}, {e.high * 100:.1f}]"


def difference_cell(d: Estimate | None) -> str:
    """A paired difference in points with its 95% t interval: `+1.80 [+1.30, +2.30]`; `+1.50 [1 seed: no
    interval]`; `-` for nothing."""
    if d is None:
        return "-"
    if len(d.values) < 2:
        return f"{points(d.mean, signed=True)} [1 seed: no interval]"
    return f"{points(d.mean, signed=True)} [{points(d.low, signed=True)}, {points(d.high, signed=True)}]"


def adjusted_cell(a: Adjusted) -> str:
    """A difference from the baseline in points with its interval at the Holm level, ★ where that excludes zero:
    `+2.10 [+0.80, +3.40] ★`."""
    return (f"{points(a.difference.mean, signed=True)} [{points(a.low, signed=True)}, {points(a.high, signed=True)}]"
            + (" ★" if a.excludes_zero else ""))


def seeds_text(e: Estimate | None, signed: bool = False, of: Sequence[int] | None = None) -> str:
    """Every seed's value in seed order: rates in percent, `52.8, 53.1, 53.5`; differences (`signed`) in points,
    `+0.30, -1.10`; where they are not all the seeds `of` (an arm or a pair that lacks some), the seeds they are
    come first: `seeds 0, 3: 52.8, 53.5`."""
    if e is None:
        return "-"
    values = ", ".join(points(v, signed=True) if signed else f"{v * 100:.1f}" for v in e.values)
    if of is None or list(e.seeds) == sorted(of):
        return values
    return f"seed{'s' if len(e.seeds) > 1 else ''} {', '.join(map(str, e.seeds))}: {values}"


def comparisons(n: int) -> str:
    return f"{n} comparison{'' if n == 1 else 's'}"


def stage_name(k: int) -> str:
    return "AUC" if k == AUC else str(k)


def finding(compared: Comparison) -> str:
    """What the study shows, in one sentence computed from the numbers, for the primary metric at the last stage:
    each arm whose difference from the baseline excludes zero at its Holm level (the difference, that interval and
    the Holm p), then the others in a phrase, then the scope in parentheses. Names as text (`lab.text.as_text`):
    `heuristic - random: +2.10 points [+0.80, +3.40], Holm p 0.012; the others do not differ from random beyond
    their intervals (valid rate at stage 3, Holm over 3 comparisons).`"""
    rate, k, base = compared.rates[0], compared.stages, as_text(compared.baseline)
    scope = f"{rate} rate at stage {k}"
    if len(compared.arms) < 2:
        return f"One arm, {as_text(compared.arms[0])}: nothing to compare it with ({scope})."
    tested = compared.versus_baseline(rate, k)
    if not tested:
        return f"No arm has 2 seeds paired with {base} yet: no interval to compare ({scope})."
    found = [a for a in tested if a.excludes_zero]
    rest = [a for a in tested if not a.excludes_zero]
    parts = [f"{as_text(a.arm)} - {base}: {points(a.difference.mean, signed=True)} points "
             f"[{points(a.low, signed=True)}, {points(a.high, signed=True)}], Holm p {p_text(a.holm_p)}"
             for a in found]
    if len(rest) == 1:
        parts.append(f"{as_text(rest[0].arm)} does not differ from {base} beyond its interval")
    elif rest:
        parts.append(f"the others do not differ from {base} beyond their intervals" if found
                     else f"No arm differs from {base} beyond its interval")
    compared_arms = {a.arm for a in tested}
    if missing := [as_text(a) for a in compared.arms if a != compared.baseline and a not in compared_arms]:
        parts.append(f"{', '.join(missing)} not compared yet (fewer than 2 seeds paired)")
    return "; ".join(parts) + f" ({scope}, Holm over {comparisons(len(tested))})."


def holm_header(compared: Comparison, rate: Rate, stages: Sequence[int],
                name: Callable[[str], str] = as_text) -> str:
    """`Holm-adjusted over 4 comparisons with fixed`: the family at `stages` (each stage's, where they differ)."""
    sizes = {k: len(compared.versus_baseline(rate, k)) for k in stages}
    base = name(compared.baseline)
    if not any(sizes.values()):
        return f"Holm-adjusted over the comparisons with {base}, none yet (no arm has 2 seeds paired with it)"
    if len(set(sizes.values())) == 1:
        return f"Holm-adjusted over {comparisons(next(iter(sizes.values())))} with {base}"
    each = ", ".join(f"{n} at {'the AUC' if k == AUC else f'stage {k}'}" for k, n in sizes.items())
    return f"Holm-adjusted over the comparisons with {base} at each stage ({each})"


def holm_rows(compared: Comparison, rate: Rate, stages: Sequence[int]) -> tuple[list[str], list[list[str]]]:
    """Every arm minus the baseline at each of `stages`, stage by stage: (headers, one row per arm and stage of
    texts): the mean difference and its interval at the Holm level in points (★: it excludes zero), that level, the
    raw p and the Holm-adjusted p."""
    headers = [f"difference ({rate} rate)", "stage", "mean [interval at the Holm level] (points)", "level", "p",
               "Holm p"]
    rows = [[f"{a.arm} - {compared.baseline}", stage_name(k), adjusted_cell(a), f"{a.level:.2%}",
             p_text(a.difference.p), p_text(a.holm_p)]
            for k in stages for a in compared.versus_baseline(rate, k)]
    return headers, rows


def compute_statement(compared: Comparison) -> str:
    """What every arm was given: the equal compute, in one paragraph."""
    settings = compared.experiment.settings
    grpo = settings.grpo
    over = ", ".join(f"{k}={v}" for k, v in sorted(grpo.items())) or "the lab's defaults"
    return (f"Policy {as_text(compared.experiment.policy)}, {len(compared.arms)} arms x {compared.experiment.seeds} "
            f"seeds (seeds 0..{compared.experiment.seeds - 1}). Equal compute by construction: every run trains "
            f"{settings.stages} stages, each on {settings.instances} boards in {settings.steps_per_stage} "
            f"GRPO steps ({settings.stages * settings.steps_per_stage} in all; GRPO settings: {over}); each "
            f"stage, stage 0 included, is evaluated on {settings.validation_boards:,} validation boards "
            f"({settings.validation_per_size} per map size{_agents_text(settings)} in the set). Seed k gives every "
            "arm the same stage-0 policy and the same validation boards. "
            f"Scenario: {settings.scenario}." + _probe_statement(compared) + match_statement(compared)
            + (f" {unequal}" if (unequal := answers_statement(compared)) else ""))


def match_statement(compared: Comparison) -> str:
    """Whether the arms' generated answers were matched (`envlab experiment new --match-compute`), and how: each
    arm's extra (or fewer) GRPO steps per trained stage and the answers they sample; "" where no arm probes."""
    settings = compared.experiment.settings
    if settings.matched is not None:
        return (f" Compute matched ({MATCH_WORDS[settings.matched.mode]}, `--match-compute "
                f"{settings.matched.mode}`): {match_text(settings)}.")
    probing = [as_text(arm) for arm in compared.arms if arm in compared.probe_compute]
    if not probing:
        return ""
    return (f" Compute not matched: every arm trained the same GRPO steps, and {', '.join(probing)}'s probe answers "
            "came on top (`envlab experiment new --match-compute` gives the arms without probes extra GRPO steps "
            "for them).")


def _agents_text(settings: ExperimentSettings) -> str:
    """The validation boards' agent counts where they are not the 2 of every experiment before 3, 4, 5 became the
    default (`FIRST_AGENTS`): its reports read as they did."""
    if settings.validation_agents == FIRST_AGENTS:
        return ""
    return f" and agent count, agents {counts_text(settings.validation_agents)}"


def _probe_statement(compared: Comparison) -> str:
    """What arms spent measuring configs on the policy (`training.probe`) on top of the equal training compute."""
    if not compared.probe_compute:
        return ""
    spent = "; ".join(f"{as_text(arm)} sampled {t['completions']:,.0f} answers in {t['seconds']:,.0f} s over "
                      f"{t['proposals']:.0f} proposals" for arm, t in compared.probe_compute.items())
    others = [a for a in compared.arms if a not in compared.probe_compute]
    return (f" Measuring configs on the policy before proposing them is compute the training does not count: "
            f"{spent}" + (f"; {', '.join(as_text(a) for a in others)} spent none." if others else "."))


def _cheapest(compared: Comparison) -> float | None:
    """The fewest answers an arm generated per run (None when no arm generated any)."""
    return min((x.answers_per_run for x in compared.spent.values() if x.answers_per_run), default=None)


def _times(x: Spent, cheapest: float | None) -> str:
    """An arm's answers per run over the cheapest arm's: `1.30x`; `-` for an arm without runs or answers."""
    return f"{x.answers_per_run / cheapest:.2f}x" if x.answers_per_run and cheapest else "-"


def answers_statement(compared: Comparison) -> str:
    """One sentence, where an arm's probes add more than `PROBE_SHARE` to the answers its runs generated otherwise
    (training and evaluation): the arms are not at equal compute in answers, each such arm's share and its answers
    per run over the cheapest arm's; "" where none does."""
    cheapest = _cheapest(compared)
    parts = [f"{as_text(arm)}'s probes add {pct(x.probe_answers / own)} to the {own:,} answers its runs generated "
             f"in training and evaluation ({_times(x, cheapest)} the cheapest arm's answers per run)"
             for arm, x in compared.spent.items()
             if (own := x.answers - x.probe_answers) and x.probe_answers > PROBE_SHARE * own]
    return f"The arms are not at equal compute in answers: {'; '.join(parts)}." if parts else ""


def _sum_and_mean(total: float, runs: int, unit: float = 1, digits: int = 0) -> str:
    """A sum over an arm's runs and its mean per run: `1,024 (512)`; `-` without runs."""
    if not runs:
        return "-"
    return f"{total / unit:,.{digits}f} ({total / unit / runs:,.{digits}f})"


def compute_rows(compared: Comparison) -> tuple[list[str], list[list[str]]]:
    """What every arm spent (`Comparison.spent`): (headers, one row per arm of texts), each count and time summed
    over the arm's runs with its mean per run in parentheses, then every answer generated per run over the
    cheapest arm's (`1.30x`)."""
    headers = ["arm", "runs", "GRPO steps (optimizer steps)", "GRPO rollouts (completions sampled for training "
               "boards)", "probe answers (completions sampled measuring configs)", "validation + dev answers "
               "(episodes)", *(f"{kind} jobs (min)" for kind in TIMED), "answers per run (rollouts + probe + "
               "validation + dev) vs the cheapest arm"]
    cheapest = _cheapest(compared)
    rows = [[arm, str(x.runs), *(_sum_and_mean(n, x.runs) for n in (x.steps, x.rollouts, x.probe_answers,
                                                                         x.evaluated)),
             *(_sum_and_mean(x.seconds.get(kind, 0.0), x.runs, unit=60, digits=1) for kind in TIMED),
             _times(x, cheapest)]
            for arm in compared.arms if (x := compared.spent.get(arm)) is not None]
    return headers, rows


def _compute_section(compared: Comparison) -> list[str]:
    steps = compared.experiment.settings.steps_per_stage
    rollouts = (f"{compared.stage_rollouts:,} per trained stage ({compared.stage_rollouts / steps:,.4g} per step)"
                if compared.stage_rollouts else "none yet: no stage trained")
    so_far = "" if compared.ended else ("Runs go on: what they spent so far, the mean over every run of the arm, "
                                        "begun or not. ")
    return ["## Compute per arm", "",
            f"{so_far}Each cell: the sum over the arm's runs, then the mean per run in parentheses. GRPO steps: "
            f"optimizer steps as TRL counts them, {steps} per trained stage{_matched_words(compared)}. A rollout: one "
            "completion GRPO samples for a "
            f"training board, {rollouts}, as the stage's GRPOConfig makes them. Probe answers: the completions an "
            "engineer sampled measuring configs on the policy before proposing. Validation + dev answers: the "
            "episodes of every evaluated stage, stage 0's included (where runs share it, one generated it and the "
            "others copied it: docs/experiments.md). Job times: finished minus started, summed, in minutes. The "
            "last column: every answer generated per run over the cheapest arm's.", "",
            *markdown_table(*compute_rows(compared))]


def _matched_words(compared: Comparison) -> str:
    """The matching steps beside a stage's steps, where the experiment's arms were matched (`match_statement`)."""
    matched = compared.experiment.settings.matched
    if matched is None or not any(matched.steps.values()):
        return ""
    return ", " + ", ".join(f"{as_text(arm)} {compared.experiment.settings.arm_steps(arm)}"
                            for arm in compared.arms if matched.steps.get(arm)) + " (compute matched)"


def _stage_table(compared: Comparison, rate: Rate) -> list[str]:
    head = ["arm", *(f"stage {k}" for k in range(compared.stages + 1)), "AUC"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for arm in compared.arms:
        cells = [f"{cell(e)} ({seeds_text(e, of=compared.seeds)})" if (e := compared.estimate(arm, rate, k)) else "-"
                 for k in [*range(compared.stages + 1), AUC]]
        lines.append(f"| {as_text(arm)} | " + " | ".join(cells) + " |")
    return lines


def markdown_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table of texts whose first cell names arms (shown as text)."""
    return ["| " + " | ".join(headers) + " |", "|---" * len(headers) + "|",
            *("| " + " | ".join([as_text(first), *cells]) + " |" for first, *cells in rows)]


HOLM_TEXT = (
    "Per seed, the arm's rate minus the baseline's on the same seed (the same stage-0 policy and validation boards), "
    "then the mean of those differences in points. p: the two-sided paired t test of a zero mean difference (n - 1 "
    "degrees of freedom). Holm p: Holm's step-down adjustment over the arms compared with the baseline at that "
    "stage, one family per stage. The interval: the paired t interval at the level of the comparison's Holm step "
    f"(1 - {ALPHA:g} / (m - i + 1) for the i-th smallest p of m while every smaller one is rejected, then the level of "
    "the first step that is not), so it excludes zero, marked ★, exactly where the Holm p is below "
    f"{ALPHA:g}. Stage 0 is the same policy for every arm: no difference there.")


def _holm_section(compared: Comparison, rate: Rate, explain: bool = False) -> list[str]:
    stages = [*range(1, compared.stages + 1), AUC]
    return [f"## {rate.capitalize()} rate minus {as_text(compared.baseline)}, paired by seed (points): "
            f"{holm_header(compared, rate, stages)}", *(["", HOLM_TEXT, ""] if explain else []),
            *markdown_table(*holm_rows(compared, rate, stages))]


def _pair_tables(compared: Comparison, rate: Rate) -> list[str]:
    """Per stage after 0 (and the AUC), every pair of arms: the paired difference's mean and t interval, the sd
    of the differences, the difference this many seeds detect with 80% power, and every seed's difference."""
    lines: list[str] = []
    for k in [*range(1, compared.stages + 1), AUC]:
        lines += ["", f"### {'AUC' if k == AUC else f'Stage {k}'}", *markdown_table(
            *difference_table_rows(compared, rate, k))]
    return lines


def _seed_table(compared: Comparison, rate: Rate) -> list[str]:
    head = ["arm", "seed", "run", *(f"stage {k}" for k in range(compared.stages + 1)), "AUC"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for arm in compared.arms:
        for seed in compared.seeds:
            run = compared.runs.get((arm, seed))
            if run is None:
                continue
            cells = [pct(v[seed]) if seed in (v := compared.values.get((arm, rate, k, POOLED), {})) else "-"
                     for k in [*range(compared.stages + 1), AUC]]
            lines.append(f"| {as_text(arm)} | {seed} | {run.id} ({run.status}) | " + " | ".join(cells) + " |")
    return lines


def size_rows(compared: Comparison, rate: Rate = Rate.VALID) -> tuple[list[str], list[list[str]]]:
    """The last stage's rate per map size: (headers, one row per arm of `cell` texts)."""
    headers = ["arm", *(f"{s}x{s}" for s in compared.sizes), "all"]
    rows = [[arm, *(cell(compared.estimate(arm, rate, compared.stages, s)) for s in [*compared.sizes, POOLED])]
            for arm in compared.arms]
    return headers, rows


def agents_rows(compared: Comparison, rate: Rate = Rate.VALID) -> tuple[list[str], list[list[str]]]:
    """The last stage's rate per agent count of the validation boards (each over every size): (headers, one row
    per arm of `cell` texts)."""
    headers = ["arm", *(f"{k} agents" for k in compared.agents)]
    rows = [[arm, *(cell(compared.agents_estimate(arm, rate, compared.stages, k)) for k in compared.agents)]
            for arm in compared.arms]
    return headers, rows


def difference_table_rows(compared: Comparison, rate: Rate = Rate.VALID,
                          stage: int | None = None) -> tuple[list[str], list[list[str]]]:
    """Every pair of arms at `stage` (default the last): (headers, one row per pair of texts, in points): the paired
    difference with its own 95% t interval (not adjusted for the number of pairs), the sd of the differences, the
    difference detectable with 80% power, every seed's."""
    k = compared.stages if stage is None else stage
    headers = ["difference", "mean [95% t interval] (points)", "sd (points)", "detectable, 80% power (points)",
               "every seed (points)"]
    rows = [[f"{arm} - {against}", difference_cell(d), points(d.sd if len(d.values) > 1 else None),
             points(d.detectable), seeds_text(d, signed=True, of=compared.seeds)]
            for arm, against in compared.pairs()
            if (d := compared.difference(arm, rate, k, against=against)) is not None]
    return headers, rows


def _held_text(held: HeldConfigs) -> str:
    """A held arm's configs in a few words: its file, and a schedule's length."""
    return as_text(held.source) + (f", {len(held.configs)} items" if held.kind == Held.SCHEDULE else "")


def report_markdown(compared: Comparison) -> str:
    """The experiment's report as Markdown (what `envlab experiment report` prints): the finding (`finding`) first,
    the compute statement, what every arm spent (`compute_rows`), then every table of rates, the primary metric's
    before the other rate's; every name and the description as text (`lab.text.as_text`)."""
    e = compared.experiment
    primary, other = compared.rates
    done = sum(r.status == "done" for r in compared.runs.values())
    lines = [f"# Experiment {as_text(e.name)}", "", finding(compared), "",
             *([as_text(e.description), ""] if e.description else []), compute_statement(compared), "",
             f"Runs: {done} of {len(compared.runs)} done{compared.progress_text()}. Arms: " + ", ".join(
                 f"{as_text(a.name)} ({a.engineer}"
                 + (f", {as_text(a.backend)}, context {a.context}" if a.backend else "")
                 + (f", {_held_text(a.held)}" if a.held is not None else "") + ")"
                 for a in arms_of(e)) + f". Primary metric: the {primary} rate.", "",
             *_compute_section(compared), "",
             f"## Validation {primary} rate", "",
             "Each cell: the mean over seeds, its 95% Student-t interval over seeds (n - 1 degrees of freedom), "
             "then every seed's value in seed order (percent), after the seeds where an arm lacks some. AUC: the "
             f"area under the curve over stages 0..{compared.stages} by the trapezoid rule, divided by "
             f"{compared.stages}: the curve's mean rate.", "", *_stage_table(compared, primary), "",
             f"## Validation {other} rate", *_stage_table(compared, other), "",
             *_holm_section(compared, primary, explain=True), "",
             *_holm_section(compared, other), "",
             f"## Differences between arms, paired by seed ({primary} rate, points)", "",
             "Per seed, one arm's rate minus the other's on the same seed (the same stage-0 policy and validation "
             "boards); the mean of those differences with its paired t interval (n - 1 degrees of freedom), their "
             "standard deviation, and the smallest true difference a two-sided paired t test at alpha "
             f"{ALPHA:g} detects with {POWER:.0%} power with this many seeds, were the sd the one observed. "
             "Each interval here is its pair's own 95% interval, not adjusted for the number of pairs: the "
             f"comparisons with {as_text(compared.baseline)} above are. Stage 0 is the same policy for every arm: "
             "no difference there.", *_pair_tables(compared, primary), "",
             f"## Every seed ({primary} rate)", *_seed_table(compared, primary), "",
             f"## Stage {compared.stages} by map size ({primary} rate)",
             *markdown_table(*size_rows(compared, primary))]
    if len(compared.agents) > 1:
        lines += ["", f"## Stage {compared.stages} by agent count ({primary} rate)", "",
                  "Each count's rate over its validation boards of every size: mean over seeds [95% interval].", "",
                  *markdown_table(*agents_rows(compared, primary))]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- files


def seed_rows(compared: Comparison) -> tuple[list[str], list[list]]:
    """One row per (arm, seed, stage): the pooled rates and each size's (runs.csv)."""
    header = ["experiment", "arm", "seed", "run_id", "stage", "episodes", "valid_rate", "optimal_rate",
              *(f"{r}_rate_{s}" for r in Rate for s in compared.sizes)]
    rows = []
    for arm in compared.arms:
        for seed in compared.seeds:
            run = compared.runs.get((arm, seed))
            for k in range(compared.stages + 1):
                if run is None or (arm, seed, k, POOLED) not in compared.episodes:
                    continue
                def value(rate: Rate, size: int, k: int = k, arm: str = arm, seed: int = seed) -> float | str:
                    return compared.values.get((arm, rate, k, size), {}).get(seed, "")

                rows.append([compared.experiment.name, arm, seed, run.id, k, compared.episodes[(arm, seed, k, POOLED)],
                             *(value(r, POOLED) for r in Rate), *(value(r, s) for r in Rate for s in compared.sizes)])
    return header, rows


def summary_rows(compared: Comparison) -> tuple[list[str], list[list]]:
    """One row per (arm, rate, stage or `auc`, size or `all`): seeds, mean, interval, the paired difference from the
    baseline with its 95% interval, and its raw p, Holm-adjusted p and interval at the Holm level (the family: every
    arm against the baseline at that rate, stage and size)."""
    header = ["arm", "rate", "stage", "size", "seeds", "mean", "low", "high", "sd", f"diff_vs_{compared.baseline}_mean",
              "diff_low", "diff_high", "diff_sd", "diff_detectable", "diff_p", "diff_holm_p", "diff_holm_level",
              "diff_holm_low", "diff_holm_high"]
    cells = [(rate, k, size) for rate in Rate for k in [*range(compared.stages + 1), AUC]
             for size in [POOLED, *(compared.sizes if k != AUC else [])]]
    families = {c: {a.arm: a for a in compared.versus_baseline(*c)} for c in cells}
    rows = []
    for arm in compared.arms:
        for rate, k, size in cells:
            e = compared.estimate(arm, rate, k, size)
            if e is None:
                continue
            d = compared.difference(arm, rate, k, size)
            a = families[(rate, k, size)].get(arm)
            rows.append([arm, rate.value, "auc" if k == AUC else k, "all" if size == POOLED else size,
                         len(e.seeds), e.mean, e.low, e.high, e.sd,
                         *((d.mean, d.low, d.high, d.sd, d.detectable, d.p) if d else ("",) * 6),
                         *((a.holm_p, a.level, a.low, a.high) if a else ("",) * 4)])
    return header, rows


def difference_rows(compared: Comparison) -> tuple[list[str], list[list]]:
    """One row per (pair of arms, rate, stage or `auc`), pooled: the paired difference, its t interval, sd, the
    difference detectable with 80% power, and every seed's difference (differences.csv)."""
    header = ["arm", "against", "rate", "stage", "seeds", "mean", "low", "high", "sd", "detectable",
              *(f"seed_{k}" for k in compared.seeds)]
    rows = []
    for arm, against in compared.pairs():
        for rate in Rate:
            for k in [*range(compared.stages + 1), AUC]:
                d = compared.difference(arm, rate, k, against=against)
                if d is not None:
                    by_seed = dict(zip(d.seeds, d.values, strict=True))
                    rows.append([arm, against, rate.value, "auc" if k == AUC else k, len(d.seeds), d.mean, d.low,
                                 d.high, d.sd, "" if d.detectable is None else d.detectable,
                                 *(by_seed.get(k2, "") for k2 in compared.seeds)])
    return header, rows


def write_csv(path: Path, header: list[str], rows: list[list]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


# Tries at drawing curves.png: on a loaded machine kaleido once asked its page before the page's script had loaded
# ("kaleido_scopes is not defined"); each try starts a browser of its own.
DRAW_TRIES = 3


# What `write_report` writes, by its key in the answer: a report's whole folder.
REPORT_FILES = {"report": "report.md", "runs": "runs.csv", "summary": "summary.csv", "differences": "differences.csv",
                "figure": "curves.png"}


def write_report(compared: Comparison, out: Path) -> dict[str, Path | str]:
    """Write `report.md`, `runs.csv`, `summary.csv`, `differences.csv` and `curves.png` into `out`; returns what was
    written (the PNG's entry is the reason instead when it could not be drawn, e.g. no Chromium for kaleido)."""
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path | str] = {key: out / name for key, name in REPORT_FILES.items()}
    written["report"].write_text(report_markdown(compared))
    write_csv(written["runs"], *seed_rows(compared))
    write_csv(written["summary"], *summary_rows(compared))
    write_csv(written["differences"], *difference_rows(compared))
    figure = curves_figure(compared, compared.rates)
    for left in range(DRAW_TRIES - 1, -1, -1):
        try:
            figure.write_image(written["figure"], width=1200, height=520, scale=2)
            break
        except Exception as err:  # kaleido needs a Chromium; the numbers are written whatever happens here
            if left == 0:
                written["figure"] = f"not drawn ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
    return written


# ---------------------------------------------------------------- the figure


def _rgba(colour: str, alpha: float) -> str:
    r, g, b = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def curves_figure(compared: Comparison, rates: tuple[Rate, ...] = (Rate.VALID,)) -> go.Figure:
    """Per rate, one panel: for each arm (one colour each) its mean curve over stages (trace named by the arm),
    its 95% interval as a band (`<arm> interval`) and one dot per seed (`<arm> seeds`). Plotly is imported here, not
    with the module: `envlab run`'s commands read this module and draw nothing (a GPU machine carries no Plotly)."""
    import plotly.graph_objects as go
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=len(rates), subplot_titles=[f"validation {r} rate" for r in rates])
    palette = qualitative.D3  # Tableau 10: five arms in five hues apart (Plotly's own puts blue beside purple)
    for col, rate in enumerate(rates, 1):
        for i, arm in enumerate(compared.arms):
            colour = palette[i % len(palette)]
            found = [(k, e) for k in range(compared.stages + 1) if (e := compared.estimate(arm, rate, k)) is not None]
            if not found:
                continue
            xs = [k for k, _ in found]
            first = col == 1
            fig.add_trace(go.Scatter(x=xs + xs[::-1], y=[e.high for _, e in found] + [e.low for _, e in found][::-1],
                                     mode="lines", fill="toself", fillcolor=_rgba(colour, 0.15), line=dict(width=0),
                                     name=f"{arm} interval", legendgroup=arm, showlegend=False, hoverinfo="skip"),
                          row=1, col=col)
            fig.add_trace(go.Scatter(x=xs, y=[e.mean for _, e in found], mode="lines+markers", name=arm,
                                     legendgroup=arm, showlegend=first, line=dict(color=colour, width=3),
                                     customdata=[[e.low, e.high, len(e.seeds)] for _, e in found],
                                     hovertemplate=f"{arm}, stage %{{x}}: %{{y:.1%}} [%{{customdata[0]:.1%}}, "
                                                   "%{customdata[1]:.1%}] over %{customdata[2]} seeds<extra></extra>"),
                          row=1, col=col)
            offset = (i - (len(compared.arms) - 1) / 2) * 0.06  # arms' dots a little apart
            dots = [(k + offset, v, seed) for k, e in found for seed, v in zip(e.seeds, e.values, strict=True)]
            fig.add_trace(go.Scatter(x=[d[0] for d in dots], y=[d[1] for d in dots], mode="markers",
                                     name=f"{arm} seeds", legendgroup=arm, showlegend=False,
                                     marker=dict(color=colour, size=7, opacity=0.7, line=dict(color="white", width=1)),
                                     customdata=[d[2] for d in dots],
                                     hovertemplate=f"{arm}, seed %{{customdata}}: %{{y:.1%}}<extra></extra>"),
                          row=1, col=col)
        fig.update_xaxes(title_text="stage", dtick=1, row=1, col=col)
        fig.update_yaxes(tickformat=".1%", row=1, col=col)
    fig.update_layout(height=460, margin=dict(l=50, r=10, t=90, b=40), plot_bgcolor="white",
                      font=dict(family="system-ui, sans-serif", size=13),  # the legend above the subplot titles
                      legend=dict(orientation="h", x=1, xanchor="right", y=1.1, yanchor="bottom"),
                      title=dict(text=f"Experiment {compared.experiment.name}: mean over seeds, 95% interval, one "
                                      "dot per seed", x=0.01, font=dict(size=14)))
    return fig
