"""A lab run is one tracker run: Trackio for real on two tiny stages (the worker's child processes, its local files
read back), and what the stage hands W&B, without W&B."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from types import SimpleNamespace

import pytest
from sqlalchemy import Engine
from sqlmodel import select

from envsim.config import EnvConfig
from lab.jobs.worker import InChild, WorkerOptions, child_env, run_worker
from lab.pages.train import train_view
from storage import queue
from storage.db import make_engine, runs_root, session
from storage.models import Job, Run, Stage, TrainingLog
from storage.settings import RunSettings, SettingsError
from training import trackers
from training.stage import WandbOnTheRunsAxis

CONFIG = EnvConfig.default(sizes=(3,), num_instances=8)
GRPO = dict(max_steps=2, num_generations=4, per_device_train_batch_size=8, save_steps=50, report_to=["trackio"])

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _run(engine: Engine, grpo: dict, stages: int = 3) -> Run:
    with session(engine) as s:
        run = Run(name="curriculum", policy="tiny", engineer="fixed", engineer_backend="", seed=7,
                  settings={"stages": stages, "grpo": grpo, "validation_boards": 2})
        s.add(run)
        s.commit()
        for k in range(stages):
            s.add(Stage(run_id=run.id, index=k, config=CONFIG.model_dump(mode="json"), status="queued"))
        s.commit()
        return run


def test_two_stages_log_into_one_trackio_run_on_one_step_axis(empty_lab: Engine, monkeypatch: pytest.MonkeyPatch):
    import trackio  # noqa: F401  (the dev install has it: pyproject's `track` extra; CI runs this for real)

    monkeypatch.delenv(trackers.TRACKIO_DIR_SETTING, raising=False)
    run = _run(empty_lab, GRPO)
    for k in (0, 1, 2):  # stage 0 is evaluated, 1 and 2 train: each in a child process of the worker
        with session(empty_lab) as s:
            queue.enqueue(s, "stage", {"run_id": run.id, "stage_index": k}, run_id=run.id, target=k)
        assert run_worker(empty_lab, {"stage": InChild("training.stage:run_stage_job")},
                          WorkerOptions(poll_s=0.01, once=True)) == 1
    with session(empty_lab) as s:
        jobs = s.exec(select(Job).order_by(Job.id)).all()
        steps = s.exec(select(TrainingLog.stage_index, TrainingLog.step).where(TrainingLog.run_id == run.id)
                       .order_by(TrainingLog.stage_index, TrainingLog.step)).all()
    assert [(j.status, j.error) for j in jobs] == [("done", None)] * 3
    assert steps == [(1, 1), (1, 2), (2, 1), (2, 2)]
    name = f"#{run.id} curriculum ({run.uuid[:8]})"
    assert f"curves to Trackio (files in {runs_root(empty_lab) / 'trackio'}): project lab, run '{name}', stage 2 " \
           "from step 3 of the run's axis" in jobs[2].log_tail

    folder = runs_root(empty_lab) / "trackio"  # the worker's child put Trackio's files under the runs root
    assert sorted(p.name for p in folder.glob("*.db")) == ["lab.db"]  # one project: the lab's database
    with sqlite3.connect(folder / "lab.db") as db:
        rows = db.execute("SELECT run_id, run_name, step, metrics FROM metrics ORDER BY id").fetchall()
        configs = db.execute("SELECT run_name FROM configs").fetchall()
    assert {(run_id, run_name) for run_id, run_name, _, _ in rows} == {(rows[0][0], name)}  # one run, resumed
    assert configs == [(name,)]
    logged = [(step, json.loads(metrics)) for _, _, step, metrics in rows]
    ours = [(step, m) for step, m in logged if "train/stage" in m]
    assert [(step, m["train/global_step"], m["train/stage"], m["train/stage_step"]) for step, m in ours] == [
        (1, 1, 1, 1), (2, 2, 1, 2), (3, 3, 2, 1), (4, 4, 2, 2)]  # stage 2 goes on where stage 1 stopped
    assert all("train/reward" in m and "train/loss" in m for _, m in ours)

    status = train_view(empty_lab, run.id)["status"]
    assert status.endswith(f"`TRACKIO_DIR={folder} trackio show --project lab`")
    assert "Curves in Trackio, run" in status


def test_the_train_tab_names_no_tracker_for_a_run_that_reports_to_none(empty_lab: Engine):
    run = _run(empty_lab, dict(max_steps=2, report_to=["tensorboard"]))
    assert "Trackio" not in train_view(empty_lab, run.id)["status"]
    with session(empty_lab) as s:
        assert trackers.where_to_see(empty_lab, s.get(Run, run.id)) is None


def test_the_project_is_the_databases_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    assert trackers.project(make_engine(str(tmp_path / "curricula.db"))) == "curricula"
    assert trackers.project(make_engine("sqlite://")) == "envlab"
    assert trackers.project(make_engine("postgresql+psycopg://u:p@host/shared_lab")) == "shared_lab"
    engine = make_engine(str(tmp_path / "envlab.db"))
    assert trackers.trackio_dir(engine) == tmp_path.resolve() / "trackio"
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "mine"))
    assert trackers.trackio_dir(engine) == tmp_path / "mine"  # a person's own setting wins
    assert child_env(engine, [])["TRACKIO_DIR"] == str(tmp_path / "mine")
    assert [trackers.reported(r) for r in ("trackio", ["wandb", "trackio"], "all", ["tensorboard"], None)] == [
        ["trackio"], ["trackio", "wandb"], ["trackio", "wandb"], [], []]


def test_wandb_gets_the_runs_id_resumed_offline_without_a_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: no `wandb login`
    tracking = trackers.Tracking(project="envlab", name="#3 curriculum (1f0c9a2e)", run_uuid="1f0c9a2e" * 4,
                                 stage=2, offset=40, root=tmp_path)
    offline = dict(project="envlab", id="1f0c9a2e" * 4, name="#3 curriculum (1f0c9a2e)", resume="allow",
                   dir=str(tmp_path), mode="offline")
    assert tracking.wandb_init({}) == offline
    assert tracking.wandb_init({"WANDB_API_KEY": "k"}) == {**offline, "mode": "online"}
    assert tracking.wandb_init({"WANDB_MODE": "disabled", "WANDB_PROJECT": "p"}) == {**offline, "mode": "disabled",
                                                                                     "project": "p"}
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password k\n")
    (tmp_path / ".netrc").chmod(0o600)
    assert tracking.wandb_init({})["mode"] == "online"

    # transformers' W&B callback, given our step: each of the stage's steps lands at its place on the run's axis
    logged: list[dict] = []
    callback = object.__new__(WandbOnTheRunsAxis)  # no wandb here: a recorder stands in for the module
    callback._wandb = SimpleNamespace(log=logged.append, run=SimpleNamespace(summary={}))
    callback._initialized, callback.tracking = True, tracking
    state = SimpleNamespace(global_step=3, is_world_process_zero=True)
    callback.on_log(None, state, None, logs={"loss": 0.5, "reward": 1.0})
    assert logged == [{"train/loss": 0.5, "train/reward": 1.0, "train/stage_step": 3, "train/stage": 2,
                       "train/global_step": 43}]
    assert state.global_step == 3  # the trainer's own state is left as it was


def test_the_tracker_run_and_project_are_the_labs_not_a_settings_override():
    for field in ("project", "run_name"):
        with pytest.raises(SettingsError, match=field):
            RunSettings.checked(stages=1, grpo={field: "mine"})


def test_a_tracker_the_install_lacks_is_refused_naming_its_extra(monkeypatch: pytest.MonkeyPatch):
    from training import settings as training_settings

    monkeypatch.setattr(training_settings, "installed", lambda package: package != "wandb")
    training_settings.check_packages(RunSettings(stages=1, grpo={"report_to": ["trackio", "tensorboard"]}))
    with pytest.raises(SettingsError, match=r"^grpo report_to = \['wandb'\] needs the wandb package, which is not "
                                            r"installed: pip install 'envlab\[wandb\]'$"):
        training_settings.check_packages(RunSettings(stages=1, grpo={"report_to": ["wandb"]}))
