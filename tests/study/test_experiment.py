"""Experiments: arms x seeds at equal compute, their report computed by hand from the stored rows, context presets,
scenarios, the larger validation set, and the policy that cannot be its own engineer.

The report is checked on runs whose `stage` job replays scripted answers (real boards, real scores, the real
engineers, the real loop), so every rate is known; the experiment through the REAL worker processes and the
real GRPO stage with the tiny policy, killed and resumed, is in tests/study/test_experiment_e2e.py.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest
from sqlmodel import select

from envsim.config import EnvConfig, project
from envsim.generator import generate
from envsim.suite import FIRST_AGENTS, WAIT_SUBSETS, build, round_half_up
from lab import cli
from lab.context import CONTEXT_PRESETS
from lab.engineers import ENGINEERS, EngineerAnswer
from lab.jobs.worker import WorkerOptions, run_worker
from lab.loop import LoopError, check_engineer, create_run
from lab.pages import runs as runs_page
from lab.study.comparison import (
    AUC,
    POOLED,
    Rate,
    comparison,
    curves_figure,
    detectable,
    difference_cell,
    estimate,
    report_markdown,
    seeds_text,
    t_interval,
    t_power,
    write_report,
)
from lab.study.experiments import (
    Arm,
    ExperimentError,
    _benchmarks_pending,
    add_arms,
    adopt_runs,
    benchmark_choices,
    create_experiment,
    experiment_progress,
    experiment_runs,
    find_experiment,
    load_scenario,
    match_compute,
    queue_benchmarks,
    run_experiment,
    time_left,
)
from storage.db import make_engine, session, upgrade
from storage.models import Episode, Experiment, Job, Proposal, Run, Stage, StageMetric
from storage.payloads import BenchmarkPayload, StagePayload
from storage.settings import RunSettings, SettingsError
from tests.recorded import CONFIG, run_all, scripted_experiment
from training.evaluate import boards_cache, dev_entries, envsim_fingerprint, validation_entries
from training.stage import planned_rollouts, planned_steps

# ---------------------------------------------------------------- presets, arms, scenarios


def test_a_run_keeps_its_preset_and_refuses_an_unknown_one(empty_lab):
    with session(empty_lab) as s:
        run = create_run(s, name="r", config=CONFIG, settings=RunSettings(stages=1, context_preset="no-history"),
                         engineer="llm", engineer_backend="openai:m")
        assert run.settings.context_preset == "no-history"
        assert run.settings.context == asdict(CONTEXT_PRESETS["no-history"])
        with pytest.raises(LoopError, match="unknown context preset 'tiny': one of paper-best, failures-only"):
            create_run(s, name="r", config=CONFIG, settings=RunSettings(stages=1, context_preset="tiny"))


@pytest.mark.parametrize(("text", "arm"), [
    ("fixed", Arm("fixed", "fixed")),
    ("llm:openai:qwen3-4b@no-history", Arm("llm:openai:qwen3-4b@no-history", "llm", "openai:qwen3-4b", "no-history")),
    ("llm:hf:gemma3-270m", Arm("llm:hf:gemma3-270m", "llm", "hf:gemma3-270m", "paper-best")),
    ("best=llm:openai:http://x@paper-best", Arm("best", "llm", "openai:http://x", "paper-best")),
])
def test_an_arm_is_an_engineer_a_backend_and_a_preset(text, arm):
    assert Arm.parse(text) == arm


@pytest.mark.parametrize(("text", "error"), [
    ("oracle", "unknown engineer 'oracle'"),
    ("fixed@full", "unknown engineer 'fixed@full'"),
    ("heuristic:x", "only an llm arm takes a backend"),
    ("llm", "an llm arm names its backend"),
    ("llm:openai:m@everything", "unknown context preset 'everything'"),
])
def test_a_bad_arm_is_refused_by_name(text, error):
    with pytest.raises(ExperimentError, match=error):
        Arm.parse(text)


def test_hard_start_puts_the_data_where_the_policy_fails():
    hard, default = load_scenario("hard-start"), load_scenario("default")
    assert default.config == EnvConfig.default() and default.grpo == {}
    assert hard.config.data_ratio[10] == 0.86 and set(hard.config.hole_ratio.values()) == {0.4}
    assert {s: v for s, v in hard.config.data_ratio.items() if s != 10} == {s: 0.02 for s in range(3, 10)}
    assert (hard.config.wait_ratio, hard.config.num_instances) == (default.config.wait_ratio, 512)
    boards = generate(hard.config, 64, seed=0)
    assert sum(b.size == 10 for b in boards) == 55 and all(len(b.holes) == round_half_up(0.4 * b.size ** 2)
                                                           for b in boards)
    with pytest.raises(ExperimentError, match="unknown scenario 'easy': one of default, hard-start"):
        load_scenario("easy")


# ---------------------------------------------------------------- the policy as its own engineer


def test_a_compact_policy_cannot_be_its_own_engineer(empty_lab, tmp_path, capsys):
    refused = "policy 'tiny' reads compact prompts: its vocabulary is board cells and actions"
    with pytest.raises(LoopError, match=refused):
        check_engineer("llm", "hf:policy", "tiny")
    copy = tmp_path / "tiny-copy"  # a compact folder without envlab.json: known by its tokenizer
    copy.mkdir()
    for f in (Path(cli.__file__).parent.parent.parent / "assets" / "tiny-policy").iterdir():
        if f.name != "envlab.json":
            (copy / f.name).write_bytes(f.read_bytes())
    with pytest.raises(LoopError, match="reads compact prompts"):
        check_engineer("llm", "hf:policy", str(copy))
    for chat in ("gemma3-270m", "Qwen/Qwen3-4B"):  # chat policies keep the path
        check_engineer("llm", "hf:policy", chat)
    check_engineer("llm", "openai:m", "tiny")  # another model may engineer for the tiny policy
    db = str(tmp_path / "cli.db")
    assert cli.main(["run", "--engineer", "llm", "--backend", "hf:policy", "--db", db]) == 2
    assert refused in capsys.readouterr().err
    assert cli.main(["experiment", "new", "--name", "e", "--arms", "fixed,llm:hf:policy@paper-best", "--db", db]) == 2
    assert "arm 'llm:hf:policy@paper-best': the llm engineer with backend hf:policy" in capsys.readouterr().err
    engine = make_engine(db)
    with session(engine) as s:
        assert s.exec(select(Run)).all() == [] and s.exec(select(Experiment)).all() == []
    message, run_id = runs_page.create_run_from_form(empty_lab, "self", "", "tiny", "llm", "hf:policy", "", 3, 512,
                                                     2, 0, False, [[3, 1.0, 0.2, 0.25]])
    assert run_id is None and message.startswith("✗ Not created: the llm engineer with backend hf:policy")
    engine.dispose()


# ---------------------------------------------------------------- equal compute and the validation set


def test_steps_per_stage_are_counted_as_trl_counts_them():
    assert planned_steps(512, {}, "compact") == 128  # 512 boards x 8 generations / 32 completions a step
    assert planned_steps(512, {}, "chat") == 256  # 4 generations, 8 a step
    assert planned_steps(8, {"num_generations": 4, "per_device_train_batch_size": 32}, "compact") == 1
    # 2 accumulation steps: generation batches of 8 boards (96 of the 100 fill them), each yielded for its 2 steps
    assert planned_steps(100, {"gradient_accumulation_steps": 2}, "compact") == 96 * 8 * 2 // 32 // 2 == 24
    assert planned_steps(512, {"max_steps": 7}, "compact") == 7


def test_steps_rollouts_and_compute_matching_follow_the_processes_a_stage_is_launched_on():
    """Under `accelerate launch --num_processes 2` each step scores twice the completions: half the steps, the same
    rollouts, and compute matched in steps of 64 answers; settings valid only for two processes are taken there."""
    from training.settings import check_grpo

    assert [planned_steps(512, {}, "compact", n) for n in (1, 2)] == [128, 64]
    assert [planned_rollouts(512, {}, "compact", n) for n in (1, 2)] == [4096, 4096]
    assert [planned_steps(512, {}, "chat", n) for n in (1, 2)] == [256, 128]
    # generation batches of 16 boards on two processes (2 x 32 completions x 2 accumulation steps): 96 of 100 fill them
    assert [planned_steps(100, {"gradient_accumulation_steps": 2}, "compact", n) for n in (1, 2)] == [24, 12]
    assert planned_steps(512, {"max_steps": 7}, "compact", 2) == 7
    assert planned_rollouts(512, {"max_steps": 7}, "compact", 2) == 7 * 64
    sixteen = RunSettings(stages=1, grpo={"num_generations": 16, "per_device_train_batch_size": 8})
    with pytest.raises(SettingsError, match=r"generation_batch_size \(8\) must be divisible by num_generations \(16\)"):
        check_grpo(sixteen, 64, "tiny")
    assert check_grpo(sixteen, 64, "tiny", processes=2) == 64  # 64 boards x 16 answers / 16 a step
    assert planned_rollouts(64, sixteen.grpo, "compact", 2) == 1024
    probes = {"fixed": 0, "learnability": 6144}
    on_one, on_two = (match_compute("extra", probes, instances=512, grpo={}, policy="tiny", processes=n,
                                    steps=planned_steps(512, {}, "compact", n),
                                    rollouts=planned_rollouts(512, {}, "compact", n)) for n in (1, 2))
    assert (on_one.steps, on_one.rollouts) == ({"fixed": 192, "learnability": 0}, {"fixed": 6144, "learnability": 0})
    assert (on_two.steps, on_two.rollouts) == ({"fixed": 96, "learnability": 0}, {"fixed": 6144, "learnability": 0})


def test_a_larger_validation_set_holds_the_standard_240_and_is_cached(tmp_path):
    """At 2 agents (`FIRST_AGENTS`), the smallest set."""
    standard = build("validation", agents=FIRST_AGENTS)[0]
    larger = validation_entries(tmp_path, 33, FIRST_AGENTS)  # one more board per (size, wait subset): 264
    assert len(larger) == 264 and (tmp_path / "validation-33.jsonl").is_file()
    for size in range(3, 11):
        for subset in WAIT_SUBSETS:
            cell = [e for e in larger if (e.size, e.subset) == (size, subset)]
            assert [e for e in standard if (e.size, e.subset) == (size, subset)] == cell[:10]
            assert sum(e.instance.needs_wait for e in cell) == round_half_up(subset * 11)
    assert len({e.instance.id for e in larger}) == 264
    assert validation_entries(tmp_path, 33, FIRST_AGENTS) == larger  # read back from the cache
    with pytest.raises(ValueError, match="validation_per_size = 40: a multiple of 3"):
        validation_entries(tmp_path, 40)


def test_the_validation_and_dev_sets_are_built_once_per_machine_then_read(tmp_path, monkeypatch):
    """Built once into a runs root and the machine's cache (`ENVLAB_CACHE`); another runs root copies the machine's,
    a machine copy that is not suite rows is built again, and with the machine cache off each root builds its own."""
    from envsim import suite

    monkeypatch.setenv("ENVLAB_CACHE", str(tmp_path / "machine"))
    first, second, third = tmp_path / "first", tmp_path / "second", tmp_path / "third"
    standard = validation_entries(first, 30, FIRST_AGENTS)
    assert standard == build("validation", agents=FIRST_AGENTS)[0] and (first / "validation-30.jsonl").is_file()
    dev = dev_entries(first, 3, agents=FIRST_AGENTS)
    assert dev == suite.dev_entries(3, [e.instance for e in standard], agents=FIRST_AGENTS)
    machine = tmp_path / "machine" / "boards" / envsim_fingerprint()
    assert sorted(p.name for p in machine.glob("*.jsonl")) == ["dev-3-beside-validation-30.jsonl",
                                                               "validation-30.jsonl"]
    real_build = suite.build

    def built(*args, **kwargs):
        raise AssertionError("built again")

    monkeypatch.setattr(suite, "build", built)
    monkeypatch.setattr(suite, "dev_entries", built)
    assert validation_entries(first, 30, FIRST_AGENTS) == standard and dev_entries(first, 3, agents=FIRST_AGENTS) == dev
    assert validation_entries(second, 30, FIRST_AGENTS) == standard  # copied from the machine's cache
    assert dev_entries(second, 3, agents=FIRST_AGENTS) == dev
    assert (second / "validation-30.jsonl").read_bytes() == (first / "validation-30.jsonl").read_bytes()
    (machine / "validation-30.jsonl").write_text("not a board\n")
    monkeypatch.setattr(suite, "build", real_build)
    assert validation_entries(third, 30, FIRST_AGENTS) == standard  # built again, and the machine's copy mended
    assert (machine / "validation-30.jsonl").read_bytes() == (first / "validation-30.jsonl").read_bytes()
    monkeypatch.setenv("ENVLAB_CACHE", "")
    monkeypatch.setattr(suite, "build", built)
    with pytest.raises(AssertionError, match="built again"):
        validation_entries(tmp_path / "fourth", 30, FIRST_AGENTS)
    assert boards_cache() is None


# ---------------------------------------------------------------- the report, by hand


def stored_rates(engine, run_id: int) -> dict[int, tuple[float, float, dict[int, float]]]:
    """stage -> (pooled valid, pooled optimal, {size: valid}) straight from the StageMetric rows."""
    out = {}
    with session(engine) as s:
        rows = s.exec(select(StageMetric).where(StageMetric.run_id == run_id, StageMetric.split == "validation")).all()
    for k in {m.stage_index for m in rows}:
        ms = [m for m in rows if m.stage_index == k]
        n = sum(m.episodes for m in ms)
        out[k] = (sum(m.valid for m in ms) / n, sum(m.optimal for m in ms) / n,
                  {m.size: m.valid / m.episodes for m in ms})
    return out


T_975 = {2: 4.302652729911275, 5: 2.570581835636314}  # Student's t, 97.5th percentile, by degrees of freedom


def interval(values: list[float]) -> tuple[float, float]:
    """By hand: mean +- t(0.975, n-1) x sd / sqrt(n), sd with n - 1 in the denominator."""
    n = len(values)
    mean = sum(values) / n
    sd = (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5
    return mean - T_975[n - 1] * sd / n ** 0.5, mean + T_975[n - 1] * sd / n ** 0.5


def test_the_t_interval_and_the_detectable_difference_by_hand():
    assert t_interval([0.50, 0.53, 0.56]) == pytest.approx((0.53 - 4.302652729911275 * 0.03 / 3 ** 0.5,
                                                           0.53 + 4.302652729911275 * 0.03 / 3 ** 0.5))
    assert t_interval([0.4]) == (0.4, 0.4)
    one, two = estimate({3: 0.015}, paired=True), estimate({0: 0.01, 3: 0.02}, paired=True)
    assert (difference_cell(one), difference_cell(two)) == ("+1.50 [1 seed: no interval]", "+1.50 [-4.85, +7.85]")
    # the standardized differences a two-sided paired t test at 0.05 detects with 80% power (G*Power's table:
    # n = 3: 3.264, n = 6: 1.435, n = 10: 0.996), scaled by the sd of the differences
    assert detectable(0.01, 3) == pytest.approx(0.03264, abs=1e-5)
    assert detectable(0.01, 6) == pytest.approx(0.01435, abs=1e-5)
    assert detectable(0.02, 10) == pytest.approx(0.01992, abs=2e-5)
    assert detectable(0.01, 1) is None and detectable(0.0, 4) == 0.0
    # and by simulation: paired differences of that mean and sd are found significant 80% of the time
    rng = np.random.default_rng(0)
    x = rng.normal(detectable(1.0, 6), 1.0, size=(200_000, 6))
    t = x.mean(axis=1) / (x.std(axis=1, ddof=1) / 6 ** 0.5)
    assert (np.abs(t) > T_975[5]).mean() == pytest.approx(0.80, abs=0.005)
    assert t_power(detectable(1.0, 6), 1.0, 6) == pytest.approx(0.8)


def test_the_report_equals_a_hand_computation_from_the_stored_rows(engine, tmp_path):
    """On SQLite and PostgreSQL (`engine`, tests/conftest.py)."""
    experiment = scripted_experiment(engine)
    runs = experiment_runs(engine, experiment.id)
    assert [(r.arm, r.seed) for r in runs] == [(a, k) for k in range(3) for a in ("fixed", "heuristic")]
    assert {r.status for r in runs} == {"done"} and {r.settings.auto_apply for r in runs} == {True}
    assert experiment.settings.steps_per_stage == 1 and experiment.settings.validation_boards == 8
    rates = {(r.arm, r.seed): stored_rates(engine, r.id) for r in runs}
    c = comparison(engine, "cmp")
    for arm in ("fixed", "heuristic"):
        for k in (0, 1, 2):
            values = [rates[(arm, seed)][k][0] for seed in range(3)]
            e = c.estimate(arm, Rate.VALID, k)
            assert e.values == tuple(values) and e.mean == pytest.approx(sum(values) / 3)
            assert (e.low, e.high) == pytest.approx(interval(values)) and e.low <= e.mean <= e.high
            assert c.estimate(arm, Rate.OPTIMAL, k).mean == pytest.approx(sum(rates[(arm, s)][k][1]
                                                                              for s in range(3)) / 3)
            assert c.estimate(arm, Rate.VALID, k, 4).mean == pytest.approx(sum(rates[(arm, s)][k][2][4]
                                                                               for s in range(3)) / 3)
        curves = [[rates[(arm, s)][k][0] for k in (0, 1, 2)] for s in range(3)]
        aucs = [((v0 + v1) / 2 + (v1 + v2) / 2) / 2 for v0, v1, v2 in curves]
        assert c.estimate(arm, Rate.VALID, AUC).values == pytest.approx(aucs)
    # stage 0 is the same policy on the same boards for every arm: the paired difference is exactly 0
    assert c.difference("heuristic", Rate.VALID, 0).values == (0.0, 0.0, 0.0)
    diffs = [rates[("heuristic", s)][2][0] - rates[("fixed", s)][2][0] for s in range(3)]
    d = c.difference("heuristic", Rate.VALID, 2)
    assert d.values == pytest.approx(diffs) == [0.25, 0.25, 0.125]  # seed 2 solves every board: 8 of 8 at most
    assert d.mean == pytest.approx(sum(diffs) / 3)
    assert (d.low, d.high) == pytest.approx(interval(diffs))
    assert d.sd == pytest.approx(0.125 / 3 ** 0.5 * 1)  # differences 0.25, 0.25, 0.125: sd 0.0722
    assert d.detectable == pytest.approx(3.264 * d.sd, rel=1e-3)
    assert c.difference("fixed", Rate.VALID, 2) is None
    text = report_markdown(c)
    assert "every run trains 2 stages, each on 8 boards in 1 GRPO steps (2 in all" in text
    final = c.estimate("heuristic", Rate.VALID, 2)
    assert f"| heuristic | {c.estimate('heuristic', Rate.VALID, 0).mean * 100:.1f}%" in text
    assert f"{final.mean * 100:.1f}% [{final.low * 100:.1f}, {final.high * 100:.1f}]" in text
    assert (f"| heuristic - fixed | {d.mean * 100:+.2f} [{d.low * 100:+.2f}, {d.high * 100:+.2f}] | "
            f"{d.sd * 100:.2f} | {d.detectable * 100:.2f} | +25.00, +25.00, +12.50 |") in text  # points, no %
    assert "bootstrap" not in text
    written = write_report(c, tmp_path / "report")
    with open(written["runs"]) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 3 * 3
    for row in rows:
        valid, optimal, by_size = rates[(row["arm"], int(row["seed"]))][int(row["stage"])]
        assert (float(row["valid_rate"]), float(row["optimal_rate"])) == (valid, optimal)
        assert float(row["valid_rate_3"]) == by_size[3]
    with open(written["summary"]) as f:
        summary = {(r["arm"], r["rate"], r["stage"], r["size"]): r for r in csv.DictReader(f)}
    row = summary[("heuristic", "valid", "2", "all")]
    assert (float(row["mean"]), float(row["diff_vs_fixed_mean"])) == pytest.approx((final.mean, d.mean))
    assert float(summary[("fixed", "valid", "auc", "all")]["mean"]) == pytest.approx(sum(
        c.values[("fixed", Rate.VALID, AUC, POOLED)].values()) / 3)
    with open(written["differences"]) as f:
        pairs = {(r["arm"], r["against"], r["rate"], r["stage"]): r for r in csv.DictReader(f)}
    row = pairs[("heuristic", "fixed", "valid", "2")]
    assert [float(row[k]) for k in ("mean", "low", "high", "sd", "detectable", "seed_0", "seed_1", "seed_2")] == \
        pytest.approx([d.mean, d.low, d.high, d.sd, d.detectable, *diffs])
    assert isinstance(written["figure"], Path) and written["figure"].stat().st_size > 10_000  # kaleido + Chromium


def test_the_figure_is_drawn_again_when_a_try_fails_and_its_last_failure_is_said(empty_lab, tmp_path, monkeypatch):
    """kaleido once asked its page before the page's script had loaded (a loaded machine): each try at curves.png
    starts a browser of its own, and the figure is written by a later one; when every try fails, the reason is
    the last one's, and the numbers are written all the same."""
    import plotly.graph_objects as go

    from lab.study import comparison as comparison_module

    scripted_experiment(empty_lab, seeds=1, stages=1)
    c = comparison(empty_lab, "cmp")
    draw, tries = go.Figure.write_image, []

    def flaky(figure, path, **kwargs):
        tries.append(path)
        if len(tries) < comparison_module.DRAW_TRIES:
            raise RuntimeError(f"try {len(tries)}: kaleido_scopes is not defined")
        return draw(figure, path, **kwargs)

    monkeypatch.setattr(go.Figure, "write_image", flaky)
    written = write_report(c, tmp_path / "a")
    assert len(tries) == comparison_module.DRAW_TRIES == 3
    assert isinstance(written["figure"], Path) and written["figure"].stat().st_size > 10_000
    tries.clear()

    def broken(figure, path, **kwargs):
        tries.append(path)
        raise RuntimeError(f"try {len(tries)}: kaleido_scopes is not defined")

    monkeypatch.setattr(go.Figure, "write_image", broken)
    written = write_report(c, tmp_path / "b")
    assert written["figure"] == "not drawn (RuntimeError: try 3: kaleido_scopes is not defined)" and len(tries) == 3
    assert not (tmp_path / "b" / "curves.png").exists() and (tmp_path / "b" / "runs.csv").stat().st_size > 0


def test_the_curves_have_one_mean_band_and_dots_per_arm(empty_lab):
    scripted_experiment(empty_lab, seeds=2, stages=1)
    c = comparison(empty_lab, "cmp")
    traces = {t.name: t for t in curves_figure(c).data}
    assert set(traces) == {"fixed", "fixed interval", "fixed seeds", "heuristic", "heuristic interval",
                           "heuristic seeds"}
    assert list(traces["heuristic"].y) == [c.estimate("heuristic", Rate.VALID, k).mean for k in (0, 1)]
    assert len(traces["fixed seeds"].y) == 2 * 2  # a dot per seed and stage


def test_experiment_commands_queue_list_report_and_refuse(empty_lab, tmp_path, capsys, monkeypatch):
    db = str(tmp_path / "lab.db")
    (tmp_path / "small.json").write_text(CONFIG.model_dump_json())
    assert cli.main(["experiment", "new", "--name", "cli", "--arms", "fixed,random", "--seeds", "2", "--stages", "1",
                     "--config", str(tmp_path / "small.json"), "--validation-per-size", "30", "--grpo",
                     "max_steps=2", "--db", db]) == 0
    out = capsys.readouterr().out
    assert "4 runs queued (2 arms x 2 seeds)" in out and "1 stages x 8 boards x 2 GRPO steps; 630 validation" in out
    assert "per stage, agents 3-5; the report leads with the valid rate" in out
    assert cli.main(["experiment", "new", "--name", "hard", "--arms", "fixed", "--seeds", "1", "--scenario",
                     "hard-start", "--instances", "32", "--db", db]) == 0
    hard = find_experiment(empty_lab, "hard").settings
    assert (hard.scenario, hard.instances, hard.config.hole_ratio[10]) == ("hard-start", 32, 0.4)
    assert cli.main(["experiment", "new", "--name", "x", "--arms", "fixed", "--stages", "0", "--db", db]) == 2
    assert "--stages: 0 is less than 1" in capsys.readouterr().err and find_experiment(empty_lab, "hard").id == 2
    assert cli.main(["experiment", "new", "--name", "cli", "--arms", "fixed", "--db", db]) == 2
    assert "an experiment named 'cli' exists already" in capsys.readouterr().err
    assert cli.main(["experiment", "new", "--name", "x", "--arms", "fixed,fixed", "--db", db]) == 2
    assert "arm names must be unique" in capsys.readouterr().err
    assert cli.main(["experiment", "new", "--name", "x", "--arms", "fixed", "--grpo", "speed=9", "--db", db]) == 2
    err = capsys.readouterr().err
    assert "grpo: speed: not a GRPOConfig field a run may set" in err
    run_all(empty_lab)
    assert cli.main(["experiment", "list", "--db", db]) == 0
    listed = capsys.readouterr().out
    assert "cli: arms fixed, random; 2 seeds; 1 stages; runs 4 done; 8/8 stages done" in listed
    assert "hard: arms fixed; 1 seeds; 3 stages; runs 1 done; 4/4 stages done" in listed
    assert cli.main(["experiment", "report", "cli", "--out", str(tmp_path / "out"), "--db", db]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# Experiment cli") and "## Valid rate minus fixed, paired by seed" in out
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"report.md", "runs.csv", "summary.csv", "differences.csv",
                                                               "curves.png"}
    assert cli.main(["experiment", "report", "nothing", "--db", db]) == 2


def scripted_benchmark(engine, job, progress):
    """The benchmark job without its 3,150 boards: one stored benchmark episode."""
    with session(engine) as s:
        payload = BenchmarkPayload.of(job)
        s.add(Episode(run_id=payload.run_id, stage_index=payload.stage_index, split="benchmark",
                      instance_id="b", instance={}, size=3, num_agents=3, completion="", valid=False, optimal=False))
        s.commit()
    return {}


def test_benchmarks_are_queued_once_per_run_and_labelled_by_experiment_arm_and_seed(empty_lab, tmp_path, capsys):
    experiment = scripted_experiment(empty_lab, seeds=1, stages=1)
    runs = experiment_runs(empty_lab, experiment.id)
    assert cli.main(["experiment", "benchmark", "cmp", "--db", str(tmp_path / "lab.db")]) == 0
    out = capsys.readouterr().out
    assert f"run {runs[0].id} (fixed, seed 0): benchmark job" in out and "queued for stage 1" in out
    assert queue_benchmarks(empty_lab, experiment.id)[0].endswith("has a benchmark job queued or running already")
    assert _benchmarks_pending(empty_lab, experiment.id) == 2
    run_worker(empty_lab, {"benchmark": scripted_benchmark}, WorkerOptions(once=True, poll_s=0.01))
    assert _benchmarks_pending(empty_lab, experiment.id) == 0
    assert "was evaluated on the benchmark at" in queue_benchmarks(empty_lab, experiment.id)[1]
    assert benchmark_choices(empty_lab) == [("exp cmp / fixed / seed 0, stage 1", f"{runs[0].id}:1"),
                                      ("exp cmp / heuristic / seed 0, stage 1", f"{runs[1].id}:1")]
    progress = experiment_progress(empty_lab, experiment.id)
    assert (progress.done, progress.total, progress.ended, progress.benchmarks_done) == (4, 4, True, 2)
    with session(empty_lab) as s:
        assert len(s.exec(select(Job).where(Job.kind == "benchmark")).all()) == 2


def test_settings_record_the_equal_compute(empty_lab):
    experiment = create_experiment(empty_lab, name="rec", settings=RunSettings(stages=3), arms=["fixed", "random"],
                                   seeds=2, instances=64, scenario="hard-start")
    recorded = experiment.settings
    assert (recorded.stages, recorded.instances, recorded.steps_per_stage, recorded.validation_per_size,
            recorded.validation_boards, recorded.scenario) == (3, 64, 16, 120, 2520, "hard-start")
    for run in experiment_runs(empty_lab, experiment.id):
        assert run.settings.validation_per_size == 120 and run.settings.grpo == {}
        with session(empty_lab) as s:
            stage0 = s.exec(select(Stage).where(Stage.run_id == run.id)).one()
        assert (stage0.config.data_ratio[10], stage0.config.num_instances) == (0.86, 64)


def test_an_experiment_run_keeps_its_boards_per_stage_whatever_the_engineer_proposes(empty_lab, monkeypatch):
    def greedy(evidence, *, seed=0, **_):  # an engineer that asks for more boards than the others get
        more = evidence.current.config.model_copy(update={"num_instances": 99})
        return EngineerAnswer(prompt="", raw="", proposed=more.model_dump(mode="json"),
                              projection=project(more.model_dump(mode="json")), rationale="more data")

    monkeypatch.setitem(ENGINEERS, "fixed", replace(ENGINEERS["fixed"], propose=greedy))
    experiment = scripted_experiment(empty_lab, seeds=1, stages=1)
    with session(empty_lab) as s:
        for run in experiment_runs(empty_lab, experiment.id):
            stage1 = s.exec(select(Stage).where(Stage.run_id == run.id, Stage.index == 1)).one()
            assert stage1.config.num_instances == 8
        proposal = s.exec(select(Proposal).where(Proposal.engineer == "fixed")).one()
        assert proposal.adjustments[-1] == {"field": "num_instances", "old": 99, "new": 8, "reason": (
            "kept: every stage of an experiment's run trains on the same number of boards")}
    with session(empty_lab) as s:  # a run of no experiment takes what its engineer proposes
        run = create_run(s, name="free", config=CONFIG, settings=RunSettings(stages=1, auto_apply=True),
                         engineer="fixed")
    run_all(empty_lab)
    with session(empty_lab) as s:
        assert s.exec(select(Stage).where(Stage.run_id == run.id, Stage.index == 1)).one().config \
            .num_instances == 99


def test_run_takes_a_scenario_a_preset_and_a_larger_validation_set(empty_lab, tmp_path):
    args = cli.arguments().parse_args(["run", "--scenario", "hard-start", "--instances", "16", "--context",
                                       "failures-only", "--engineer", "llm", "--backend", "openai:m",
                                       "--validation-per-size", "33", "--grpo", "max_steps=1"])
    with session(empty_lab) as s:
        run = cli.runs._new_run(s, args, cli.runs._new_settings(args))
        stage0 = s.exec(select(Stage).where(Stage.run_id == run.id)).one()
    assert (run.settings.context_preset, run.settings.validation_per_size, run.settings.grpo) == (
        "failures-only", 33, {"max_steps": 1})
    assert (stage0.config.num_instances, stage0.config.data_ratio[10]) == (16, 0.86)
    with pytest.raises(cli.UsageError, match="unknown scenario 'easy'"):
        cli.runs._new_settings(cli.arguments().parse_args(["run", "--scenario", "easy"]))
    with pytest.raises(cli.UsageError, match="validation_per_size = 31: a multiple of 3"):
        cli.runs._new_settings(cli.arguments().parse_args(["run", "--validation-per-size", "31"]))


def test_the_real_stage_evaluates_on_the_larger_validation_set(empty_lab, tmp_path):
    torch = pytest.importorskip("torch")
    from training.stage import run_stage_job

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with session(empty_lab) as s:
            run = create_run(s, name="big", config=CONFIG,
                             settings=RunSettings(stages=1, validation_per_size=33, dev_per_size=3,
                                                  validation_agents=FIRST_AGENTS),
                             engineer="fixed")
        run_worker(empty_lab, {"stage": run_stage_job}, WorkerOptions(once=True, poll_s=0.01))
    finally:
        torch.set_num_threads(threads)
    with session(empty_lab) as s:
        episodes = s.exec(select(Episode).where(Episode.run_id == run.id, Episode.split == "validation")).all()
        metrics = s.exec(select(StageMetric).where(StageMetric.run_id == run.id,
                                                   StageMetric.split == "validation")).all()
        dev = s.exec(select(Episode.instance_id).where(Episode.run_id == run.id, Episode.split == "dev")).all()
    assert len(episodes) == 264 and {m.size: m.episodes for m in metrics} == {s: 33 for s in range(3, 11)}
    assert len(dev) == 24 and not set(dev) & {e.instance_id for e in episodes}  # the dev set avoids all 264
    assert (tmp_path / "validation-33.jsonl").is_file()  # cached under the runs root, beside the database
    standard = {e.instance.id for e in build("validation", agents=FIRST_AGENTS)[0]}
    assert standard <= {e.instance_id for e in episodes}


def test_a_run_of_an_experiment_travels_alone(empty_lab, tmp_path):
    from lab.archive import export_run, import_run

    experiment = scripted_experiment(empty_lab, seeds=1, stages=1)
    run = experiment_runs(empty_lab, experiment.id)[1]
    path = export_run(empty_lab, run.id, tmp_path / "run.zip")
    other = make_engine(str(tmp_path / "other" / "lab.db"))
    upgrade(other)
    with session(other) as s:
        imported = s.get(Run, import_run(other, path))
        assert (imported.uuid, imported.arm, imported.experiment_id) == (run.uuid, "heuristic", None)
        assert s.exec(select(Experiment)).all() == []
    other.dispose()


def test_an_arm_added_later_runs_every_seed_on_what_the_others_share(empty_lab, capsys):
    experiment = scripted_experiment(empty_lab, name="grow", seeds=2, stages=1)
    done = {r.id for r in experiment_runs(empty_lab, experiment.id)}
    db = str(empty_lab.url.database)
    assert cli.main(["experiment", "add-arm", "grow", "--arms", "learnability,r=random", "--db", db]) == 0
    assert "4 runs queued" in capsys.readouterr().out
    assert [a["name"] for a in find_experiment(empty_lab, "grow").arms] == ["fixed", "heuristic", "learnability", "r"]
    runs = experiment_runs(empty_lab, experiment.id)
    old, new = [r for r in runs if r.id in done], [r for r in runs if r.id not in done]
    assert [(r.arm, r.seed, r.engineer) for r in new] == [("learnability", 0, "learnability"), ("r", 0, "random"),
                                                          ("learnability", 1, "learnability"), ("r", 1, "random")]
    shared = ("stages", "grpo", "validation_per_size", "validation_boards", "auto_apply")
    for run in new:
        assert {k: getattr(run.settings, k) for k in shared} == {k: getattr(old[0].settings, k) for k in shared}
        with session(empty_lab) as s:
            assert s.exec(select(Stage).where(Stage.run_id == run.id)).one().config == CONFIG
    assert all(r.status == "done" for r in old)  # nothing that was done is queued again
    with session(empty_lab) as s:
        queued = s.exec(select(Job).where(Job.status == "queued")).all()
    assert sorted(j.run_id for j in queued) == sorted(r.id for r in new)
    for arms, why in (("fixed", "not one of the experiment's"), ("nobody", "unknown engineer")):
        with pytest.raises(ExperimentError, match=why):
            add_arms(empty_lab, "grow", [arms])
    assert len(experiment_runs(empty_lab, experiment.id)) == 8  # a refused arm stores nothing


SHIPPED = Path(__file__).resolve().parents[2] / "docs" / "results" / "study-6seed" / "study.db.gz"


def test_an_experiment_adopts_done_runs_of_another_database_at_the_same_compute(empty_lab, tmp_path, capsys):
    source = tmp_path / "shipped.db"
    with gzip.open(SHIPPED, "rb") as src, source.open("wb") as dst:
        dst.write(src.read())
    before = hashlib.sha256(source.read_bytes()).hexdigest()
    today = create_experiment(empty_lab, name="today", scenario="hard-start", arms=["random"], seeds=1,
                              settings=RunSettings(stages=3))  # the shipped runs: the 2-agent tiny, 2-agent boards
    with pytest.raises(ExperimentError, match=r"differs from 'today' in validation_agents \(\[2\] there, \[3, 4, 5\] "
                                              r"here\); validation_boards \(960 there, 2520 here\); policy "
                                              r"\('tiny-2agent' there, 'tiny' here\)"):
        adopt_runs(empty_lab, today.id, source, "random", [0], source_experiment="hardstart")
    experiment = create_experiment(empty_lab, name="hardstart", scenario="hard-start", arms=["fixed", "random"],
                                   seeds=4, settings=RunSettings(stages=3, validation_agents=FIRST_AGENTS),
                                   policy="tiny-2agent")
    own = {(r.arm, r.seed): r.id for r in experiment_runs(empty_lab, experiment.id)}
    db = str(empty_lab.url.database)
    for args, why in ((["--arm", "heuristic", "--seeds", "0"], "has no arm 'heuristic'"),
                      (["--arm", "random", "--seeds", "2-4"], "seeds [2, 3, 4]: experiment 'hardstart' has seeds 0..3"),
                      (["--arm", "random", "--seeds", "0", "--from-experiment", "nope"], "no experiment 'nope'")):
        assert cli.main(["experiment", "adopt", "hardstart", "--from", str(source), *args, "--db", db]) == 2
        assert why in capsys.readouterr().err
    other = create_experiment(empty_lab, name="defaults", arms=["random"], seeds=1,
                              settings=RunSettings(stages=3, validation_agents=FIRST_AGENTS), policy="tiny-2agent")
    with pytest.raises(ExperimentError, match=r"differs from 'defaults' in config .*: not the same compute"):
        adopt_runs(empty_lab, other.id, source, "random", [0], source_experiment="hardstart")
    renamed = create_experiment(empty_lab, name="renamed", scenario="hard-start", arms=["random=heuristic"], seeds=1,
                                settings=RunSettings(stages=3, validation_agents=FIRST_AGENTS), policy="tiny-2agent")
    with pytest.raises(ExperimentError, match=r"seed 0: its run 49 there ran engineer 'random', this arm runs "
                                              r"'heuristic'"):
        adopt_runs(empty_lab, renamed.id, source, "random", [0], source_experiment="hardstart")

    assert cli.main(["experiment", "adopt", "hardstart", "--from", str(source), "--arm", "random", "--seeds", "0-2",
                     "--db", db]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "experiment hardstart: 3 run(s) adopted as arm 'random'"
    runs = {(r.arm, r.seed): r for r in experiment_runs(empty_lab, experiment.id)}
    assert len(runs) == 8 and all(runs[("random", k)].id not in own.values() for k in range(3))
    assert runs[("random", 3)].id == own[("random", 3)]
    # the shipped runs 49, 50, 51 (random, seeds 0..2), stage by stage, as docs/results/README.md gives them
    assert [f"{source} run {n} -> run {runs[('random', k)].id}" in out
            for k, n in enumerate((49, 50, 51))] == [True] * 3
    c = comparison(empty_lab, "hardstart")
    valid = {k: [round(c.values[("random", Rate.VALID, stage, POOLED)][k] * 960) for stage in range(4)]
             for k in range(3)}
    assert valid == {0: [510, 520, 530, 534], 1: [510, 520, 526, 535], 2: [510, 530, 536, 550]}
    # 3 of the 4 seeds: the report says which (seed 3 of `random` has not run)
    assert "| 54.5% [53.0, 56.0] (seeds 0, 1, 2: 54.2, 54.2, 55.2) |" in report_markdown(c)
    assert seeds_text(c.estimate("random", Rate.VALID, 1), of=[0, 1, 2]) == "54.2, 54.2, 55.2"
    with session(empty_lab) as s:
        for k in range(3):
            replaced = s.get(Run, own[("random", k)])
            assert (replaced.experiment_id, replaced.status) == (None, "cancelled")
            assert replaced.status_reason.startswith(f"replaced in experiment 'hardstart' by run "
                                                     f"{runs[('random', k)].id}, adopted from shipped.db")
            assert {j.status for j in s.exec(select(Job).where(Job.run_id == replaced.id))} == {"cancelled"}
        assert s.exec(select(Job).where(Job.run_id == own[("random", 3)])).one().status == "queued"
    assert hashlib.sha256(source.read_bytes()).hexdigest() == before  # read from a copy: never migrated

    with pytest.raises(ExperimentError, match=r"seed 0: its run \d+ here has run already \(done\)"):
        adopt_runs(empty_lab, "hardstart", source, "random", [0, 3])
    assert len(experiment_runs(empty_lab, experiment.id)) == 8  # a refusal stores nothing


# ---------------------------------------------------------------- compute matched


def test_match_compute_gives_the_arms_without_probes_the_probe_answers_as_extra_grpo_steps(empty_lab):
    """The default scenario (512 boards on 8 sizes) with the tiny policy: a stage is 128 GRPO steps of 32 rollouts;
    learnability probes 8 sizes x 6 cells x 16 boards x 8 answers = 6,144 answers per proposal, the rollouts of 192
    steps. `extra` gives fixed those 192 steps at every trained stage (its runs' max_steps 320); `trim` would take
    them off learnability's 128 and is refused. Agent counts 2, 3, 4 add a probe per count: 8 x 9 x 128 = 9,216
    answers, 288 steps."""
    from storage.settings import ComputeMatch

    extra = create_experiment(empty_lab, name="extra", arms=["fixed", "learnability"], seeds=2,
                              settings=RunSettings(stages=2), match="extra")
    assert (extra.settings.steps_per_stage, extra.settings.rollouts_per_stage) == (128, 4096)
    assert extra.settings.matched == ComputeMatch(mode="extra", probe_answers={"fixed": 0, "learnability": 6144},
                                                  steps={"fixed": 192, "learnability": 0},
                                                  rollouts={"fixed": 6144, "learnability": 0})
    grpo = {(r.arm, r.seed): r.settings.grpo for r in experiment_runs(empty_lab, extra.id)}
    assert grpo == {("fixed", 0): {"max_steps": 320}, ("learnability", 0): {},
                    ("fixed", 1): {"max_steps": 320}, ("learnability", 1): {}}
    assert planned_steps(512, grpo[("fixed", 0)], "compact") == 320
    with pytest.raises(ExperimentError, match="arm 'learnability': its probes \\(6,144 answers per proposal\\) "
                                              "outweigh a stage's 4,096 rollouts"):
        create_experiment(empty_lab, name="trim", arms=["fixed", "learnability"], seeds=1,
                          settings=RunSettings(stages=2), match="trim")
    trim = create_experiment(empty_lab, name="trim", arms=["fixed", "learnability"], seeds=1, match="trim",
                             settings=RunSettings(stages=2, grpo={"max_steps": 256}))
    assert (trim.settings.matched.steps, trim.settings.matched.rollouts) == ({"fixed": 0, "learnability": -192},
                                                                             {"fixed": 0, "learnability": -6144})
    assert [r.settings.grpo for r in experiment_runs(empty_lab, trim.id)] == [{"max_steps": 256}, {"max_steps": 64}]
    counts = create_experiment(empty_lab, name="counts", arms=["heuristic", "learnability"], seeds=1,
                               settings=RunSettings(stages=1, agent_counts=(2, 3, 4)), match="extra")
    assert counts.settings.matched.steps == {"heuristic": 288, "learnability": 0}
    # 40 completions a step (8 generations of 5 boards; 102 steps, the last 2 boards dropped): 6,144 / 40 = 153.6,
    # rounded to 154 steps of 6,160 answers
    rounded = create_experiment(empty_lab, name="rounded", arms=["fixed", "learnability"], seeds=1, match="extra",
                                settings=RunSettings(stages=1, grpo={"per_device_train_batch_size": 40}))
    assert (rounded.settings.steps_per_stage, rounded.settings.rollouts_per_stage) == (102, 4080)
    assert (rounded.settings.matched.steps["fixed"], rounded.settings.matched.rollouts["fixed"]) == (154, 6160)
    plain = create_experiment(empty_lab, name="plain", arms=["fixed", "learnability"], seeds=1,
                              settings=RunSettings(stages=1))
    assert plain.settings.matched is None and all(r.settings.grpo == {} for r in experiment_runs(empty_lab, plain.id))
    # an arm added later is matched to the same probes; one whose probes cannot be planned is refused
    add_arms(empty_lab, "extra", ["heuristic"])
    assert find_experiment(empty_lab, "extra").settings.matched.steps == {"fixed": 192, "learnability": 0,
                                                                          "heuristic": 192}
    assert {r.settings.grpo.get("max_steps") for r in experiment_runs(empty_lab, extra.id)
            if r.arm == "heuristic"} == {320}
    with pytest.raises(ExperimentError, match="arm 'llm:openai:m@paper-best': its engineer probes configs as its "
                                              "answers lead it"):
        create_experiment(empty_lab, name="llm", arms=["fixed", "llm:openai:m@paper-best"], seeds=1,
                          settings=RunSettings(stages=1, remeasure=True), match="extra")


def test_an_arm_without_probes_trains_its_extra_steps_in_the_stage_it_queues(empty_lab):
    """8 boards on sizes 3 and 4 in 1 GRPO step of 32 rollouts; learnability probes 2 x 6 x 128 = 1,536 answers per
    proposal, 48 steps' rollouts: fixed's stage 1, queued after its proposal, trains 49 steps (its GRPO settings,
    as the stage job reads them), and the compute table counts them."""
    from storage.models import JobStatus
    from tests.recorded import SCRIPTED
    from training.stage import stage_args

    experiment = create_experiment(empty_lab, name="m", arms=["fixed", "learnability"], seeds=1, config=CONFIG,
                                   match="extra",
                                   settings=RunSettings(stages=1, validation_boards=8,
                                                        grpo={"num_generations": 4, "per_device_train_batch_size": 32}))
    fixed, probing = experiment_runs(empty_lab, experiment.id)
    with session(empty_lab) as s:  # learnability's runs wait: its probes would sample the policy
        for job in s.exec(select(Job).where(Job.run_id == probing.id)):
            job.status = JobStatus.CANCELLED
            s.add(job)
        s.commit()
    from lab.loop import after_job

    while run_worker(empty_lab, SCRIPTED, WorkerOptions(once=True, poll_s=0.01, after=after_job)):
        pass
    with session(empty_lab) as s:
        stage_1 = s.exec(select(Job).where(Job.run_id == fixed.id, Job.kind == "stage", Job.target == 1)).one()
    assert stage_1.status == "done"
    payload = StagePayload.of(stage_1)
    grpo = stage_args(empty_lab, payload.run_id, payload.stage_index).settings.grpo
    assert grpo == {"num_generations": 4, "per_device_train_batch_size": 32, "max_steps": 49}
    assert planned_steps(8, grpo, "compact") == 49
    c = comparison(empty_lab, experiment.id)
    from lab.study.comparison import compute_rows, match_statement

    assert compute_rows(c)[1][0][:4] == ["fixed", "1", "49 (49)", "1,568 (1,568)"]  # 32 + 1,536 rollouts
    assert match_statement(c) == (" Compute matched (extra rollouts for the others, `--match-compute extra`): fixed "
                                  "(without probes) trained 48 extra GRPO steps per stage (1,536 answers) to match "
                                  "learnability's probes (1,536 answers per proposal).")
    assert match_statement(c) in report_markdown(c)
    assert "48 extra GRPO steps" in report_markdown(c) and "per trained stage, fixed 49 (compute matched)" \
        in report_markdown(c)


def test_experiment_new_match_compute_is_stored_and_shown(empty_lab, tmp_path, capsys):
    db = str(tmp_path / "lab.db")
    assert cli.main(["experiment", "new", "--name", "m", "--arms", "fixed,learnability", "--seeds", "1", "--stages",
                     "1", "--match-compute", "--db", db]) == 0
    said = ("compute matched (extra): fixed (without probes) trained 192 extra GRPO steps per stage (6,144 answers) "
            "to match learnability's probes (6,144 answers per proposal)")
    assert said in capsys.readouterr().out
    assert cli.main(["experiment", "list", "--db", db]) == 0
    assert f"    {said}" in capsys.readouterr().out
    assert cli.main(["experiment", "status", "m", "--db", db]) == 0
    assert said in capsys.readouterr().out
    assert cli.main(["experiment", "new", "--name", "t", "--arms", "fixed,learnability", "--seeds", "1", "--stages",
                     "1", "--match-compute", "trim", "--instances", "1024", "--db", db]) == 0
    assert ("compute matched (trim): learnability (probing 6,144 answers per proposal) trained 192 fewer GRPO steps "
            "per stage (6,144 answers) to match fixed (without probes)") in capsys.readouterr().out
    assert cli.main(["experiment", "new", "--name", "p", "--arms", "fixed,learnability", "--seeds", "1", "--stages",
                     "1", "--db", db]) == 0
    assert "compute matched" not in capsys.readouterr().out
    engine = make_engine(db)
    assert find_experiment(engine, "m").settings.matched.mode == "extra"
    assert find_experiment(engine, "p").settings.matched is None
    assert all(r.settings.dev_per_seed for r in experiment_runs(engine, find_experiment(engine, "p").id))
    engine.dispose()


def test_status_says_the_time_left_from_this_experiment_s_own_median_jobs(empty_lab):
    """2 runs of 2 stages; stage 0 took 1 min, a trained stage 10, a proposal 0.5 (each job's finish minus its
    start). With heuristic's stage 2 running on a worker, 1 trained stage is left: 10 min over 1 worker; with that
    job back in the queue and none running, the same over one worker; once every run is done, nothing is said."""
    from datetime import timedelta

    from sqlalchemy import update

    from lab.study.slurm import status_lines
    from storage.models import JobKind, JobStatus, StageStatus

    experiment = scripted_experiment(empty_lab, seeds=1, stages=2)
    assert time_left(empty_lab, experiment_progress(empty_lab, experiment.id)) == ""
    heuristic = next(r for r in experiment_runs(empty_lab, experiment.id) if r.arm == "heuristic")
    with session(empty_lab) as s:
        for job in s.exec(select(Job)).all():
            took = 1 if job.kind == JobKind.STAGE and job.target == 0 else 10 if job.kind == JobKind.STAGE else 0.5
            job.started_at = job.finished_at - timedelta(minutes=took)
            s.add(job)
        s.exec(update(Run).where(Run.id == heuristic.id).values(status="active"))
        s.exec(update(Stage).where(Stage.run_id == heuristic.id, Stage.index == 2).values(status=StageStatus.RUNNING))
        s.exec(update(Job).where(Job.run_id == heuristic.id, Job.kind == JobKind.STAGE, Job.target == 2)
               .values(status=JobStatus.RUNNING, worker="host:1"))
        s.commit()
    lines = status_lines(empty_lab, experiment.id)
    assert lines[:2] == ["experiment cmp: 1 of 2 runs done, 5 of 6 stages",
                         "time left: about 0.2 h over the 1 worker running its jobs now (1 trained stage at 10.0 min; "
                         "each a median of this experiment's)"]
    with session(empty_lab) as s:
        s.exec(update(Job).where(Job.status == JobStatus.RUNNING).values(status=JobStatus.QUEUED, worker=None))
        s.commit()
    assert time_left(empty_lab, experiment_progress(empty_lab, experiment.id)) == (
        "time left: about 0.2 h over one worker (none is running its jobs now) (1 trained stage at 10.0 min; each "
        "a median of this experiment's)")
    with session(empty_lab) as s:  # the run back before its stage 0: one of each kind is worded alone
        s.exec(update(Stage).where(Stage.run_id == heuristic.id).values(status=StageStatus.QUEUED))
        s.commit()
    assert time_left(empty_lab, experiment_progress(empty_lab, experiment.id)) == (
        "time left: about 0.3 h over one worker (none is running its jobs now) (1 stage 0 evaluation at 1.0 min, "
        "2 trained stages at 10.0 min; each a median of this experiment's)")
    with session(empty_lab) as s:  # every stage done, the run not yet marked done
        s.exec(update(Stage).where(Stage.run_id == heuristic.id).values(status=StageStatus.DONE))
        s.commit()
    assert time_left(empty_lab, experiment_progress(empty_lab, experiment.id)) == (
        "time left: no stage or proposal; the runs are ending")


def test_a_resumed_experiment_s_bar_starts_at_what_was_done_before_so_its_rate_is_this_command_s(empty_lab):
    """Stages done before `envlab experiment run` started are the bar's start, not progress it made in no time
    (which would make its rate millions of stages a second and its time left zero)."""
    import argparse
    import io

    from tqdm import tqdm

    from lab.cli.experiments import _progress_printer

    experiment = scripted_experiment(empty_lab, seeds=1, stages=2)
    said: list[str] = []
    out = io.StringIO()
    with tqdm(file=out, unit="stage", mininterval=0) as bar:
        on_progress = _progress_printer(empty_lab, argparse.Namespace(benchmark=False), bar, said.append)
        on_progress(experiment_progress(empty_lab, experiment.id))
        assert (bar.n, bar.initial, bar.total) == (6, 6, 6)
        assert "?stage/s" in out.getvalue().split("\r")[-1]
    assert said == ["experiment cmp: 6 of 6 stages done already"]


def test_an_experiment_for_two_processes_records_them_with_its_steps_counted_for_them(empty_lab, monkeypatch):
    """`envlab experiment new --processes 2`: what one process refuses (16 answers a board in batches of 8) is taken,
    and a stage's steps are those of two processes."""
    sixteen = RunSettings(stages=1, grpo={"num_generations": 16, "per_device_train_batch_size": 8})
    with pytest.raises(ExperimentError, match="must be divisible by num_generations"):
        create_experiment(empty_lab, name="one", settings=sixteen, arms=["fixed"], seeds=1, instances=64)
    experiment = create_experiment(empty_lab, name="two", settings=sixteen, arms=["fixed"], seeds=1, instances=64,
                                   processes=2)
    recorded = experiment.settings
    assert (recorded.processes, recorded.steps_per_stage, recorded.rollouts_per_stage) == (2, 64, 1024)
    # each run records them, so only a worker of two GPUs claims its training stages (storage.queue.claim)
    assert [run.settings.processes for run in experiment_runs(empty_lab, experiment.id)] == [2]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # a machine without a GPU: none of its workers could claim them
    with pytest.raises(ExperimentError) as refused:
        run_experiment(empty_lab, None, experiment.id)
    assert str(refused.value) == ("experiment 'two' is planned for 2 processes a stage, one per GPU, and this machine "
                                  "shows 0 GPU(s) (CUDA_VISIBLE_DEVICES): run it on a machine of 2 GPUs or more")


def test_an_experiments_workers_own_its_processes_gpus_and_one_more_for_a_vllm_server():
    """Each worker of `envlab experiment run` owns a block of the GPUs its stages were planned for; in vLLM's server
    mode one more, for its server (a worker trains on its GPUs less the server's), so a block of one GPU a stage is
    two GPUs a worker there; a worker for whom too few are left owns none."""
    from lab.study.experiments import worker_gpus
    from storage.settings import ExperimentSettings

    def settings(processes: int, grpo: dict) -> ExperimentSettings:
        return ExperimentSettings(run=RunSettings(stages=1, grpo=grpo), config=CONFIG, steps_per_stage=1,
                                  validation_boards=8, processes=processes)

    four = ["0", "1", "2", "3"]
    served = {"use_vllm": True, "vllm_mode": "server"}
    assert worker_gpus(settings(1, {}), four, 2) == [["0"], ["1"]]
    assert worker_gpus(settings(1, served), four, 2) == [["0", "1"], ["2", "3"]]
    assert worker_gpus(settings(2, served), four, 2) == [["0", "1", "2"], []]
    assert worker_gpus(settings(1, {"use_vllm": True, "vllm_mode": "colocate"}), four, 2) == [["0"], ["1"]]


def test_an_experiment_in_vllms_server_mode_on_one_gpu_is_refused_before_it_runs(empty_lab, monkeypatch):
    """A worker in vLLM's server mode trains beside its server's GPU: on a machine of one GPU the experiment is
    refused before any worker starts, saying how many it needs; on a machine without a GPU it is not (vLLM's devices
    are its own there)."""
    from lab.study import experiments as module

    experiment = create_experiment(empty_lab, name="served", settings=RunSettings(stages=1), arms=["fixed"], seeds=1,
                                   instances=8)
    with session(empty_lab) as s:  # as a lab with vLLM stores it (here, without vLLM, making it is refused)
        stored = s.get(Experiment, experiment.id)
        run = stored.settings.run.model_copy(update={"grpo": {"use_vllm": True, "vllm_mode": "server"}})
        stored.settings = stored.settings.model_copy(update={"run": run})
        s.add(stored)
        s.commit()
    monkeypatch.setattr(module, "visible_gpus", lambda: ["0"])
    with pytest.raises(ExperimentError) as refused:
        run_experiment(empty_lab, None, experiment.id)
    assert str(refused.value) == ("experiment 'served' is planned for 1 processes a stage, one per GPU, beside a GPU "
                                  "for its vLLM server, and this machine shows 1 GPU(s) (CUDA_VISIBLE_DEVICES): run it "
                                  "on a machine of 2 GPUs or more")
