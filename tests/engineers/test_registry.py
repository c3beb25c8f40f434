"""Engineers as objects (lab/engineers/engineer.py): one registration makes an engineer known everywhere the lab
names engineers: the command line's help, the Runs form's choices, the Train tab's switch, an experiment's arms and
the loop's propose job; the registry refuses a name twice and an engineer that repeats itself without saying why."""

from __future__ import annotations

from collections.abc import Iterator

import gradio as gr
import pytest

from envsim.config import EnvConfig
from lab.cli import main as envlab
from lab.context import Evidence, StageResult
from lab.engineers import ENGINEERS, Engineer, EngineerAnswer, answer_of, names, register, unregister
from lab.loop import check_engineer
from lab.pages import web as app
from lab.study.experiments import create_experiment, experiment_runs
from storage.settings import RunSettings

CONFIG = EnvConfig(data_ratio={3: 1.0}, hole_ratio={3: 0.1}, wait_ratio={3: 0.25}, num_instances=8)


def fewer_holes(evidence: Evidence, *, seed: int, **_options) -> EngineerAnswer:
    """Halve every hole ratio of the config in force."""
    current = evidence.current.config
    proposed = current.model_copy(update={"hole_ratio": {s: h / 2 for s, h in current.hole_ratio.items()}})
    return answer_of(proposed, current, "fewer holes: every hole ratio halved")


@pytest.fixture
def scripted() -> Iterator[Engineer]:
    engineer = register(Engineer("fewer-holes", fewer_holes, "the config in force", True,
                                 "it reads only the config in force"))
    yield engineer
    unregister(engineer.name)
    assert "fewer-holes" not in ENGINEERS


def test_one_registration_reaches_the_help_the_page_and_the_experiments(scripted, empty_lab, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps its help at a hyphen too: one line each
    assert names()[-1] == names(alone=True)[-1] == "fewer-holes"
    with pytest.raises(SystemExit):
        envlab(["run", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "evidence, llm, bandit, climb, levels or fewer-holes (default heuristic;" in help_text
    with pytest.raises(SystemExit):
        envlab(["experiment", "new", "--help"])
    assert "bandit, climb, levels, fewer-holes, llm:BACKEND@PRESET" in " ".join(capsys.readouterr().out.split())

    demo = app.build_demo(empty_lab, own_worker=False)
    dropdowns = {b.elem_id or b.label: b for b in demo.blocks.values() if isinstance(b, gr.Dropdown)}
    assert ("fewer-holes", "fewer-holes") in dropdowns["new-engineer"].choices
    assert ("fewer-holes", "fewer-holes") in dropdowns["switch-engineer"].choices

    check_engineer("fewer-holes", "")  # the loop knows it
    experiment = create_experiment(empty_lab, name="holes", arms=["fixed", "fewer-holes"], seeds=1, config=CONFIG,
                                   settings=RunSettings(stages=1))
    assert sorted(r.engineer for r in experiment_runs(empty_lab, experiment.id)) == ["fewer-holes", "fixed"]


def test_the_scripted_engineer_proposes_through_its_object(scripted):
    answer = ENGINEERS["fewer-holes"].propose(Evidence(StageResult(0, CONFIG, {})), seed=0, unused_option=1)
    assert answer.projection.config.hole_ratio == {3: 0.05}
    assert answer.rationale == "fewer holes: every hole ratio halved"


def test_the_registry_refuses_a_name_twice_and_a_repeat_without_a_reason(scripted):
    with pytest.raises(ValueError, match="an engineer named 'fewer-holes' is registered already"):
        register(Engineer("fewer-holes", fewer_holes, "the config in force"))
    with pytest.raises(ValueError, match="engineer 'again' answers the same when asked again: say why"):
        Engineer("again", fewer_holes, "the config in force", same_when_asked_again=True)


def test_every_engineer_says_what_it_reads_and_why_it_repeats_where_it_does():
    assert names() == ["fixed", "random", "heuristic", "learnability", "evidence", "llm", "static", "schedule",
                       "bandit", "climb", "levels"]
    assert all(e.reads for e in ENGINEERS.values())
    assert {n for n, e in ENGINEERS.items() if e.same_when_asked_again} == {
        "fixed", "heuristic", "evidence", "bandit", "static", "schedule"}
    assert [n for n, e in ENGINEERS.items() if not e.alone] == ["static", "schedule"]
