"""Held arms: `static:FILE` (one config for every stage) and `schedule:FILE` (a config per stage), read once when the
arm is made, stored with its runs, proposed exactly through the real loop, carried by a run's archive; a bad file is
refused in one line that names it and what is wrong, with nothing stored.

The runs' stage jobs replay scripted answers (tests/recorded.py: real boards, real scores, the real worker, loop and
propose job), so the proposals are the engineers' own, read from the stored evidence.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from pydantic import ValidationError
from sqlmodel import select

from lab import cli
from lab.engineers import ENGINEERS, MAX_HELD_BYTES, names
from lab.loop import LoopError, create_run, switch_engineer
from lab.study.comparison import comparison, report_markdown
from lab.study.experiments import Arm, ExperimentError, add_arms, create_experiment, experiment_runs, find_experiment
from storage.db import make_engine, session, upgrade
from storage.models import Decision, Experiment, Proposal, Run, Stage
from storage.settings import Held, HeldConfigs, RunSettings
from tests.recorded import CONFIG, run_all

BEST = CONFIG.model_copy(update={"data_ratio": {3: 0.25, 4: 0.75}, "hole_ratio": {3: 0.1, 4: 0.3}})
# agents 2 -> 3 -> 4, on boards with room for 4 agents' starts and goals on 3x3
STEPS = [CONFIG.model_copy(update={"hole_ratio": {3: 0.0, 4: 0.2}, "agent_ratio": {k: 1.0}}) for k in (2, 3, 4)]


def as_json(config) -> dict:
    return config.model_dump(mode="json")


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "best.json").write_text(json.dumps(as_json(BEST)))
    (tmp_path / "steps.json").write_text(json.dumps([as_json(c) for c in STEPS]))
    return tmp_path


def test_a_held_arm_reads_its_file_once_named_or_not(files):
    static = HeldConfigs(kind=Held.STATIC, source="best.json", configs=(BEST,))
    schedule = HeldConfigs(kind=Held.SCHEDULE, source="steps.json", configs=tuple(STEPS))
    best, steps = files / "best.json", files / "steps.json"
    assert Arm.parse(f"static:{best}") == Arm(f"static:{best}", "static", held=static)
    assert Arm.parse(f"best=static:{best}") == Arm("best", "static", held=static)
    assert Arm.parse(f"schedule:{steps}") == Arm(f"schedule:{steps}", "schedule", held=schedule)
    assert Arm.parse(f" ramp = schedule:{steps}") == Arm("ramp", "schedule", held=schedule)
    assert Arm.parse(f"best=static:{best}").spec == "static:best.json"
    assert Arm.parse(f"ramp=schedule:{steps}").row()["held"] == {
        "kind": "schedule", "source": "steps.json", "configs": [as_json(c) for c in STEPS]}
    for text in (f"static:{best}", f"ramp=schedule:{steps}", "random", "llm:openai:qwen3-4b@paper-best"):
        arm = Arm.parse(text)
        assert Arm.from_row(json.loads(json.dumps(arm.row()))) == arm  # as the database gives it back
    bad = {**Arm.parse(f"best=static:{best}").row(), "held": {"kind": "static", "source": "best.json", "configs": []}}
    with pytest.raises(ValidationError, match="configs"):
        Arm.from_row(bad)
    assert all(ENGINEERS[h].same_when_asked_again for h in ("static", "schedule"))
    assert not {"static", "schedule"} & set(names(alone=True))  # the Runs page cannot give a run alone a held engineer


def write_bad_files(tmp_path: Path) -> None:
    item = {**as_json(STEPS[1]), "wait_ratio": {"3": 0.25, "4": 1.5}}
    (tmp_path / "big.json").write_text(" " * (MAX_HELD_BYTES - 1) + "{}")
    (tmp_path / "text.json").write_text("{'data_ratio': 1}")
    (tmp_path / "list.json").write_text(json.dumps([as_json(BEST)]))
    (tmp_path / "holes.json").write_text(json.dumps({**as_json(BEST), "hole_ratio": {"3": 0.1, "4": 0.9}}))
    (tmp_path / "item2.json").write_text(json.dumps([as_json(STEPS[0]), item]))
    (tmp_path / "empty.json").write_text("[]")
    (tmp_path / "one.json").write_text(json.dumps(as_json(BEST)))
    (tmp_path / "folder").mkdir()
    (tmp_path / "to-folder").symlink_to(tmp_path / "folder")


# each bad file: the arm's spec and the one line that refuses it ({t}: the folder of `write_bad_files`)
BAD = {
    "missing": ("static:{t}/nothing.json", "{t}/nothing.json: no such file"),
    "directory": ("static:{t}/folder", "{t}/folder: a directory, not a file of configs"),
    "link to a directory": ("schedule:{t}/to-folder",
                            "{t}/to-folder: a directory (it resolves to {t}/folder), not a file of configs"),
    "device": ("static:/dev/null", "/dev/null: not a regular file"),
    "oversized": ("static:{t}/big.json", "{t}/big.json: larger than 256 KiB; a file of configs is far smaller"),
    "not JSON": ("static:{t}/text.json", "{t}/text.json: not JSON (Expecting property name enclosed in double quotes "
                                         "at line 1 column 2)"),
    "static list": ("static:{t}/list.json", "{t}/list.json: a static arm's file holds one config (a JSON object), "
                                            "not a JSON list"),
    "schedule object": ("schedule:{t}/one.json", "{t}/one.json: a schedule arm's file holds a JSON list of configs, "
                                                 "one per stage, not a JSON object"),
    "invalid config": ("static:{t}/holes.json", "{t}/holes.json: hole_ratio[4] = 0.9 is outside 0..0.5"),
    "item 2 invalid": ("schedule:{t}/item2.json", "{t}/item2.json: item 2: wait_ratio[4] = 1.5 is outside 0..1"),
    "empty list": ("schedule:{t}/empty.json", "{t}/empty.json: a schedule arm's file holds a JSON list of configs, "
                                              "one per stage, not an empty list"),
    "no file": ("schedule", "a schedule arm names its file of configs: schedule:FILE"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_file_is_refused_in_one_line_and_nothing_is_stored(tmp_path, capsys, case):
    write_bad_files(tmp_path)
    spec, message = (text.format(t=tmp_path) for text in BAD[case])
    with pytest.raises(ExperimentError) as refused:
        Arm.parse(f"arm={spec}")
    assert str(refused.value) == f"arm 'arm={spec}': {message}"
    db = str(tmp_path / "lab.db")
    assert cli.main(["experiment", "new", "--name", "e", "--arms", f"fixed,arm={spec}", "--db", db]) == 2
    assert capsys.readouterr().err == f"envlab experiment: arm 'arm={spec}': {message}\n"
    engine = make_engine(db)
    with session(engine) as s:
        assert s.exec(select(Experiment)).all() == [] and s.exec(select(Run)).all() == []
    engine.dispose()


def test_the_size_bound_is_on_the_bytes_read(files):
    (files / "edge.json").write_text(json.dumps(as_json(BEST)).ljust(MAX_HELD_BYTES))  # exactly the bound: read
    assert Arm.parse(f"static:{files}/edge.json").held.configs == (BEST,)


def test_a_held_config_must_train_on_the_runs_sizes_and_agent_counts(empty_lab, files):
    other_sizes = BEST.model_copy(update={k: {3: 1.0 if k == "data_ratio" else 0.2} for k in
                                          ("data_ratio", "hole_ratio", "wait_ratio")})
    (files / "three.json").write_text(json.dumps(as_json(other_sizes)))
    settings = RunSettings(stages=2, validation_per_size=30)
    for arm, why in ((f"static:{files}/three.json", "three.json: map sizes 3 differ from the initial config's (3, 4); "
                      "give every size (data_ratio 0 trains none of its boards)"),
                     (f"schedule:{files}/steps.json", "steps.json: item 2: agent count 3 is not one of the runs' "
                      "agent counts (2); --agent-counts sets them")):
        with pytest.raises(ExperimentError) as refused:
            create_experiment(empty_lab, name="e", arms=[arm], seeds=1, settings=settings, config=CONFIG)
        assert str(refused.value) == f"arm {arm!r}: {why}"
    with session(empty_lab) as s:
        assert s.exec(select(Experiment)).all() == [] and s.exec(select(Run)).all() == []


def test_the_loop_proposes_the_held_configs_exactly_and_never_reads_the_file_again(empty_lab, files):
    experiment = create_experiment(
        empty_lab, name="held", arms=[f"best=static:{files}/best.json", f"ramp=schedule:{files}/steps.json"],
        seeds=1, config=CONFIG, settings=RunSettings(stages=4, validation_per_size=30, validation_boards=8,
                                                     agent_counts=(2, 3, 4),
                                                     grpo={"num_generations": 4, "per_device_train_batch_size": 32}))
    for name in ("best.json", "steps.json"):  # moved away: the runs hold their configs
        (files / name).rename(files / f"moved-{name}")
    run_all(empty_lab)
    best, ramp = experiment_runs(empty_lab, experiment.id)
    assert [(r.arm, r.engineer, r.status) for r in (best, ramp)] == [("best", "static", "done"),
                                                                     ("ramp", "schedule", "done")]
    with session(empty_lab) as s:
        def proposals(run):
            return s.exec(select(Proposal).where(Proposal.run_id == run.id).order_by(Proposal.after_stage)).all()

        def stages(run):
            return [st.config for st in s.exec(select(Stage).where(Stage.run_id == run.id).order_by(Stage.index))]

        assert [(p.after_stage, p.engineer, p.rationale, p.error, p.adjustments) for p in proposals(best)] == [
            (k, "static", "held config from best.json", None, []) for k in range(4)]
        assert [p.projected_config for p in proposals(best)] == [BEST] * 4
        assert stages(best) == [CONFIG, BEST, BEST, BEST, BEST]  # stage 0 is every arm's initial config
        assert [(p.rationale, p.error, p.adjustments) for p in proposals(ramp)] == [
            ("schedule item 1 of 3 from steps.json", None, []),
            ("schedule item 2 of 3 from steps.json", None, []),
            ("schedule item 3 of 3 from steps.json", None, []),
            ("schedule item 3 of 3 from steps.json (stage 4: the schedule has ended, its last item repeats)", None,
             [])]
        assert [p.projected_config for p in proposals(ramp)] == [STEPS[0], STEPS[1], STEPS[2], STEPS[2]]
        assert stages(ramp) == [CONFIG, *STEPS, STEPS[2]]
        assert {d.action for d in s.exec(select(Decision))} == {"auto"}
    assert [a.get("held", {}).get("source") for a in find_experiment(empty_lab, "held").arms] == ["best.json",
                                                                                                  "steps.json"]
    assert "Arms: best (static, best.json), ramp (schedule, steps.json, 3 items)." in report_markdown(
        comparison(empty_lab, "held"))


def test_a_held_engineer_cannot_be_given_to_a_run_without_its_configs(empty_lab, files, tmp_path, capsys):
    refused = ("the static engineer proposes the configs of a file, read once when an experiment's arm is made "
               "(envlab experiment new --arms static:FILE); this run holds no configs")
    with session(empty_lab) as s, pytest.raises(LoopError) as err:
        create_run(s, name="alone", config=CONFIG, settings=RunSettings(stages=1), engineer="static")
    assert str(err.value) == refused
    assert cli.main(["run", "--engineer", "static", "--db", str(tmp_path / "cli.db")]) == 2
    assert capsys.readouterr().err == f"envlab run: {refused}\n"
    experiment = create_experiment(empty_lab, name="held", arms=[f"ramp=schedule:{files}/steps.json"], seeds=1,
                                   config=CONFIG, settings=RunSettings(stages=1, agent_counts=(2, 3, 4)))
    (ramp,) = experiment_runs(empty_lab, experiment.id)
    with session(empty_lab) as s:
        plain = create_run(s, name="plain", config=CONFIG, settings=RunSettings(stages=1), engineer="fixed")
    with pytest.raises(LoopError, match="the schedule engineer proposes .* this run holds no configs$"):
        switch_engineer(empty_lab, plain.id, "schedule")
    with pytest.raises(LoopError, match=r"the static engineer .* this run holds a schedule arm's configs from "
                                        r"steps.json$"):
        switch_engineer(empty_lab, ramp.id, "static")
    switch_engineer(empty_lab, ramp.id, "fixed")
    switch_engineer(empty_lab, ramp.id, "schedule")  # back to its own: the configs it holds
    with session(empty_lab) as s:
        assert s.get(Run, ramp.id).engineer == "schedule"


def test_an_added_held_arm_and_a_held_run_that_travels_carry_the_configs(empty_lab, files, tmp_path):
    from lab.archive import export_run, import_run

    experiment = create_experiment(empty_lab, name="grow", arms=["fixed"], seeds=1, config=CONFIG,
                                   settings=RunSettings(stages=1, validation_per_size=30, validation_boards=8,
                                                        grpo={"num_generations": 4,
                                                              "per_device_train_batch_size": 32}))
    with pytest.raises(ExperimentError, match="steps.json: item 2: agent count 3 is not one of the runs' agent"):
        add_arms(empty_lab, "grow", [f"ramp=schedule:{files}/steps.json"])
    (added,) = add_arms(empty_lab, "grow", [f"best=static:{files}/best.json"])
    assert [a["name"] for a in find_experiment(empty_lab, "grow").arms] == ["fixed", "best"]
    run_all(empty_lab)
    with session(empty_lab) as s:
        assert s.exec(select(Proposal).where(Proposal.run_id == added.id)).one().projected_config == BEST
    path = export_run(empty_lab, added.id, tmp_path / "run.zip")
    other = make_engine(str(tmp_path / "other" / "lab.db"))
    upgrade(other)
    with session(other) as s:
        imported = s.get(Run, import_run(other, path))
        assert imported.settings.held_configs == HeldConfigs(kind=Held.STATIC, source="best.json", configs=(BEST,))
    other.dispose()
    assert experiment.id == find_experiment(empty_lab, "grow").id


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_a_named_pipe_is_refused_without_waiting_for_a_writer(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(ExperimentError, match=f"{tmp_path}/pipe: not a regular file$"):
        Arm.parse(f"static:{tmp_path}/pipe")
