"""The headroom screen (lab/study/headroom.py): its 12 configs exactly, each legal and fit for the screen's runs; its
report's numbers exact on two experiments whose stage metrics are scripted, the headroom sentence on either side of
3 points; and the whole screen at the tiny test budget through the real commands and worker processes."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from scipy import stats
from sqlmodel import select

from envsim.config import EnvConfig, project
from envsim.generator import GenerationError, cell_counts, ice_cells, room
from lab.cli import main as envlab
from lab.engineers import check_held, random_config, read_held
from lab.study import headroom as hr
from lab.study.comparison import Rate, comparison, detectable, t_power, welch_interval
from lab.study.experiments import create_experiment, experiment_runs, find_experiment, load_scenario
from storage.db import make_engine, session
from storage.models import Job, Stage, StageMetric
from storage.settings import Held, RunSettings
from tests.engineers.scripts import evidence

ROOT = Path(__file__).resolve().parents[2]
SIZES = (5, 6, 7, 8, 9, 10)
MIXES = {"mixA": {2: 0.4, 3: 0.4, 4: 0.1, 5: 0.1}, "mixB": {2: 0.25, 3: 0.25, 4: 0.25, 5: 0.25},
         "mixC": {2: 0.1, 3: 0.1, 4: 0.4, 5: 0.4}}


def test_make_configs_writes_the_twelve_configs_and_the_initial_one(tmp_path: Path, capsys):
    assert envlab(["headroom", "make-configs", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    names = {f"{mix}-holes{holes}-waits{waits}" for mix in MIXES for holes in ("0.1", "0.4")
             for waits in ("0.25", "0.75")}
    assert {p.stem for p in tmp_path.glob("*.json")} == names | {"initial"} and len(names) == 12
    initial = project(json.loads((tmp_path / "initial.json").read_text()), strict=True).config
    assert initial == EnvConfig(data_ratio=dict.fromkeys(SIZES, 1 / 6), hole_ratio=dict.fromkeys(SIZES, 0.2),
                                wait_ratio=dict.fromkeys(SIZES, 0.25), agent_ratio={2: 1.0}, num_instances=512)
    for name in names:
        raw = json.loads((tmp_path / f"{name}.json").read_text())
        config = project(raw, strict=True).config
        mix, holes, waits = name.split("-")
        assert config == EnvConfig(data_ratio=dict.fromkeys(SIZES, 1 / 6),
                                   hole_ratio=dict.fromkeys(SIZES, float(holes.removeprefix("holes"))),
                                   wait_ratio=dict.fromkeys(SIZES, float(waits.removeprefix("waits"))),
                                   agent_ratio=MIXES[mix], num_instances=512)
        held = read_held(tmp_path / f"{name}.json", Held.STATIC)  # what `static:FILE` reads
        assert held.configs == (config,) and check_held(held, initial, hr.AGENT_COUNTS) is None
    lines = out.splitlines()
    assert lines[0] == f"12 configs and initial.json in {tmp_path}"
    assert lines[2].startswith("envlab experiment new --name headroom --arms mixA-holes0.1-waits0.25=static:")
    assert lines[2].count("=static:") == 12 and lines[2].endswith(
        f"--seeds 2 --stages 1 --scenario default --config {tmp_path}/initial.json --agent-counts 2,3,4,5 "
        "--validation-agents 3,4,5 --dev-per-size 3 --db headroom.db")
    assert lines[3] == (f"envlab experiment new --name headroom-random --arms random --seeds 6 --stages 1 --scenario "
                        f"default --config {tmp_path}/initial.json --agent-counts 2,3,4,5 --validation-agents 3,4,5 "
                        "--dev-per-size 3 --db headroom.db")


def test_the_sizes_are_those_that_hold_five_agents():
    hard = hr.load_scenario("hard-start").config
    assert hr.screen_sizes(hard) == SIZES
    assert hr.initial_config(hard).hole_ratio == dict.fromkeys(SIZES, 0.4)  # the scenario's knobs on those sizes
    with pytest.raises(hr.HeadroomError, match=r"sizes \[3, 4\] hold no board of 5 agents"):
        hr.screen_sizes(EnvConfig.default(sizes=(3, 4)))


def room_left(config: EnvConfig) -> str | None:
    """The generator's first refusal, without drawing a board: a (size, count) cell with boards whose holes leave
    too few ice cells for its agents' starts and goals (`envsim.generator.room`), or a count no size holds."""
    try:
        cells = cell_counts(config, config.num_instances)
    except GenerationError as err:
        return str(err)
    for size, per_count in cells.items():
        for k, n in per_count.items():
            if n and room(config, size) < k:
                return f"size {size}: {ice_cells(config, size)} ice cells for {k} agents"
    return None


def test_random_draws_configs_that_hold_their_agents_on_the_default_sizes_as_on_the_screen_s():
    """On the default sizes 3..10, `random` over agent counts 2..5 once spent all its draws on configs with boards too
    small for their agents for 14 of 20 seeds (the screen's reason for sizes 5..10); since the generator deals each
    count only to the sizes that hold it (`envsim.generator.placement`), no draw of either is refused for it."""
    default = load_scenario("default").config
    failed = {}
    for name, config in (("default", default), ("screen", hr.initial_config(default))):
        ask = replace(evidence(config=config), agent_counts=hr.AGENT_COUNTS)
        failed[name] = [seed for seed in range(20)
                        if random_config(ask, seed=seed, cannot_fill=room_left).projection is None]
    assert failed == {"default": [], "screen": []}


# ---------------------------------------------------------------- the report on scripted metrics

# valid boards of 100 per run: stage 0 (the same checkpoint for all), then stage 1 per arm and seed
STAGE0 = 50
RANDOM = [55, 57, 59, 56, 58, 57]  # gains +5, +7, +9, +6, +8, +7: mean +7
DRAWN = EnvConfig(data_ratio=dict.fromkeys(SIZES, 1 / 6), hole_ratio={5: 0.05, 6: 0.5, 7: 0.1, 8: 0.2, 9: 0.3, 10: 0.4},
                  wait_ratio=dict.fromkeys(SIZES, 0.6), agent_ratio={2: 0.5, 5: 0.5}, num_instances=512)


def scripted_screen(engine, folder: Path, best: list[int], other: list[int], instances: int = 512) -> None:
    """Experiments `screen` (two held configs, 2 seeds) and `screen-random` (6 seeds), every run's validation
    metrics stored as given: one (size, count) cell of 100 boards, valid as listed, optimal half of that (rounded
    down); the random draws' stage 1 trained on DRAWN (seed 3's on the initial config: a failed draw)."""
    hr.write_configs(folder)
    initial = EnvConfig.model_validate_json((folder / "initial.json").read_text())
    settings = RunSettings(stages=1, agent_counts=hr.AGENT_COUNTS, validation_agents=hr.VALIDATION_AGENTS)
    arms = [f"{n}=static:{folder / n}.json" for n in ("mixA-holes0.1-waits0.25", "mixC-holes0.4-waits0.75")]
    create_experiment(engine, name="screen", arms=arms, seeds=2, settings=settings, config=initial)
    create_experiment(engine, name="screen-random", arms=["random"], seeds=6, settings=settings,
                      config=initial.model_copy(update={"num_instances": instances}))
    valid = {("mixA-holes0.1-waits0.25", k): v for k, v in enumerate(other)}
    valid |= {("mixC-holes0.4-waits0.75", k): v for k, v in enumerate(best)}
    valid |= {("random", k): v for k, v in enumerate(RANDOM)}
    with session(engine) as s:
        for name in ("screen", "screen-random"):
            for run in experiment_runs(engine, find_experiment(engine, name).id):
                for k, v in ((0, STAGE0), (1, valid[(run.arm, run.seed)])):
                    s.add(StageMetric(run_id=run.id, stage_index=k, split="validation", size=5, agents=3,
                                      episodes=100, valid=v, optimal=v // 2, failures={}))
                if run.arm == "random":
                    s.add(Stage(run_id=run.id, index=1, config=initial if run.seed == 3 else DRAWN, status="done"))
        s.commit()


@pytest.mark.parametrize(("best", "verdict"), [([60, 64], "Headroom +5.00 points: at least 3 points."),
                                               ([58, 60], "Headroom +2.00 points: under 3 points.")])
def test_the_report_s_numbers_are_exact(empty_lab, tmp_path: Path, best: list[int], verdict: str):
    scripted_screen(empty_lab, tmp_path / "configs", best, other=[52, 51])
    h = hr.headroom(empty_lab, "screen")
    gains = [b - STAGE0 for b in best]
    assert [g.arm for g in h.configs] == ["mixC-holes0.4-waits0.75", "mixA-holes0.1-waits0.25"]  # best first
    assert h.best.valid.values == pytest.approx([g / 100 for g in gains])
    assert h.best.valid.mean == pytest.approx(sum(gains) / 200)
    half = stats.t.ppf(0.975, 1) * stats.tstd(gains) / 2 ** 0.5 / 100  # 2 seeds: 1 degree of freedom
    assert (h.best.valid.low, h.best.valid.high) == pytest.approx((h.best.valid.mean - half, h.best.valid.mean + half))
    assert h.best.optimal.values == pytest.approx([(b // 2 - STAGE0 // 2) / 100 for b in best])
    assert h.configs[1].valid.values == pytest.approx([0.02, 0.01])
    assert h.draws.valid.values == pytest.approx([(v - STAGE0) / 100 for v in RANDOM]) and h.draws.valid.mean == \
        pytest.approx(0.07)
    assert h.headroom == pytest.approx(sum(gains) / 200 - 0.07)
    welch = stats.ttest_ind(gains, [v - STAGE0 for v in RANDOM], equal_var=False)
    ci = welch.confidence_interval(0.95)
    assert h.welch == pytest.approx((ci.low / 100, ci.high / 100, welch.df))
    assert hr.verdict(h) == verdict
    assert h.drawn == {k: (h.draws_experiment.experiment.settings.config if k == 3 else DRAWN) for k in range(6)}

    report = hr.report_markdown(h, ["envlab experiment run screen"])
    assert report.startswith("# Headroom screen\n\nRemade by:\n\n```bash\nenvlab experiment run screen\n```\n")
    assert f"**{verdict}** The best config, mixC-holes0.4-waits0.75, gained {sum(gains) / 2:+.2f} points" in report
    assert (f"Best minus random: 95% Welch interval [{ci.low:+.2f}, {ci.high:+.2f}], {welch.df:.1f} degrees of "
            "freedom") in report
    mean, low, high = h.best.valid.mean * 100, h.best.valid.low * 100, h.best.valid.high * 100
    assert (f"| mixC-holes0.4-waits0.75 | 2=0.1, 3=0.1, 4=0.4, 5=0.4 | 0.4 | 0.75 | 2 | {mean:+.2f} [{low:+.2f}, "
            f"{high:+.2f}] | {gains[0]:+.2f}, {gains[1]:+.2f} |") in report
    assert "| random | drawn per seed (below) |  |  | 6 | +7.00 [" in report
    assert "| 0 | +5.00 | 2=0.5, 5=0.5 | 0.05-0.5 | 0.6 |  |" in report
    assert "| 3 | +6.00 | 2=1 | 0.2 | 0.25 | the engineer drew no config: trained on the initial one |" in report
    assert "valid rate 50.0%" in report and "2,520 validation boards of 3-5 agents" in report
    assert ("## Under 3 points" in report) == ("under" in verdict)
    pooled = ((stats.tstd(gains) ** 2 + stats.tstd([2, 1]) ** 2) / 2) ** 0.5 / 100  # 1 degree of freedom each
    assert h.seed_sd == pytest.approx(pooled)
    n = hr.seeds_for(pooled)
    assert (f"One config's gain spreads by {pooled * 100:.2f} points over its seeds (pooled over the configs). A "
            f"difference of two arms then spreads by about {pooled * 100 * 2 ** 0.5:.2f} points, and {n} seeds "
            "detect a true difference of 2.00 points with 80% power") in report

    written = hr.write_report(h, tmp_path / "out")
    with open(written["gains"]) as f:
        rows = list(csv.DictReader(f))
    assert [r["arm"] for r in rows] == ["mixC-holes0.4-waits0.75", "mixA-holes0.1-waits0.25", "random",
                                        "mixC-holes0.4-waits0.75 - random"]
    assert float(rows[0]["valid_gain_mean"]) == pytest.approx(h.best.valid.mean)
    assert rows[0]["valid_gain_per_seed"] == " ".join(f"{g / 100:.6g}" for g in gains)
    assert (rows[2]["kind"], rows[2]["seeds"]) == ("random", "6")
    assert float(rows[2]["valid_gain_mean"]) == pytest.approx(0.07)
    assert (float(rows[3]["valid_gain_mean"]), float(rows[3]["valid_gain_low"])) == pytest.approx(
        (h.headroom, ci.low / 100))


def test_the_more_steps_probe_sets_the_two_configs_gains_and_their_difference_beside_the_screen_s(
        empty_lab, tmp_path: Path, capsys):
    """`report` reads EXPERIMENT-steps (`scripts/headroom-steps.sh`): the screen's worst and best configs at 4 times
    the boards; each one's gain at both step counts and the better minus the worse, paired by seed."""
    configs = tmp_path / "configs"
    scripted_screen(empty_lab, configs, [60, 64], other=[52, 51])
    initial = EnvConfig.model_validate_json((configs / "initial.json").read_text())
    settings = RunSettings(stages=1, agent_counts=hr.AGENT_COUNTS, validation_agents=hr.VALIDATION_AGENTS)
    worst, best = "mixA-holes0.1-waits0.25", "mixC-holes0.4-waits0.75"
    create_experiment(empty_lab, name="screen-steps", arms=[f"{n}=static:{configs / n}.json" for n in (worst, best)],
                      seeds=2, settings=settings, config=initial.model_copy(update={"num_instances": 2048}))
    valid = {(worst, 0): 53, (worst, 1): 55, (best, 0): 58, (best, 1): 59}
    with session(empty_lab) as s:
        for run in experiment_runs(empty_lab, find_experiment(empty_lab, "screen-steps").id):
            for k, v in ((0, STAGE0), (1, valid[(run.arm, run.seed)])):
                s.add(StageMetric(run_id=run.id, stage_index=k, split="validation", size=5, agents=3,
                                  episodes=100, valid=v, optimal=v // 2, failures={}))
        s.commit()
    h = hr.headroom(empty_lab, "screen")
    steps = hr.steps_probe(empty_lab, h, "screen-steps")
    assert (steps.worse, steps.better) == (worst, best)
    assert steps.gains[best].values == pytest.approx([0.08, 0.09]) and steps.gains[worst].values == pytest.approx(
        [0.03, 0.05])
    assert steps.spread.values == pytest.approx([0.05, 0.04]) and steps.screen_spread.values == pytest.approx(
        [0.08, 0.13])
    assert hr.steps_probe(empty_lab, h, "nothing") is None
    db = str(tmp_path / "lab.db")
    assert envlab(["headroom", "report", "screen", "--db", db, "--out", str(tmp_path / "out"), "--configs",
                   str(configs)]) == 0
    report = (tmp_path / "out" / "report.md").read_text()
    half = stats.t.ppf(0.975, 1) * stats.tstd([5, 4]) / 2 ** 0.5
    assert ("on 2048 boards (512 GRPO steps, against the screen's 128): experiment `screen-steps` (2 arms x 2 "
            "seeds, 0 of 4 runs done)") in report
    assert ("| config | valid gain at 128 steps (points) | every seed | valid gain at 512 steps (points) | every "
            "seed |") in report
    assert f"| {best} | +12.00 [" in report and "] | +10.00, +14.00 | +8.50 [" in report
    assert (f"| {best} - {worst}, paired by seed | +10.50 [") in report
    assert f"| +4.50 [{4.5 - half:+.2f}, {4.5 + half:+.2f}] | +5.00, +4.00 |" in report
    half = stats.t.ppf(0.975, 1) * stats.tstd([-3, -9]) / 2 ** 0.5  # 5 - 8 and 4 - 13, paired by seed
    assert ("Paired by seed, the better minus the worse changed by -6.00 points from 128 steps to 512 steps (seeds "
            f"-3.00, -9.00; at 512 steps, 0.6, 0.3 times as large); its 95% t interval is [{-6 - half:+.2f}, "
            f"{-6 + half:+.2f}] (1 degree of freedom): it includes zero: with 2 seeds the change is a direction, not "
            "a finding.\n") in report
    create_experiment(empty_lab, name="screen-odd", arms=["random", "fixed"], seeds=1, settings=settings,
                      config=initial)
    with pytest.raises(hr.HeadroomError, match="experiment 'screen-odd' is not a more-steps probe of the screen: it "
                                               "has arms random, fixed and 1 stages"):
        hr.steps_probe(empty_lab, h, "screen-odd")


def test_the_study_s_seeds_detect_2_points_with_80_percent_power_and_are_at_least_8():
    """A paired difference of two arms spreads by sqrt(2) x one arm's seed spread; the fewest seeds (at least 8) at
    which the paired t test finds 2 points 80% of the time."""
    assert [hr.seeds_for(sd) for sd in (0.005, 0.01, 0.02, 0.03)] == [8, 8, 18, 38]
    for sd in (0.02, 0.03):
        n = hr.seeds_for(sd)
        assert detectable(2 ** 0.5 * sd, n) <= 0.02 < detectable(2 ** 0.5 * sd, n - 1)
        assert t_power(0.02, 2 ** 0.5 * sd, n) >= 0.8 > t_power(0.02, 2 ** 0.5 * sd, n - 1)


def test_welch_s_interval_needs_two_values_a_side():
    assert welch_interval([0.1], [0.2, 0.3]) is None and welch_interval([0.1, 0.2], [0.3]) is None
    assert welch_interval([0.5, 0.5], [0.25, 0.25, 0.25]) == (0.25, 0.25, 3.0)  # no spread: a point
    low, high, df = welch_interval([1.0, 3.0], [0.0, 1.0, 2.0])
    se = (2 / 2 + 1 / 3) ** 0.5  # each side's variance over its count
    assert df == pytest.approx((2 / 2 + 1 / 3) ** 2 / ((2 / 2) ** 2 / 1 + (1 / 3) ** 2 / 2))
    assert (low, high) == pytest.approx((1 - stats.t.ppf(0.975, df) * se, 1 + stats.t.ppf(0.975, df) * se))


def test_the_report_command_writes_both_files_and_the_commands_that_remake_it(empty_lab, tmp_path: Path, capsys):
    scripted_screen(empty_lab, tmp_path / "configs", [60, 64], other=[52, 51])
    db = str(tmp_path / "lab.db")
    assert envlab(["headroom", "report", "screen", "--db", db, "--out", str(tmp_path / "out"), "--configs",
                   str(tmp_path / "configs")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "Headroom +5.00 points: at least 3 points."
    report = (tmp_path / "out" / "report.md").read_text()
    assert f"envlab headroom make-configs --out {tmp_path}/configs --from-scenario default\n" in report
    assert "envlab experiment new --name screen-random --arms random --seeds 6 --stages 1" in report
    assert f"envlab headroom report screen --db {db}" in report
    assert (tmp_path / "out" / "gains.csv").is_file()


def test_the_study_plan_holds_the_best_config_schedules_its_mixes_and_makes_an_experiment(empty_lab, tmp_path: Path,
                                                                                         capsys):
    """`study-plan`: the best config as `static.json`, the schedule of agent mixes on its holes and waits as
    `schedule.json`, the seeds for 80% power at 2 points from the screen's seed spread; its first command, run as
    printed, makes the study: 6 arms, those seeds, 4 stages, compute matched, on the screen's initial config."""
    configs = tmp_path / "configs"
    scripted_screen(empty_lab, configs, [60, 64], other=[52, 51])
    db, out = str(tmp_path / "lab.db"), tmp_path / "study"
    assert envlab(["headroom", "study-plan", "screen", "--db", db, "--out", str(out), "--configs", str(configs),
                   "--name", "study"]) == 0
    lines = capsys.readouterr().out.splitlines()
    h = hr.headroom(empty_lab, "screen")
    seeds = hr.seeds_for(h.seed_sd)
    assert seeds == 19  # a spread of 2.06 points: 2.92 for a difference of two arms
    assert lines[0] == (f"best config mixC-holes0.4-waits0.75 (+12.00 points); a seed spread of "
                        f"{h.seed_sd * 100:.2f} points: 19 seeds for 80% power at 2.00 points")
    best = EnvConfig.model_validate_json((configs / "mixC-holes0.4-waits0.75.json").read_text())
    assert EnvConfig.model_validate_json((out / "static.json").read_text()) == best
    schedule = [EnvConfig.model_validate(c) for c in json.loads((out / "schedule.json").read_text())]
    assert [c.agent_ratio for c in schedule] == [{2: 0.5, 3: 0.5}, {3: 0.5, 4: 0.5}, {4: 0.5, 5: 0.5},
                                                 {3: 1 / 3, 4: 1 / 3, 5: 1 / 3}]
    assert all(c.model_dump(exclude={"agent_ratio"}) == best.model_dump(exclude={"agent_ratio"}) for c in schedule)
    assert lines[1] == "6 arms x 19 seeds x 4 stages: 456 trained stages (the screen timed no stage)"
    new = lines[3]
    assert new.startswith("envlab experiment new --name study --arms ") and "--seeds 19 --stages 4" in new
    assert "--match-compute extra" in new
    assert lines[4] == f"envlab experiment run study --workers 2 --threads 1 --db {db}"
    assert envlab(new.split(" ", 1)[1].replace("'", "").split()) == 0
    study = find_experiment(empty_lab, "study")
    assert [a["name"] for a in study.arms] == ["random", "static", "schedule", "evidence", "bandit", "learnability"]
    assert (study.seeds, study.settings.stages, study.settings.validation_agents) == (19, 4, (3, 4, 5))
    assert study.settings.config == EnvConfig.model_validate_json((configs / "initial.json").read_text())
    assert study.settings.run.agent_counts == (2, 3, 4, 5) and study.settings.primary == "valid"
    runs = experiment_runs(empty_lab, study.id)
    held = {r.arm: r.settings.held_configs for r in runs if r.settings.held_configs is not None}
    assert held["static"].configs == (best,) and held["schedule"].configs == tuple(schedule)
    assert len(runs) == 6 * 19


@pytest.mark.parametrize(("stages", "mixes"), [
    (1, [{3: 1 / 3, 4: 1 / 3, 5: 1 / 3}]),
    (2, [{2: 0.5, 3: 0.5}, {3: 1 / 3, 4: 1 / 3, 5: 1 / 3}]),
    (3, [{2: 0.5, 3: 0.5}, {4: 0.5, 5: 0.5}, {3: 1 / 3, 4: 1 / 3, 5: 1 / 3}]),
    (6, list(hr.SCHEDULE_MIXES))])
def test_a_schedule_of_fewer_stages_starts_at_the_fewest_agents_and_ends_at_the_scored_counts(stages, mixes):
    assert list(hr.schedule_mixes(stages)) == mixes


def test_a_smaller_study_holds_the_arms_and_stages_asked_for_and_says_its_hours(empty_lab, tmp_path: Path, capsys):
    """`study-plan --arms --stages`: the arms in the study's order, no `--match-compute` without a probing arm, a
    schedule over 2 stages, and the hours at the screen's median trained stage job (a paused job's long span and
    stage 0's evaluation do not move it)."""
    configs = tmp_path / "configs"
    scripted_screen(empty_lab, configs, [60, 64], other=[52, 51])
    h = hr.headroom(empty_lab, "screen")
    runs = [r for c in (h.experiment, h.draws_experiment) for r in c.runs.values()]
    t = datetime(2026, 11, 1, tzinfo=UTC)
    with session(empty_lab) as s:
        for run, (target, minutes, status) in zip(runs, [(1, 10, "done"), (1, 12, "done"), (1, 95, "done"),
                                                       (0, 30, "done"), (1, 1, "failed"), (1, 14, "done")],
                                                  strict=False):
            s.add(Job(kind="stage", run_id=run.id, target=target, status=status, started_at=t,
                      finished_at=t + timedelta(minutes=minutes)))
        s.commit()
    assert hr.stage_minutes(empty_lab, h) == 13.0  # the median of 10, 12, 14 and 95
    db, out = str(tmp_path / "lab.db"), tmp_path / "study"
    assert envlab(["headroom", "study-plan", "screen", "--db", db, "--out", str(out), "--configs", str(configs),
                   "--name", "small", "--arms", "evidence,random,bandit,static", "--stages", "2",
                   "--instances", "2048"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == ("4 arms x 19 seeds x 2 stages: 152 trained stages; at the screen's median stage job of "
                        "13.0 min on 2 workers, about 16.5 hours (timed at the screen's boards per stage: 2048 take "
                        "longer if they are more)")
    new = lines[3]
    assert f"--arms random,static=static:{out}/static.json,evidence,bandit --seeds 19 --stages 2" in new
    assert new.count("--instances") == 1 and "--instances 2048 --db" in new
    assert "--match-compute" not in new
    schedule = [EnvConfig.model_validate(c) for c in json.loads((out / "schedule.json").read_text())]
    assert [c.agent_ratio for c in schedule] == [{2: 0.5, 3: 0.5}, {3: 1 / 3, 4: 1 / 3, 5: 1 / 3}]
    assert envlab(new.split(" ", 1)[1].replace("'", "").split()) == 0
    study = find_experiment(empty_lab, "small")
    assert [a["name"] for a in study.arms] == ["random", "static", "evidence", "bandit"]
    assert (study.seeds, study.settings.stages, study.settings.matched, study.settings.instances) == (19, 2, None, 2048)


@pytest.mark.parametrize(("argv", "message"), [
    (["--arms", "random,oracle"], "unknown arm 'oracle': the study's arms are random, static, schedule, evidence, "
                                  "bandit, learnability"),
    (["--arms", "random"], "a study compares at least 2 arms"),
    (["--arms", "random,static,random"], "an arm is named twice"),
    (["--stages", "0"], "the stages, the workers and the boards per stage are at least 1"),
    (["--instances", "0"], "the stages, the workers and the boards per stage are at least 1")])
def test_a_study_design_that_cannot_be_is_refused_with_its_reason(empty_lab, tmp_path: Path, argv, message,
                                                                   capsys):
    scripted_screen(empty_lab, tmp_path / "configs", [60, 64], other=[52, 51])
    assert envlab(["headroom", "study-plan", "screen", "--db", str(tmp_path / "lab.db"), "--out",
                   str(tmp_path / "study"), *argv]) == 2
    assert capsys.readouterr().err == f"envlab headroom: study-plan: {message}\n"
    assert not (tmp_path / "study").exists()


def test_two_experiments_that_differ_in_compute_are_not_one_screen(empty_lab, tmp_path: Path):
    scripted_screen(empty_lab, tmp_path / "configs", [60, 64], other=[52, 51], instances=256)
    with pytest.raises(hr.HeadroomError, match=r"experiments 'screen' and 'screen-random' differ in instances "
                                               r"\(512 against 256\)"):
        hr.headroom(empty_lab, "screen")
    with pytest.raises(hr.HeadroomError, match="no experiment 'other'"):
        hr.headroom(empty_lab, "screen", draws="other")


# ---------------------------------------------------------------- the screen through the real commands


def test_the_screen_runs_end_to_end_at_the_tiny_budget(tmp_path: Path, capsys):
    """`make-configs`, both experiments made with `envlab experiment new` (2 of the configs, 1 seed; random, 2
    seeds), run by `envlab experiment run` with its worker process (the tiny policy, 8 boards and 1 GRPO step a
    stage, 4 validation boards of 3 agents: the 3- to 5-agent set would build 630 boards first), and `report`:
    every gain is the stored stage 1 minus stage 0."""
    configs, db = tmp_path / "configs", str(tmp_path / "lab.db")
    assert envlab(["headroom", "make-configs", "--out", str(configs)]) == 0
    tiny = ["--stages", "1", "--config", str(configs / "initial.json"), "--agent-counts", "2,3,4,5",
            "--validation-agents", "3", "--validation-per-size", "30", "--validation-boards", "4", "--dev-per-size",
            "3", "--instances", "8", "--grpo", "num_generations=2", "--grpo", "per_device_train_batch_size=16",
            "--db", db]
    arms = ",".join(f"{n}=static:{configs / n}.json" for n in ("mixA-holes0.1-waits0.25", "mixC-holes0.4-waits0.75"))
    assert envlab(["experiment", "new", "--name", "hr", "--arms", arms, "--seeds", "1", *tiny]) == 0
    assert envlab(["experiment", "new", "--name", "hr-random", "--arms", "random", "--seeds", "2", *tiny]) == 0
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    for name in ("hr", "hr-random"):
        done = subprocess.run([sys.executable, "-m", "lab.cli", "experiment", "run", name, "--threads", "1", "--db",
                               db], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=1200)
        assert done.returncode == 0, done.stdout + done.stderr
    capsys.readouterr()
    assert envlab(["headroom", "report", "hr", "--db", db, "--out", str(tmp_path / "out"), "--configs",
                   str(configs)]) == 0
    assert capsys.readouterr().out.startswith("Headroom ")
    engine = make_engine(db)
    h = hr.headroom(engine, "hr")
    for c in (h.experiment, h.draws_experiment):
        assert {r.status for r in c.runs.values()} == {"done"}
    with session(engine) as s:
        metrics = s.exec(select(StageMetric).where(StageMetric.split == "validation")).all()
        stage1 = {st.run_id: st for st in s.exec(select(Stage).where(Stage.index == 1))}

    def rate(run_id: int, k: int) -> float:
        mine = [m for m in metrics if (m.run_id, m.stage_index) == (run_id, k)]
        return sum(m.valid for m in mine) / sum(m.episodes for m in mine)

    stage0 = {rate(run.id, 0) for c in (h.experiment, h.draws_experiment) for run in c.runs.values()}
    assert len(stage0) == 1  # one checkpoint, one evaluation, for both experiments
    for g, c in [*((g, h.experiment) for g in h.configs), (h.draws, h.draws_experiment)]:
        runs = {seed: run for (arm, seed), run in c.runs.items() if arm == g.arm}
        assert g.valid.values == tuple(rate(runs[k].id, 1) - rate(runs[k].id, 0) for k in sorted(runs))
    for g in h.configs:  # each held config trained stage 1, the experiment's boards per stage put back into it
        (run,) = [r for (arm, _), r in h.experiment.runs.items() if arm == g.arm]
        assert stage1[run.id].config == g.config.model_copy(update={"num_instances": 8})
    for seed, config in h.drawn.items():  # random drew over the initial config's sizes and the runs' agent counts
        assert config.sizes == SIZES and set(config.agent_counts) <= set(hr.AGENT_COUNTS), seed
    report = (tmp_path / "out" / "report.md").read_text()
    assert "--validation-agents 3 --dev-per-size 3 --instances 8 --validation-per-size 30 --validation-boards 4 " \
           "--grpo num_generations=2 --grpo per_device_train_batch_size=16 --db" in report
    assert "no interval: a side has fewer than 2 seeds" in report
    assert comparison(engine, "hr").estimate(h.best.arm, Rate.VALID, 1) is not None
    engine.dispose()
