"""The gate (lab/study/gate.py): its configs exactly; its report's numbers exact on scripted stage metrics (the
ranking on dev, the gains on validation, the rank correlation, whether the best config moves); the start a run ends
on."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from scipy import stats

from envsim.config import EnvConfig
from lab.cli import main as envlab
from lab.study import gate
from lab.study.experiments import create_experiment, experiment_runs, find_experiment
from storage.db import session
from storage.models import RunStatus, Stage, StageMetric
from storage.settings import RunSettings

CONFIGS = ("mixA-holes0.1-waits0.75", "mixA-holes0.05-waits0.9", "mixB-holes0.25-waits0.5")


def test_make_configs_writes_the_eight_configs_past_the_screen_s_corner(tmp_path: Path, capsys):
    assert envlab(["gate", "make-configs", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"8 configs and initial.json in {tmp_path}\n"
    names = sorted(p.stem for p in tmp_path.glob("mix*.json"))
    assert names == sorted(["mixA-holes0.1-waits0.75", "mixA-holes0.05-waits0.9", "mixB-holes0.05-waits0.9",
                            "mixC-holes0.05-waits0.9", "mixA-holes0-waits0.75", "mixB-holes0-waits0.75",
                            "mixC-holes0-waits0.6", "mixB-holes0.25-waits0.5"])
    c = EnvConfig.model_validate_json((tmp_path / "mixC-holes0-waits0.6.json").read_text())
    assert (set(c.hole_ratio.values()), set(c.wait_ratio.values())) == ({0.0}, {0.6})
    assert c.agent_ratio == {2: 0.1, 3: 0.1, 4: 0.4, 5: 0.4} and c.sizes == (5, 6, 7, 8, 9, 10)
    assert json.loads((tmp_path / "initial.json").read_text())["num_instances"] == 512


def scripted(engine, folder: Path, start: str, valid: dict[str, list[int]], dev: dict[str, list[int]]) -> None:
    """Experiment gate-START with CONFIGS as held arms, 2 seeds; stage 0 at 50 of 100 valid on both splits, stage
    1 as given per config and seed (valid of 100 boards)."""
    gate.write_configs(folder)
    initial = EnvConfig.model_validate_json((folder / "initial.json").read_text())
    arms = [f"{n}=static:{folder / n}.json" for n in CONFIGS]
    create_experiment(engine, name=f"gate-{start}", arms=arms, seeds=2, config=initial,
                      settings=RunSettings(stages=1, agent_counts=(2, 3, 4, 5), validation_agents=(3, 4, 5)))
    with session(engine) as s:
        for run in experiment_runs(engine, find_experiment(engine, f"gate-{start}").id):
            for split, values in (("validation", valid), ("dev", dev)):
                for k, v in ((0, 50), (1, values[run.arm][run.seed])):
                    s.add(StageMetric(run_id=run.id, stage_index=k, split=split, size=5, agents=3, episodes=100,
                                      valid=v, optimal=v, failures={}))
        s.commit()


A, B, C = CONFIGS


def test_the_report_ranks_on_dev_scores_on_validation_and_finds_a_moved_best(empty_lab, tmp_path: Path):
    # tiny: A best on dev; weak: C best on dev, and A trained from weak loses 4 points to C there (spread 1)
    scripted(empty_lab, tmp_path / "c", "tiny", valid={A: [56, 58], B: [54, 54], C: [52, 52]},
             dev={A: [57, 57], B: [54, 55], C: [51, 53]})
    scripted(empty_lab, tmp_path / "c", "weak", valid={A: [53, 53], B: [54, 56], C: [57, 57]},
             dev={A: [52, 52], B: [55, 56], C: [58, 58]})
    tiny, weak = gate.read_start(empty_lab, "tiny"), gate.read_start(empty_lab, "weak")
    assert gate.read_start(empty_lab, "static") is None
    assert tiny.ranking() == [A, B, C] and weak.ranking() == [C, B, A]
    assert tiny.dev[A] == pytest.approx({0: 0.07, 1: 0.07}) and tiny.validation[A] == pytest.approx({0: .06, 1: .08})
    assert (tiny.stage0, tiny.done, tiny.runs) == (pytest.approx(0.5), 0, 6)
    # pooled sd over the configs: A's seeds differ by 2 points (sd sqrt 2), B's and C's by none
    assert tiny.seed_spread() == pytest.approx((2 / 3) ** 0.5 / 100)
    assert weak.seed_spread() == pytest.approx((2 / 3) ** 0.5 / 100)
    rho, n = gate.rank_correlation(tiny, weak)
    assert (rho, n) == (pytest.approx(-1.0), 3)
    moved = {(m.at, m.other): m for m in gate.moves([tiny, weak])}
    assert moved[("weak", "tiny")].by_seed == pytest.approx({0: 0.04, 1: 0.04})  # C minus A, trained from weak
    assert moved[("tiny", "weak")].by_seed == pytest.approx({0: 0.04, 1: 0.06})  # A minus C, trained from tiny
    assert moved[("tiny", "weak")].loses and moved[("weak", "tiny")].loses
    assert gate.verdict([tiny, weak]) == (
        f"The best config moves: from the tiny start, {C} (the weak start's best) gains 5.00 points less than {A}, "
        "more than the seed spread there (0.82).")

    written = gate.write_report([weak, tiny], tmp_path / "out", ["bash scripts/gate.sh"])
    report = written["report"].read_text()
    assert report.startswith("# The gate: does the best environment move as the policy learns?\n\nRemade by:\n\n"
                             "```bash\nbash scripts/gate.sh\n```\n")
    assert f"| {C} | 1 | +8.00 | +8.00, +8.00 | +7.00 | +7.00, +7.00 |" in report
    assert f"| {A} | 1 | +7.00 | +7.00, +7.00 | +7.00 | +6.00, +8.00 |" in report
    assert "| weak / tiny | -1.00 | 3 |" in report
    assert f"| tiny | {A} | {C} (weak) | +5.00 | +4.00, +6.00 | 0.82 | yes |" in report
    with open(written["gains"]) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 3 * 2 * 2  # starts x configs x splits x seeds
    assert rows[0] == {"start": "weak", "config": B, "split": "dev", "seed": "0", "valid_gain": "0.05"}


def test_bests_within_the_seed_spread_do_not_move(empty_lab, tmp_path: Path):
    scripted(empty_lab, tmp_path / "c", "tiny", valid={A: [56, 58], B: [55, 57], C: [50, 52]},
             dev={A: [57, 57], B: [56, 56], C: [51, 53]})
    scripted(empty_lab, tmp_path / "c", "static", valid={A: [56, 58], B: [56, 58], C: [50, 54]},
             dev={A: [55, 55], B: [56, 57], C: [51, 51]})
    tiny, static = gate.read_start(empty_lab, "tiny"), gate.read_start(empty_lab, "static")
    assert (tiny.best, static.best) == (A, B)
    moved = {(m.at, m.other): m for m in gate.moves([tiny, static])}
    assert moved[("tiny", "static")].difference == pytest.approx(0.01)  # under tiny's spread
    assert moved[("static", "tiny")].difference == pytest.approx(0.0)
    spread = ((2 + 2 + 2) / 3) ** 0.5 / 100  # every config's 2 seeds 2 points apart at tiny: sd sqrt 2 each
    assert tiny.seed_spread() == pytest.approx(spread)
    assert not any(m.loses for m in moved.values())
    assert gate.verdict([tiny, static]).startswith("The best config does not move beyond the seed spread")
    rho = stats.spearmanr([0.07, 0.06, 0.02], [0.05, 0.065, 0.01]).statistic
    assert gate.rank_correlation(tiny, static) == (pytest.approx(rho), 3)


def test_the_checkpoint_of_a_start_is_its_run_s_last_stage_once_done(empty_lab, tmp_path: Path, capsys):
    gate.write_configs(tmp_path / "c")
    initial = EnvConfig.model_validate_json((tmp_path / "c" / "initial.json").read_text())
    create_experiment(empty_lab, name=gate.PREP, arms=[f"static=static:{tmp_path / 'c' / CONFIGS[0]}.json"], seeds=1,
                      config=initial, settings=RunSettings(stages=2, agent_counts=(2, 3, 4, 5)))
    run = experiment_runs(empty_lab, find_experiment(empty_lab, gate.PREP).id)[0]
    with pytest.raises(gate.GateError, match=f"its run {run.id} is active, not done"):
        gate.final_checkpoint(empty_lab, gate.PREP)
    with session(empty_lab) as s:
        for k in (1, 2):
            s.add(Stage(run_id=run.id, index=k, config=initial, status="done", checkpoint=f"{run.uuid}/stage-{k}"))
        stored = s.get(type(run), run.id)
        stored.status = RunStatus.DONE
        s.add(stored)
        s.commit()
    db = str(tmp_path / "lab.db")
    assert envlab(["gate", "checkpoint", gate.PREP, "--db", db]) == 0
    assert capsys.readouterr().out == f"{tmp_path.resolve() / run.uuid}/stage-2\n"
    assert envlab(["gate", "checkpoint", "gate-x", "--db", db]) == 2
    assert capsys.readouterr().err.startswith("envlab gate: checkpoint: no experiment named 'gate-x'")


def finish(engine, *starts: str) -> None:
    """Mark every run of the starts' experiments done, as when the gate has ended."""
    with session(engine) as s:
        for start in starts:
            for run in experiment_runs(engine, find_experiment(engine, f"gate-{start}").id):
                run = s.get(type(run), run.id)
                run.status = RunStatus.DONE
                s.add(run)
        s.commit()


def three_starts(engine, folder: Path, static_dev: dict[str, list[int]]) -> None:
    """weak and tiny as in the moved-best test (C best at weak, A at tiny, each losing by more than the spread to
    the other's); static's dev as given, its validation gains equal (so it loses to nothing)."""
    scripted(engine, folder, "weak", valid={A: [53, 53], B: [54, 56], C: [57, 57]},
             dev={A: [52, 52], B: [55, 56], C: [58, 58]})
    scripted(engine, folder, "tiny", valid={A: [56, 58], B: [54, 54], C: [52, 52]},
             dev={A: [57, 57], B: [54, 55], C: [51, 53]})
    scripted(engine, folder, "static", valid={A: [55, 55], B: [55, 55], C: [55, 55]}, dev=static_dev)


def test_the_study_starts_where_the_best_moves_earliest_and_holds_that_start_s_best(empty_lab, tmp_path: Path):
    three_starts(empty_lab, tmp_path / "c", static_dev={A: [56, 56], B: [55, 55], C: [54, 54]})
    starts = [gate.read_start(empty_lab, n) for n in gate.STARTS]
    with pytest.raises(gate.GateError, match="the gate is not done: starts weak, tiny, static still running"):
        gate.study_choice(starts)
    finish(empty_lab, "weak", "tiny")
    with pytest.raises(gate.GateError, match="^the gate is not done: start static still running or not made$"):
        gate.study_choice([gate.read_start(empty_lab, n) for n in gate.STARTS])
    finish(empty_lab, "static")
    choice = gate.study_choice([gate.read_start(empty_lab, n) for n in gate.STARTS])
    # weak's best (C) and tiny's (A) each lose to the other's there: weak is the earliest start of such a pair
    assert (choice.start, choice.config) == ("weak", C)
    assert choice.why == (f"the best config moves (from weak, tiny's best {A} loses 4.00 points to {C}; from weak, "
                          f"static's best {A} loses 4.00 points to {C}; from tiny, weak's best {C} loses 5.00 points "
                          f"to {A}): weak is the earliest start of such a pair")
    assert choice.spread == pytest.approx((2 / 3) ** 0.5 / 100)
    plain, holm = choice.detectable()
    assert holm > plain > 0
    sd = 2 ** 0.5 * choice.spread
    from lab.study.comparison import detectable
    assert (plain, holm) == (pytest.approx(detectable(sd, 10)), pytest.approx(detectable(sd, 10, alpha=0.05 / 3)))

    lines = gate.study_commands(choice, configs=tmp_path / "c", starts=tmp_path / "starts", out=tmp_path / "study",
                                db="study.db")
    held = tmp_path / "study" / "static.json"
    assert held.read_text() == (tmp_path / "c" / f"{C}.json").read_text()
    assert lines == [
        f"envlab experiment new --name adapt --arms static=static:{held},climb,levels,learnability --seeds 10 "
        f"--stages 3 --instances 1024 --dev-per-size 300 --policy {tmp_path / 'starts' / 'weak'} --scenario default "
        f"--config {held} --agent-counts 2,3,4,5 --validation-agents 3,4,5 --primary valid --match-compute extra "
        "--db study.db",
        "envlab experiment run adapt --workers 2 --threads 1 --benchmark --db study.db",
        f"envlab experiment report adapt --db study.db --out {tmp_path / 'study' / 'report'}"]


def test_where_the_best_moves_nowhere_the_study_starts_where_the_ranking_differs_most(empty_lab, tmp_path: Path):
    # every start's validation gains tie, so no best loses anywhere; static's dev ranking (C, B, A) is the odd one
    for start, dev in (("weak", {A: [57, 57], B: [55, 55], C: [53, 53]}),
                       ("tiny", {A: [57, 57], B: [56, 56], C: [53, 53]}),
                       ("static", {A: [52, 52], B: [55, 55], C: [58, 58]})):
        scripted(empty_lab, tmp_path / "c", start, valid={A: [55, 55], B: [55, 55], C: [55, 55]}, dev=dev)
    finish(empty_lab, *gate.STARTS)
    choice = gate.study_choice([gate.read_start(empty_lab, n) for n in gate.STARTS])
    assert (choice.start, choice.config, choice.spread) == ("static", C, 0.0)
    assert choice.why == ("the best config moves nowhere: static is the start whose ranking differs most from the "
                          "others'")
    lines = gate.study_commands(choice, configs=tmp_path / "c", starts=tmp_path / "s", out=tmp_path / "o", db="d")
    assert f"--policy {tmp_path / 's' / 'static'} " in lines[0]
    tiny = gate.StudyChoice("tiny", A, "", None)
    assert " --policy tiny " in gate.study_commands(tiny, configs=tmp_path / "c", starts=tmp_path / "s",
                                                     out=tmp_path / "o", db="d")[0]


def test_the_gate_s_commands_read_a_copy_and_never_migrate_its_database(empty_lab, tmp_path: Path, capsys):
    """The gate runs on a fixed commit: a database one revision behind stays so after the report and the plan."""
    import sqlite3

    from alembic import command

    from storage.db import alembic_config

    three_starts(empty_lab, tmp_path / "c", static_dev={A: [56, 56], B: [55, 55], C: [54, 54]})
    finish(empty_lab, *gate.STARTS)
    with empty_lab.begin() as connection:
        command.downgrade(alembic_config(connection), "-1")
        behind = connection.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
    empty_lab.dispose()
    db = tmp_path / "lab.db"
    assert envlab(["gate", "report", "--db", str(db), "--out", str(tmp_path / "report")]) == 0
    assert capsys.readouterr().out.startswith("The best config moves: ")
    assert envlab(["gate", "study-plan", "--db", str(db), "--out", str(tmp_path / "study"), "--configs",
                   str(tmp_path / "c"), "--starts", str(tmp_path / "starts")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"start weak, static config {C}: the best config moves (")
    assert out[2] == "4 arms x 10 seeds x 3 stages: 120 trained stages"  # no stage job timed in a scripted gate
    assert out[3].startswith("envlab experiment new --name adapt ") and out[3].endswith(" --db adapt.db")
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT version_num FROM alembic_version").fetchone()[0] == behind
    assert envlab(["gate", "report", "--db", str(tmp_path / "none.db"), "--out", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err.endswith(f"no gate database at {tmp_path / 'none.db'}\n")
