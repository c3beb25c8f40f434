"""The gate: does the best environment move as the policy learns? (docs/results/README.md, "The gate")

An engineer that adapts the environment to the policy can only beat the best fixed environment if the best
environment changes as training goes on. The gate measures that before any adaptive engineer is studied: the same
configs, trained for one stage each, from three starting points of one policy's training:

- `weak`: an early checkpoint of the 2-to-5-agent warm start (`WEAK_STEP`, where 4 and 5 agents are near 0%),
- `tiny`: the shipped `tiny` (step 22,000 of the same warm start),
- `static`: `tiny` trained two stages of 128 GRPO steps on the headroom screen's best config (the second-pass study's
  `static` arm, seed 0).

Each start is one experiment (`gate-weak`, `gate-tiny`, `gate-static`) of the same settings: the configs below as
`static:FILE` arms, `SEEDS` seeds, one stage of `INSTANCES` boards (`STEPS` GRPO steps), `DEV_PER_SIZE` dev boards
per (agent count, map size) drawn for each seed (a cell's standard error is at most 2.9 points at that count), and
the 2,520 validation boards of 3 to 5 agents. Configs are ranked on the dev boards and scored on validation.

    envlab gate make-configs --out DIR     # initial.json and one file per config
    envlab gate checkpoint NAME --db DB    # the policy an experiment's single run ended on
    envlab gate report --db DB --out DIR   # per start: the ranking; between starts: does it move?

**What the report reads.** A config's gain at a start is, per seed, its valid rate after the stage minus stage 0's
(the start itself), on that seed's dev boards (what selects and ranks) and on the validation boards (what scores).
Per start: the configs ranked by mean dev gain. Between two starts: Spearman's rank correlation of the configs' mean
dev gains. **The best config moves** where the config chosen on dev at one start, trained from another start, loses
to the config chosen on dev there by more than the seed spread there (the pooled standard deviation of one config's
validation gain over its seeds), in mean validation gain paired by seed. If it moves nowhere, no adaptive engineer
can beat the best static config on this testbed from these starts, whatever it reads.

The configs widen the headroom screen's grid past its corner (fewest holes, most waits), where its winner sat: 5%
holes with 90% of the boards needing a wait, and no holes at all, at each of its three agent mixes; its winner
itself as the anchor, and one harder config (uniform mix, 25% holes, half the boards needing a wait) for the
ranking's other end. A wait ratio near 1 on a board without holes cannot be generated: two agents on an open 9x9
rarely have to wait, so 1,024 boards of the mixes with 2 agents found too few (`envsim.generator.cannot_fill`:
holes 0 fails at waits 0.85 and up for mixA, 0.75 and up for mixC; holes 0.05 fills at 0.9, not at 1.0). Each
config was checked to fill for both seeds' stage 1 before the gate started.
"""

from __future__ import annotations

import math
import shlex
import statistics
from dataclasses import dataclass
from pathlib import Path

from scipy import stats
from sqlmodel import select

from envsim.config import EnvConfig
from envsim.suite import Split
from lab.results import stage_summaries
from lab.study.comparison import ALPHA, detectable, markdown_table, points, write_csv
from lab.study.experiments import ExperimentError, experiment_runs, find_experiment, load_scenario
from lab.study.headroom import INITIAL, MIXES, SCENARIO, config_name, initial_config, median_stage_minutes
from storage.db import runs_root, session
from storage.models import Experiment, Run, RunStatus, Stage

# (agent mix, hole ratio, wait ratio) of each config, as the headroom screen names them
GRID: tuple[tuple[str, float, float], ...] = (
    ("mixA", 0.1, 0.75),  # the headroom screen's winner: the anchor
    ("mixA", 0.05, 0.9),
    ("mixB", 0.05, 0.9),
    ("mixC", 0.05, 0.9),
    ("mixA", 0.0, 0.75),
    ("mixB", 0.0, 0.75),
    ("mixC", 0.0, 0.6),
    ("mixB", 0.25, 0.5),  # harder: the ranking's other end
)
STARTS = ("weak", "tiny", "static")
SEEDS = 2
INSTANCES = 1024  # 256 GRPO steps a stage (the tiny policy's 8 answers a board, 32 a step)
STEPS = INSTANCES * 8 // 32
DEV_PER_SIZE = 300  # sqrt(0.25 / 300) = 2.9 points: a (count, size) cell's standard error at worst
WEAK_STEP = 10_000  # the warm start's check boards there: 43.1 / 22.2 / 7.9 / 0.0% at 2 / 3 / 4 / 5 agents
PREP = "gate-start-static"  # the experiment that trains the `static` start


class GateError(ValueError):
    """The gate cannot be made or read as asked; the message says why."""


def configs(initial: EnvConfig) -> dict[str, EnvConfig]:
    """The gate's configs by name, on the initial config's sizes with its data shares and boards per stage."""
    return {config_name(mix, holes, waits): initial.model_copy(update={
        "hole_ratio": dict.fromkeys(initial.sizes, holes), "wait_ratio": dict.fromkeys(initial.sizes, waits),
        "agent_ratio": dict(MIXES[mix])}) for mix, holes, waits in GRID}


def write_configs(out: Path, scenario: str = SCENARIO) -> dict[str, Path]:
    """`out/initial.json` (the headroom screen's: sizes 5..10, data even) and `out/<name>.json` per config."""
    initial = initial_config(load_scenario(scenario).config)
    out.mkdir(parents=True, exist_ok=True)
    (out / INITIAL).write_text(initial.model_dump_json(indent=2) + "\n")
    files = {}
    for name, config in configs(initial).items():
        files[name] = out / f"{name}.json"
        files[name].write_text(config.model_dump_json(indent=2) + "\n")
    return files


def final_checkpoint(engine, name: str) -> str:
    """The policy the one run of experiment `name` ended on: its last stage's checkpoint (absolute; a stored one is
    relative to the runs root, an absolute one stays as it is), once the run is done."""
    with session(engine) as s:
        experiment = s.exec(select(Experiment).where(Experiment.name == name)).first()
        if experiment is None:
            raise GateError(f"no experiment named {name!r}")
        runs = s.exec(select(Run).where(Run.experiment_id == experiment.id)).all()
        if len(runs) != 1:
            raise GateError(f"experiment {name!r} has {len(runs)} runs; a start is the end of one run")
        run = runs[0]
        if run.status != RunStatus.DONE:
            raise GateError(f"experiment {name!r}: its run {run.id} is {run.status}, not done")
        last = s.exec(select(Stage).where(Stage.run_id == run.id).order_by(Stage.index.desc())).first()
        if last is None or not last.checkpoint:
            raise GateError(f"experiment {name!r}: its run {run.id} has no trained stage with a checkpoint")
        return str(runs_root(engine) / last.checkpoint)


# ---------------------------------------------------------------- the report

Gains = dict[str, dict[int, float]]  # config -> seed -> gain (a rate's difference, 0.012 is 1.2 points)


@dataclass(frozen=True)
class Start:
    """One start's screen as it stands: each config's gain by seed on the dev boards and on validation (seeds whose
    run has both stages evaluated on that split), stage 0's mean valid rate on validation, and the runs done."""

    name: str
    experiment: str
    dev: Gains
    validation: Gains
    stage0: float | None
    done: int
    runs: int

    def mean(self, config: str, split: Split = Split.DEV) -> float | None:
        by_seed = (self.dev if split == Split.DEV else self.validation).get(config, {})
        return sum(by_seed.values()) / len(by_seed) if by_seed else None

    def ranking(self) -> list[str]:
        """The configs with a dev gain, best first (ties: by name, for a stable order)."""
        return sorted((c for c in self.dev if self.dev[c]), key=lambda c: (-self.mean(c), c))

    @property
    def best(self) -> str | None:
        ranked = self.ranking()
        return ranked[0] if ranked else None

    def seed_spread(self) -> float | None:
        """The pooled standard deviation of one config's validation gain over its seeds (None without a config of 2
        or more seeds)."""
        parts = [(len(v) - 1, statistics.variance(v.values())) for v in self.validation.values() if len(v) > 1]
        dof = sum(d for d, _ in parts)
        return math.sqrt(sum(d * var for d, var in parts) / dof) if dof else None


def _gains(before: dict[int, float], after: dict[int, float]) -> dict[int, float]:
    return {seed: after[seed] - before[seed] for seed in after if seed in before}


def read_start(engine, start: str, prefix: str = "gate") -> Start | None:
    """Start `start`'s experiment (`<prefix>-<start>`) read from the database; None where it is not made yet."""
    try:
        experiment = find_experiment(engine, f"{prefix}-{start}")
    except ExperimentError:
        return None
    runs = experiment_runs(engine, experiment.id)
    rates: dict[Split, dict[str, dict[int, dict[int, float]]]] = {Split.DEV: {}, Split.VALIDATION: {}}
    with session(engine) as s:
        for run in runs:
            for split, by_arm in rates.items():
                for k, summary in stage_summaries(s, run.id, split).items():
                    by_arm.setdefault(run.arm, {}).setdefault(k, {})[run.seed] = summary.pooled.valid_rate
    gains = {split: {arm: _gains(by_stage.get(0, {}), by_stage.get(1, {})) for arm, by_stage in by_arm.items()}
             for split, by_arm in rates.items()}
    stage0 = [v for by_stage in rates[Split.VALIDATION].values() for v in by_stage.get(0, {}).values()]
    return Start(start, experiment.name, gains[Split.DEV], gains[Split.VALIDATION],
                 sum(stage0) / len(stage0) if stage0 else None,
                 sum(r.status == RunStatus.DONE for r in runs), len(runs))


def rank_correlation(a: Start, b: Start) -> tuple[float, int] | None:
    """Spearman's rho of the two starts' mean dev gains over the configs both have, and how many (None under 3)."""
    common = sorted(set(a.ranking()) & set(b.ranking()))
    if len(common) < 3:
        return None
    rho = stats.spearmanr([a.mean(c) for c in common], [b.mean(c) for c in common]).statistic
    return float(rho), len(common)


@dataclass(frozen=True)
class Move:
    """Trained from start `at`: its own best (`best`, chosen on its dev boards) minus the best of start `other`
    (`theirs`), in validation gain paired by seed; `loses` where that is more than the seed spread at `at`."""

    at: str
    other: str
    best: str
    theirs: str
    by_seed: dict[int, float]
    spread: float | None

    @property
    def difference(self) -> float | None:
        return sum(self.by_seed.values()) / len(self.by_seed) if self.by_seed else None

    @property
    def loses(self) -> bool:
        return self.difference is not None and self.spread is not None and self.difference > self.spread


def moves(starts: list[Start]) -> list[Move]:
    """Every ordered pair of starts whose bests differ: how much the other start's best loses here."""
    out = []
    for here in starts:
        for there in starts:
            if here is there or here.best is None or there.best is None or here.best == there.best:
                continue
            mine, theirs = here.validation.get(here.best, {}), here.validation.get(there.best, {})
            out.append(Move(here.name, there.name, here.best, there.best,
                            {k: mine[k] - theirs[k] for k in sorted(mine) if k in theirs}, here.seed_spread()))
    return out


def verdict(starts: list[Start]) -> str:
    """The gate's answer in one line."""
    read = [s for s in starts if s.best is not None]
    if len(read) < 2:
        return "Not read yet: fewer than two starts have a config with both stages evaluated."
    lost = [m for m in moves(read) if m.loses]
    if lost:
        worst = max(lost, key=lambda m: m.difference)
        return (f"The best config moves: from the {worst.at} start, {worst.theirs} (the {worst.other} start's best) "
                f"gains {points(worst.difference)} points less than {worst.best}, more than the seed spread there "
                f"({points(worst.spread)}).")
    return ("The best config does not move beyond the seed spread: at every start, every other start's best comes "
            "within one seed spread of its own.")


def most_different(starts: list[Start]) -> str | None:
    """The start whose ranking agrees least with the others' (the lowest mean rank correlation)."""
    rhos = {s.name: [r[0] for t in starts if t is not s and (r := rank_correlation(s, t))] for s in starts}
    rhos = {k: v for k, v in rhos.items() if v}
    return min(rhos, key=lambda k: sum(rhos[k]) / len(rhos[k])) if rhos else None


def _signed(values: dict[int, float]) -> str:
    return ", ".join(points(values[k], signed=True) for k in sorted(values)) or "-"


def start_rows(start: Start) -> list[list[str]]:
    ranked = start.ranking()
    others = sorted(set(start.validation) - set(ranked))
    return [[c, str(i + 1) if c in ranked else "-", points(start.mean(c), True) if c in ranked else "-",
             _signed(start.dev.get(c, {})), points(start.mean(c, Split.VALIDATION), True)
             if start.validation.get(c) else "-", _signed(start.validation.get(c, {}))]
            for i, c in enumerate([*ranked, *others])]


def report_markdown(starts: list[Start], remake: list[str]) -> str:
    lines = ["# The gate: does the best environment move as the policy learns?", "", "Remade by:", "", "```bash",
             *remake, "```", "", f"**{verdict(starts)}**", ""]
    lines += [f"One stage of {STEPS} GRPO steps ({INSTANCES} boards) per config and seed, from each start; gains "
              "in points of valid rate, the stage's minus stage 0's (the start's own). Ranked on each seed's "
              f"{DEV_PER_SIZE} dev boards per (agent count, map size) of 3 to 5 agents; scored on the 2,520 "
              "validation boards.", ""]
    for start in starts:
        lines.append(f"## From the {start.name} start (`{start.experiment}`)")
        lines.append("")
        stage0 = "-" if start.stage0 is None else f"{start.stage0 * 100:.1f}%"
        spread = start.seed_spread()
        lines.append(f"{start.done} of {start.runs} runs done. Stage 0's validation valid rate: {stage0}. Seed spread "
                     f"of one config's validation gain: {points(spread)} points.")
        lines.append("")
        lines += markdown_table(["config", "rank on dev", "dev gain", "every seed", "validation gain", "every seed"],
                                start_rows(start))
        lines.append("")
    lines += ["## Between starts", "", "Spearman's rank correlation of the configs' mean dev gains:", ""]
    pairs = [(a, b) for i, a in enumerate(starts) for b in starts[i + 1:]]
    lines += markdown_table(["starts", "rho", "configs"],
                            [[f"{a.name} / {b.name}", *((f"{r[0]:+.2f}", str(r[1])) if (r := rank_correlation(a, b))
                                                        else ("-", "-"))] for a, b in pairs])
    lines += ["", "Each start's best (on dev) against every other start's best, trained from that start (validation "
              "gain, paired by seed):", ""]
    lines += markdown_table(["from", "its best", "the other start's best", "its best minus that", "every seed",
                             "seed spread", "loses by more than the spread"],
                            [[m.at, m.best, f"{m.theirs} ({m.other})", points(m.difference, True),
                              _signed(m.by_seed), points(m.spread), "yes" if m.loses else "no"]
                             for m in moves([s for s in starts if s.best is not None])])
    if (far := most_different(starts)) is not None:
        lines += ["", f"The ranking differs most from the others at the {far} start."]
    return "\n".join(lines) + "\n"


def write_report(starts: list[Start], out: Path, remake: list[str]) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = {"report": out / "report.md", "gains": out / "gains.csv"}
    written["report"].write_text(report_markdown(starts, remake))
    rows = [[s.name, c, split, seed, f"{v:.6g}"] for s in starts for split, gains in
            ((Split.DEV, s.dev), (Split.VALIDATION, s.validation)) for c in sorted(gains)
            for seed, v in sorted(gains[c].items())]
    write_csv(written["gains"], ["start", "config", "split", "seed", "valid_gain"], rows)
    return written


# ---------------------------------------------------------------- the study the gate calls for

STUDY_NAME = "adapt"
STUDY_ARMS = ("static", "climb", "levels", "learnability")  # static: the chosen start's best on dev, the baseline
STUDY_SEEDS = 10
STUDY_STAGES = 3  # each of the gate's length: INSTANCES boards, STEPS GRPO steps
STUDY_FILE = "static.json"


@dataclass(frozen=True)
class StudyChoice:
    """What the gate's result fixes for the study it calls for: the start it runs from, the config the `static` arm
    holds (that start's best on its dev boards; every arm's stage 1 starts from it), why, and the seed spread there
    (what sizes the power)."""

    start: str
    config: str
    why: str
    spread: float | None

    def detectable(self, seeds: int = STUDY_SEEDS, comparisons: int = len(STUDY_ARMS) - 1) -> tuple[float, float]:
        """The true differences `seeds` paired seeds detect with 80% power at this spread (two arms' differences
        spread by sqrt(2) x it): at 0.05, and at Holm's first step, 0.05 / `comparisons`."""
        sd = math.sqrt(2) * (self.spread or 0.0)
        return detectable(sd, seeds), detectable(sd, seeds, alpha=ALPHA / comparisons)


def study_choice(starts: list[Start]) -> StudyChoice:
    """The rule fixed before the gate's verdict (docs/results/README.md, "The study the gate calls for"). Where the
    best config moves: the earliest start, in the order training passes them (`STARTS`), of a pair whose bests
    differ by more than the seed spread, so the policy trained from it passes the regimes where they differ. Where it
    moves nowhere: the start whose ranking differs most from the others' (`most_different`). Refused until every
    start's runs are done."""
    unfinished = [s.name for s in starts if s.done < s.runs] + [n for n in STARTS if n not in {s.name for s in starts}]
    if unfinished:
        raise GateError(f"the gate is not done: start{'s' if len(unfinished) > 1 else ''} "
                        f"{', '.join(unfinished)} still running or not made")
    named = {s.name: s for s in starts}
    lost = [m for m in moves([s for s in starts if s.best is not None]) if m.loses]
    if lost:
        involved = {m.at for m in lost} | {m.other for m in lost}
        start = next(n for n in STARTS if n in involved)
        why = ("the best config moves (" + "; ".join(f"from {m.at}, {m.other}'s best {m.theirs} loses "
                                                     f"{points(m.difference)} points to {m.best}" for m in lost)
               + f"): {start} is the earliest start of such a pair")
    else:
        start = most_different(starts)
        if start is None:
            raise GateError("no two starts rank 3 or more configs in common: the gate cannot choose a start")
        why = f"the best config moves nowhere: {start} is the start whose ranking differs most from the others'"
    chosen = named[start]
    return StudyChoice(start, chosen.best, why, chosen.seed_spread())


def study_commands(choice: StudyChoice, *, configs: Path, starts: Path, out: Path, db: str, workers: int = 2,
                   name: str = STUDY_NAME) -> list[str]:
    """`out/static.json` (the chosen config) and the commands that make, run and report the study: `STUDY_ARMS`,
    `STUDY_SEEDS` seeds, `STUDY_STAGES` stages of the gate's length, from the chosen start, on the gate's settings,
    the valid rate first, the probing arm's compute matched with extra GRPO steps for the others, every run's last
    stage also scored on the benchmark."""
    out.mkdir(parents=True, exist_ok=True)
    held = out / STUDY_FILE
    held.write_text((configs / f"{choice.config}.json").read_text())
    policy = "tiny" if choice.start == "tiny" else str(starts / choice.start)
    arms = ",".join(f"static=static:{held}" if a == "static" else a for a in STUDY_ARMS)
    q, d = shlex.quote, shlex.quote(db)
    new = ["envlab experiment new", f"--name {name}", f"--arms {q(arms)}", f"--seeds {STUDY_SEEDS}",
           f"--stages {STUDY_STAGES}", f"--instances {INSTANCES}", f"--dev-per-size {DEV_PER_SIZE}",
           f"--policy {q(policy)}", f"--scenario {SCENARIO}", f"--config {q(str(held))}", "--agent-counts 2,3,4,5",
           "--validation-agents 3,4,5", "--primary valid", "--match-compute extra", f"--db {d}"]
    return [" ".join(new), f"envlab experiment run {name} --workers {workers} --threads 1 --benchmark --db {d}",
            f"envlab experiment report {name} --db {d} --out {q(str(out / 'report'))}"]


def stage_minutes(engine) -> float | None:
    """The median wall minutes of the gate's trained stage jobs, over its three starts (what the study's hours are
    estimated from)."""
    ids = []
    for name in STARTS:
        try:
            ids += [r.id for r in experiment_runs(engine, find_experiment(engine, f"gate-{name}").id)]
        except ExperimentError:
            continue
    return median_stage_minutes(engine, ids)
