"""An experiment end to end through the REAL commands, worker processes and GRPO stage job with the tiny policy:
2 arms x 1 seed, 1 stage of 8 boards and 1 GRPO step, 4 validation boards. `envlab experiment run` is killed
with SIGKILL (its worker with it) once the first stage is done, then run again with two workers, on PostgreSQL:
every run ends done, and no job, episode or proposal exists twice. The report's CSV equals the stored rows.
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from sqlmodel import select

from envsim.config import EnvConfig
from envsim.suite import Split, build_cell, cells, write_jsonl
from lab.cli import main
from lab.study.experiments import benchmark_choices, experiment_runs, find_experiment
from storage.db import make_engine, session
from storage.models import Episode, Job, Proposal, Stage, StageMetric
from tests.processes import alive
from tests.recorded import CONFIG, nothing_lost_nothing_twice, running_stage_1
from training.evaluate import BENCHMARK_FILE

ROOT = Path(__file__).resolve().parents[2]


def command(db: str) -> list[str]:
    return [sys.executable, "-m", "lab.cli", "experiment", "run", "e2e", "--db", db]


def stages_done(engine) -> int:
    with session(engine) as s:
        return len(s.exec(select(Stage).where(Stage.status == "done")).all())


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_an_experiment_through_the_real_workers_is_killed_and_resumed_by_two(db_url: str, tmp_path: Path, capsys):
    """On the real PostgreSQL server: `envlab experiment run` (one worker) killed once a stage is done, then run
    again with `--workers 2`: every run ends done, and no job, evaluation or proposal exists twice however the two
    workers interleave; only a job the kill interrupted was tried twice."""
    db = db_url
    (tmp_path / "config.json").write_text(CONFIG.model_dump_json())
    assert main(["experiment", "new", "--dev-per-size", "3",
                 "--name", "e2e", "--arms", "fixed,heuristic", "--seeds", "1", "--stages", "1",
                 "--config", str(tmp_path / "config.json"), "--validation-per-size", "30", "--validation-boards", "4",
                 "--grpo", "num_generations=2", "--grpo", "per_device_train_batch_size=16", "--db", db]) == 0
    assert "each run: 1 stages x 8 boards x 1 GRPO steps; 4 validation boards" in capsys.readouterr().out
    engine = make_engine(db)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "ENVLAB_RUNS": str(tmp_path / "runs")}
    first = subprocess.Popen(command(db), env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while stages_done(engine) == 0:
        assert first.poll() is None, first.stdout.read().decode()
        assert time.monotonic() < deadline, "no stage finished in 300 s"
        time.sleep(0.2)
    with session(engine) as s:
        pids = {int(j.worker.rpartition(":")[2]) for j in s.exec(select(Job).where(Job.worker.is_not(None)))}
    # its worker claims the oldest run's jobs first, so runs end seed by seed
    assert all(b"--by-run" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\x00") for pid in pids)
    first.send_signal(signal.SIGKILL)
    first.wait()
    # the worker it started dies with it (Linux's parent-death signal)
    gone = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < gone:
        time.sleep(0.1)
    assert pids and not any(alive(pid) for pid in pids)
    killed_at = stages_done(engine)
    assert killed_at < 4  # work was left to do
    with session(engine) as s:
        interrupted = {j.id for j in s.exec(select(Job).where(Job.status == "running"))}
    second = subprocess.run([*command(db), "--workers", "2"], env=env, cwd=tmp_path, capture_output=True, text=True,
                            timeout=600)
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"{killed_at} of 4 stages done already" in second.stdout or f"{killed_at + 1} of 4" in second.stdout
    assert "experiment e2e: 2 of 2 runs done" in second.stdout

    experiment = find_experiment(engine, "e2e")
    runs = experiment_runs(engine, experiment.id)
    jobs = nothing_lost_nothing_twice(engine, runs)
    assert {j.attempts for j in jobs if j.id not in interrupted} == {1}
    assert all((tmp_path / "runs" / r.uuid / "stage-1").is_dir() for r in runs)  # under ENVLAB_RUNS
    with session(engine) as s:
        metrics = s.exec(select(StageMetric).where(StageMetric.split == "validation")).all()
    # equal compute: the trainer took the steps the experiment planned
    assert {j.result["train"]["steps"] for j in jobs if j.kind == "stage" and j.target == 1} == {
        experiment.settings.steps_per_stage} == {1}
    # the seed's stage-0 policy on the same boards for every arm
    rate = {(m.run_id, m.stage_index, m.size): (m.valid, m.episodes) for m in metrics}
    by_arm = {r.arm: r.id for r in runs}
    assert {k[2]: v for k, v in rate.items() if k[:2] == (by_arm["fixed"], 0)} == {
        k[2]: v for k, v in rate.items() if k[:2] == (by_arm["heuristic"], 0)}

    assert main(["experiment", "report", "e2e", "--out", str(tmp_path / "report"), "--db", db]) == 0
    with open(tmp_path / "report" / "runs.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4
    for row in rows:
        mine = [m for m in metrics if (m.run_id, m.stage_index) == (int(row["run_id"]), int(row["stage"]))]
        assert float(row["valid_rate"]) == sum(m.valid for m in mine) / sum(m.episodes for m in mine)
    engine.dispose()


def test_an_llm_arm_over_a_real_server_two_workers_and_the_benchmark(tmp_path: Path, served, capsys,
                                                                     monkeypatch):
    """`llm:openai:…` arm answered by `transformers serve` (a random tiny model: its answers are unusable, so the
    proposal fails and auto-apply keeps the config), `--workers 2`, and `--benchmark` evaluating each run's last
    checkpoint on real benchmark boards (the runs root's cached benchmark file, cut to 6 boards)."""
    base_url, model = served
    monkeypatch.setenv("ENVLAB_ALLOWED_SERVERS", base_url)  # this machine's server (the workers inherit it)
    db = str(tmp_path / "lab.db")
    (tmp_path / "config.json").write_text(CONFIG.model_dump_json())
    entries, *_ = build_cell(replace(cells(Split.BENCHMARK)[0], count=6))  # 3 agents on 3x3 boards
    write_jsonl(entries, tmp_path / BENCHMARK_FILE)
    assert main(["experiment", "new", "--dev-per-size", "3",
                 "--name", "llm", "--arms", f"fixed,eng=llm:openai:{model}@failures-only",
                 "--seeds", "1", "--stages", "1", "--config", str(tmp_path / "config.json"),
                 "--validation-per-size", "30", "--validation-boards", "4", "--grpo", "num_generations=2",
                 "--grpo", "per_device_train_batch_size=16", "--base-url", base_url, "--db", db]) == 0
    capsys.readouterr()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "lab.cli", "experiment", "run", "llm", "--workers", "2",
                           "--benchmark", "--db", db], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "experiment llm: 2 of 2 runs done" in done.stdout

    engine = make_engine(db)
    experiment = find_experiment(engine, "llm")
    runs = {r.arm: r for r in experiment_runs(engine, experiment.id)}
    assert sorted(runs) == ["eng", "fixed"] and {r.status for r in runs.values()} == {"done"}
    assert sorted(p.name for p in (tmp_path / "experiments" / str(experiment.id)).glob("worker-*.log")) == [
        "worker-0.log", "worker-1.log"]
    with session(engine) as s:
        llm_run = runs["eng"]
        assert (llm_run.engineer, llm_run.engineer_backend) == ("llm", f"openai:{model}")
        proposal = s.exec(select(Proposal).where(Proposal.run_id == llm_run.id)).one()
        assert proposal.error.startswith("no usable config after 3 answers: ")
        # asked three times over HTTP: two unusable answers in the conversation, the third kept as the raw answer
        assert proposal.prompt.count("--- assistant ---") == 2 and proposal.raw_answer
        stage1 = s.exec(select(Stage).where(Stage.run_id == llm_run.id, Stage.index == 1)).one()
        assert stage1.config == CONFIG  # auto-apply kept the config in force
        benchmark = s.exec(select(Episode).where(Episode.split == "benchmark")).all()
        jobs = s.exec(select(Job).where(Job.kind == "benchmark")).all()
    # each run's last checkpoint was evaluated once on the 6 boards
    assert Counter((e.run_id, e.stage_index) for e in benchmark) == {(r.id, 1): 6 for r in runs.values()}
    assert sorted(e.instance_id for e in benchmark if e.run_id == llm_run.id) == sorted(
        e.instance.id for e in entries)
    assert [(j.target, j.status) for j in jobs] == [(1, "done"), (1, "done")]
    assert sorted(label for label, _ in benchmark_choices(engine)) == ["exp llm / eng / seed 0, stage 1",
                                                                        "exp llm / fixed / seed 0, stage 1"]
    engine.dispose()


def test_a_learnability_arm_runs_end_to_end_and_trains_half_its_boards_broadly(tmp_path: Path, capsys):
    """One `learnability` run through the real command and worker: stage 0, the propose job probing the grid with
    the tiny policy (1 size x 6 cells x 16 boards x 8 answers), and stage 1 trained on the proposal."""
    from lab.engineers import LEARN_ANSWERS, LEARN_BOARDS, grid

    db = str(tmp_path / "lab.db")
    one_size = EnvConfig(data_ratio={3: 1.0}, hole_ratio={3: 0.2}, wait_ratio={3: 0.25}, num_agents=2, num_instances=8)
    (tmp_path / "config.json").write_text(one_size.model_dump_json())
    assert main(["experiment", "new", "--dev-per-size", "3",
                 "--name", "sfl", "--arms", "learnability", "--seeds", "1", "--stages", "1",
                 "--config", str(tmp_path / "config.json"), "--validation-per-size", "30", "--validation-boards", "4",
                 "--validation-agents", "2",  # 2-agent boards: no benchmark board to hold out, none to build
                 "--grpo", "num_generations=2", "--grpo", "per_device_train_batch_size=16", "--db", db]) == 0
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "lab.cli", "experiment", "run", "sfl", "--db", db], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "experiment sfl: 1 of 1 runs done" in done.stdout
    engine = make_engine(db)
    (run,) = experiment_runs(engine, find_experiment(engine, "sfl").id)
    with session(engine) as s:
        (proposal,) = s.exec(select(Proposal)).all()
        stages = s.exec(select(Stage).where(Stage.run_id == run.id).order_by(Stage.index)).all()
    cells = len(one_size.sizes) * len(grid(2))
    assert proposal.error is None and proposal.engineer == "learnability"
    assert proposal.compute["probes"] == cells == 6
    assert proposal.compute["completions"] == cells * LEARN_BOARDS * LEARN_ANSWERS == 768
    trained = EnvConfig.model_validate(stages[1].config)
    assert [s.status for s in stages] == ["done", "done"] and trained.random_share == 0.5
    assert {(trained.hole_ratio[s], trained.wait_ratio[s]) for s in trained.sizes} <= set(grid(2)) | {(0.2, 0.25)}
    assert proposal.rationale.splitlines()[-1].startswith(f"probe compute: {cells * LEARN_BOARDS * LEARN_ANSWERS} "
                                                          "sampled answers")
    engine.dispose()


def test_a_sigterm_to_the_experiment_command_hands_its_stage_back_and_the_next_run_finishes_it(tmp_path: Path,
                                                                                               capsys):
    """`kill PID` (SIGTERM: `timeout`, a service manager, a person stopping a study) stops `envlab experiment run`
    as Ctrl+C does: its worker hands the stage in hand back to the queue, saved and uncounted, and the command ends
    in one line (status 130). Nothing is left `running` for the stale-heartbeat reaper to find later."""
    db = str(tmp_path / "lab.db")
    (tmp_path / "config.json").write_text(CONFIG.model_dump_json())
    assert main(["experiment", "new", "--dev-per-size", "3", "--validation-agents", "2",
                 "--name", "e2e", "--arms", "fixed", "--seeds", "1", "--stages", "1",
                 "--config", str(tmp_path / "config.json"), "--validation-per-size", "30", "--validation-boards", "8",
                 "--grpo", "num_generations=2", "--grpo", "per_device_train_batch_size=16", "--db", db]) == 0
    capsys.readouterr()
    engine = make_engine(db)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "ENVLAB_RUNS": str(tmp_path / "runs")}
    first = subprocess.Popen(command(db), env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    deadline = time.monotonic() + 300
    while (job := running_stage_1(engine)) is None:
        assert first.poll() is None, first.stdout.read()
        assert time.monotonic() < deadline, "stage 1 never ran"
        time.sleep(0.1)
    first.send_signal(signal.SIGTERM)
    out, _ = first.communicate(timeout=120)
    assert first.returncode == 130, out
    assert "envlab experiment: interrupted" in out
    with session(engine) as s:
        handed = s.get(Job, job.id)
        assert handed.status == "queued" and handed.attempts == 0, (handed.status, handed.attempts, handed.log_tail)
        assert "-- handed back at step " in handed.log_tail
        assert not s.exec(select(Job).where(Job.status == "running")).all()
    second = subprocess.run(command(db), env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "experiment e2e: 1 of 1 runs done" in second.stdout
    jobs = nothing_lost_nothing_twice(engine, experiment_runs(engine, find_experiment(engine, "e2e").id), boards=8)
    assert {j.attempts for j in jobs} == {1}  # the handed-back attempt is not counted
    engine.dispose()
