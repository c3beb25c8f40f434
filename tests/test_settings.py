"""A run's settings from one YAML file (`envlab run --settings`, `experiment new --settings`), flags on top, with
the file's line named in a refusal; `--print-settings` writes the file a run used."""

from __future__ import annotations

import importlib.util
import os
import re

import pytest
from sqlmodel import select

from lab.cli import arguments, main
from lab.cli.common import UsageError
from lab.settings import read_settings_file, settings_from_args
from lab.study.comparison import comparison, compute_statement
from storage.db import make_engine, session
from storage.models import Experiment, Run
from storage.settings import GrpoOverrides, RunSettings, SettingsError

FILE = """\
# the settings of a short study
stages: 2
lora: 0
validation_boards: 16
dev_per_size: 6
thinking: "off"
grpo:
  max_steps: 3
  learning_rate: 1.0e-05
"""


def args_of(*flags: str):
    return arguments().parse_args(["run", *flags])


def write(tmp_path, text: str = FILE):
    path = tmp_path / "study.yaml"
    path.write_text(text)
    return path


def test_the_file_gives_every_setting_and_the_flags_go_on_top(tmp_path):
    path = write(tmp_path)
    assert settings_from_args(args_of("--settings", str(path))) == RunSettings(
        stages=2, validation_boards=16, dev_per_size=6, dev_per_seed=True, grpo={"max_steps": 3, "learning_rate": 1e-5})
    flagged = settings_from_args(args_of("--settings", str(path), "--stages", "4", "--grpo", "max_steps=9"),
                                 grpo={"max_steps": 9}, grpo_under={"beta": 0.0, "max_steps": 1})
    assert (flagged.stages, flagged.validation_boards, flagged.grpo) == (
        4, 16, {"beta": 0.0, "max_steps": 9, "learning_rate": 1e-5})  # scenario, then file, then flags
    # no file: the flags' defaults (each seed's dev boards its own: a run made before read the shared ones)
    assert settings_from_args(args_of()) == RunSettings(stages=3, dev_per_size=30, dev_per_seed=True)


def test_print_settings_writes_the_file_a_run_reads_back(tmp_path, capsys):
    path = write(tmp_path)
    db = tmp_path / "lab.db"
    assert main(["run", "--db", str(db), "--settings", str(path), "--completion-length", "40", "--print-settings"]) == 0
    printed = capsys.readouterr().out
    assert not db.exists()  # nothing was made
    again = tmp_path / "printed.yaml"
    again.write_text(printed)
    assert read_settings_file(again).values == {
        "stages": 2, "auto_apply": False, "grpo": {"max_steps": 3, "learning_rate": 1e-5}, "lora": 0,
        "validation_boards": 16, "dev_per_size": 6, "dev_per_seed": True, "remeasure": False, "keep_checkpoints": False,
        "allow_cpu": False,
        "thinking": "off", "completion_length": 40, "validation_decoding": "greedy", "validation_agents": [3, 4, 5]}


@pytest.mark.parametrize("text, flags, message", [
    (FILE.replace("stages: 2", "stages: 0"), [], "study.yaml:2: stages = 0: 0 is less than 1: a run trains at least 1 "
                                                 "stage"),
    (FILE.replace("lora: 0", "lora: -1"), [], "study.yaml:3: lora = -1: -1 is less than 0"),
    (FILE.replace("stages: 2", "stages: 1000000000000000"), [], "study.yaml:2: stages = 1000000000000000: "
                                                                "1,000,000,000,000,000 is more than 1,000: each stage"),
    (FILE.replace("lora: 0", "lora: 1000000000"), [], "study.yaml:3: lora = 1000000000: 1,000,000,000 is more than "
                                                      "4,096: a LoRA rank above a model's width adds nothing"),
    (FILE.replace("dev_per_size: 6", "dev_per_size: 3000000000"), [],
     "study.yaml:5: dev_per_size = 3000000000: 3,000,000,000 is more than 10,000"),
    (FILE + "probe_answers: 1000\n", [], "study.yaml:10: probe_answers = 1000: 1,000 is more than 64"),
    (FILE.replace("thinking: \"off\"", "thinking: maybe"), [], "study.yaml:6: thinking = 'maybe': Input should be"),
    (FILE + "stagez: 3\n", [], "study.yaml:10: 'stagez' is not a run setting (one of agent_counts, allow_cpu"),
    (FILE + "stages: 3\n", [], "study.yaml:10: stages is given twice (first on line 2)"),
    (FILE.replace("max_steps: 3", "max_stepz: 3"), [],
     "study.yaml:8: grpo: max_stepz: not a GRPOConfig field a run may set"),
    (FILE.replace("max_steps: 3", "max_steps: three"), [],
     "study.yaml:8: grpo max_steps = 'three': GRPOConfig's max_steps is of type int"),
    (FILE.replace("grpo:\n  max_steps: 3\n  learning_rate: 1.0e-05\n", "grpo: 3\n"), [],
     "study.yaml:7: grpo is a mapping of GRPOConfig fields"),
    (FILE + "held_configs:\n  kind: static\n  configs: []\n", [], "study.yaml:10: held_configs.source: Field required"),
    ("stages: [2\n", [], "study.yaml:2: not YAML"),
    ("- 2\n", [], "study.yaml:1: a settings file is a mapping of setting: value"),
])
def test_a_bad_file_is_refused_naming_its_line_and_nothing_is_stored(tmp_path, capsys, text, flags, message):
    path = write(tmp_path, text)
    db = tmp_path / "lab.db"
    assert main(["run", "--db", str(db), "--engineer", "fixed", "--settings", str(path), *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"envlab run: {path.parent}/") and message in err, err
    if "GRPOConfig's" not in message:  # what only the training stack checks is checked as the run is stored
        assert not db.exists()  # refused before a database was opened or a child process started
    if db.exists():
        engine = make_engine(str(db))
        with session(engine) as s:
            assert s.exec(select(Run)).all() == []
        engine.dispose()


def test_the_line_is_that_of_the_setting_the_error_is_about_not_of_a_name_in_its_words(tmp_path):
    file = read_settings_file(write(tmp_path))
    said = SettingsError("stages = 2 is fine; lora = 0: ...", "validation_boards")
    assert file.located(said) == f"{file.path}:4: stages = 2 is fine; lora = 0: ..."
    assert file.located(said, flags={"validation_boards"}) == f"{file.path}: stages = 2 is fine; lora = 0: ..."
    refused = SettingsError("grpo learning_rate = 'fast': ...", "grpo.max_steps")
    assert file.located(ValueError("the run cannot be made")) == f"{file.path}: the run cannot be made"
    assert file.located(refused) == f"{file.path}:8: grpo learning_rate = 'fast': ..."
    assert file.located(refused, grpo_flags={"max_steps"}) == f"{file.path}: grpo learning_rate = 'fast': ..."
    try:  # a cause's setting: the training stack's refusal, as the loop and an experiment pass it on
        raise ValueError("grpo max_steps = 'three': ...") from refused
    except ValueError as err:
        assert file.located(err) == f"{file.path}:8: grpo max_steps = 'three': ..."


def test_the_grpo_overrides_the_lab_reads_are_typed_and_those_not_given_are_left_to_trl():
    settings = RunSettings.checked(stages=1, grpo={"temperature": 0.7, "report_to": ["trackio"], "use_vllm": True,
                                                   "vllm_mode": "server", "max_steps": 3})
    assert settings.overrides == GrpoOverrides(temperature=0.7, report_to=["trackio"], use_vllm=True,
                                               vllm_mode="server")
    assert RunSettings.checked(stages=1).overrides == GrpoOverrides(temperature=None, report_to=None, use_vllm=False,
                                                                    vllm_mode=None)


@pytest.mark.parametrize("values, setting", [
    ({"stages": 0}, "stages"),
    ({"stages": 1, "thinking": "maybe"}, "thinking"),
    ({"stages": 1, "held_configs": {"kind": "static", "configs": []}}, "held_configs"),
    ({"stages": 1, "grpo": {"max_stepz": 1, "deepspeed": "/srv/ds.json"}}, "grpo.deepspeed"),
    ({"stages": 1, "grpo": {"report_to": "hub"}}, "grpo.report_to"),
])
def test_a_settings_error_says_its_setting_from_where_pydantic_found_the_problem(values, setting):
    with pytest.raises(SettingsError) as refused:
        RunSettings.checked(**values)
    assert refused.value.setting == setting


def test_a_flag_on_top_of_a_bad_value_wins_and_a_large_file_is_refused(tmp_path):
    path = write(tmp_path, FILE.replace("stages: 2", "stages: 0"))
    assert settings_from_args(args_of("--settings", str(path), "--stages", "1")).stages == 1
    path.write_text("# " + "x" * 70_000)
    with pytest.raises(SettingsError, match=r"study.yaml: more than 65,536 bytes: not a settings file$"):
        settings_from_args(args_of("--settings", str(path)))


def test_a_settings_file_is_a_regular_file_read_within_its_bound(tmp_path, capsys):
    """`stat()` says 0 bytes for a device or a pipe: /dev/zero was read to a MemoryError (2.7 GB) and a FIFO hung the
    command. Each is refused before it is opened, as a link to one is, in one line, and nothing is stored."""
    fifo = tmp_path / "settings.fifo"
    os.mkfifo(fifo)
    (tmp_path / "zero.yaml").symlink_to("/dev/zero")
    (tmp_path / "folder.yaml").mkdir()
    db = tmp_path / "lab.db"
    for path, message in [
        ("/dev/zero", "/dev/zero: not a regular file"),
        (str(fifo), f"{fifo}: not a regular file"),
        (str(tmp_path / "zero.yaml"), f"{tmp_path}/zero.yaml: not a regular file (it resolves to /dev/zero)"),
        (str(tmp_path / "folder.yaml"), f"{tmp_path}/folder.yaml: a directory, not a settings file"),
        (str(tmp_path / "none.yaml"), f"{tmp_path}/none.yaml: no such file"),
    ]:
        assert main(["run", "--db", str(db), "--engineer", "fixed", "--settings", path]) == 2
        assert capsys.readouterr().err == f"envlab run: {message}\n"
    assert not db.exists() or runs_of(db) == []


@pytest.mark.parametrize("text, message", [
    ("stages: " + "[" * 20_000 + "]" * 20_000 + "\n", "study.yaml:1: nested more than 32 levels deep: not a settings "
                                                     "file"),
    ("grpo:\n  max_steps: &n 3\n  save_steps: *n\n", "study.yaml:3: an alias (*n): a settings file writes each value "
                                                    "out"),
    ("base: &b {max_steps: 3}\ngrpo:\n  <<: *b\n", "study.yaml:3: an alias (*b): a settings file writes each value "
                                                  "out"),
    ("stages: 2\ngrpo:\n  max_steps: 3\n  accelerator_config: /dev/zero\n",
     "study.yaml:4: grpo: accelerator_config: not a GRPOConfig field a run may set"),
    ("grpo:\n  deepspeed: /srv/ds.json\n", "study.yaml:2: grpo: deepspeed: not a GRPOConfig field a run may set"),
    ("grpo:\n  fsdp_config: /srv/fsdp.json\n", "study.yaml:2: grpo: fsdp_config: not a GRPOConfig field a run may set"),
    ("grpo:\n  trackio_space_id: attacker-org/leak\n  report_to: trackio\n",
     "study.yaml:2: grpo: trackio_space_id: not a GRPOConfig field a run may set"),
])
def test_a_settings_file_has_no_alias_no_deep_nesting_and_names_no_path(tmp_path, capsys, text, message):
    """20,000 nested brackets were a RecursionError's traceback; an alias repeats a value by reference (a few lines of
    them expand to gigabytes); a GRPO field that names a file (accelerate's, DeepSpeed's or FSDP's config:
    `accelerator_config: /dev/zero` was read to 5.9 GB) is not one a run may set. Each is one line naming the line."""
    path = write(tmp_path, text)
    db = tmp_path / "lab.db"
    assert main(["run", "--db", str(db), "--engineer", "fixed", "--settings", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"envlab run: {path.parent}/{message}") and err.count("\n") == 1, err
    assert "Traceback" not in err and (not db.exists() or runs_of(db) == [])


def runs_of(db) -> list[Run]:
    engine = make_engine(str(db))
    with session(engine) as s:
        runs = s.exec(select(Run)).all()
    engine.dispose()
    return runs


def test_an_experiment_takes_its_runs_settings_from_the_file(tmp_path):
    path = write(tmp_path, FILE.replace("max_steps: 3", "max_steps: 1"))
    db = tmp_path / "lab.db"
    assert main(["experiment", "new", "--name", "filed", "--arms", "fixed", "--seeds", "1", "--instances", "8",
                 "--settings", str(path), "--db", str(db)]) == 0
    engine = make_engine(str(db))
    with session(engine) as s:
        experiment = s.exec(select(Experiment)).one()
        run = s.exec(select(Run)).one()
    engine.dispose()
    assert (experiment.settings.stages, experiment.settings.steps_per_stage, run.settings.validation_boards,
            run.settings.grpo, run.settings.auto_apply) == (2, 1, 16, {"max_steps": 1, "learning_rate": 1e-5}, True)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_a_run_that_needs_a_missing_package_is_refused_when_it_is_made_naming_the_extra(tmp_path, capsys, monkeypatch):
    db = tmp_path / "lab.db"
    assert main(["run", "--db", str(db), "--engineer", "fixed", "--grpo", "use_vllm=true"]) == 2
    assert capsys.readouterr().err == ("envlab run: grpo use_vllm = True (vLLM generation) needs the vllm package, "
                                       "which is not installed: pip install 'envlab[vllm]'\n")
    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else found(name, *a))
    assert main(["experiment", "new", "--name", "e", "--arms", "fixed", "--lora", "8", "--db", str(db)]) == 2
    assert capsys.readouterr().err == ("envlab experiment: lora = 8 (LoRA adapters) needs the peft package, which "
                                       "is not installed: pip install 'envlab[lora]'\n")
    engine = make_engine(str(db))
    with session(engine) as s:
        assert (s.exec(select(Run)).all(), s.exec(select(Experiment)).all()) == ([], [])
    engine.dispose()


def test_agent_counts_come_from_a_flag_or_the_file_checked_and_fewest_first(tmp_path, capsys):
    assert settings_from_args(args_of()).agent_counts is None  # the default: stage 0's counts
    assert settings_from_args(args_of("--agent-counts", "5,2,3,2")).agent_counts == (2, 3, 5)
    path = write(tmp_path, FILE + "agent_counts: [4, 2]\n")
    assert settings_from_args(args_of("--settings", str(path))).agent_counts == (2, 4)
    assert main(["run", "--db", str(tmp_path / "lab.db"), "--settings", str(path), "--print-settings"]) == 0
    assert "agent_counts:\n- 2\n- 4\n" in capsys.readouterr().out
    for flag, message in [("2,9", "agent count 9 is outside 1..8"), ("two", "'two' is not agent counts"),
                          (",", "name at least one agent count (1..8)")]:
        with pytest.raises(UsageError, match=f"argument --agent-counts: {re.escape(message)}"):
            args_of("--agent-counts", flag)
    with pytest.raises(SettingsError, match=r"agent_counts: agent count 0 is outside 1..8"):
        settings_from_args(args_of("--settings", str(write(tmp_path, FILE + "agent_counts: [0]\n"))))


def test_validation_agents_come_from_a_flag_or_the_file_and_an_experiment_carries_them_to_its_runs(tmp_path, capsys):
    assert settings_from_args(args_of()).validation_agents == (3, 4, 5)  # the default: the paper's counts
    assert settings_from_args(args_of("--validation-agents", "5,3,4,3")).validation_agents == (3, 4, 5)
    assert settings_from_args(args_of("--validation-agents", "2")).validation_agents == (2,)  # the first sets
    path = write(tmp_path, FILE + "validation_agents: [3, 2]\n")
    assert settings_from_args(args_of("--settings", str(path))).validation_agents == (2, 3)
    assert main(["run", "--db", str(tmp_path / "lab.db"), "--settings", str(path), "--print-settings"]) == 0
    assert "validation_agents:\n- 2\n- 3\n" in capsys.readouterr().out
    for flag, message in [("2,9", "agent count 9 is outside 1..8"), ("x", "'x' is not agent counts"),
                          ("1,2", "agent count 1: one agent never waits, so its boards cannot meet the wait subsets")]:
        with pytest.raises(UsageError, match=f"argument --validation-agents: {re.escape(message)}"):
            args_of("--validation-agents", flag)
    with pytest.raises(SettingsError, match=r"validation_agents: agent count 1: one agent never waits"):
        settings_from_args(args_of("--settings", str(write(tmp_path, FILE + "validation_agents: [1]\n"))))
    with pytest.raises(SettingsError, match=r"validation_agents: name at least one agent count \(1..8\)"):
        RunSettings.checked(stages=1, validation_agents=())

    db = tmp_path / "exp.db"
    assert main(["experiment", "new", "--name", "paper", "--arms", "fixed", "--seeds", "1", "--instances", "8",
                 "--validation-agents", "3,4,5", "--dev-per-size", "3", "--grpo", "max_steps=1", "--db", str(db)]) == 0
    # 120 per (count, size) on sizes 3..10, 4..10, 5..10: 21 cells; 3 dev boards for each
    assert ("2,520 validation boards (the score) and 63 dev boards (what the engineer reads, each seed its own) per "
            "stage, agents 3-5"
            in capsys.readouterr().out)
    engine = make_engine(str(db))
    with session(engine) as s:
        experiment = s.exec(select(Experiment)).one()
        run = s.exec(select(Run)).one()
    statement = compute_statement(comparison(engine, "paper"))
    engine.dispose()
    assert ("is evaluated on 2,520 validation boards (120 per map size and agent count, agents 3-5 in the set)"
            in statement)
    assert (experiment.settings.validation_agents, experiment.settings.validation_boards,
            experiment.settings.compute()["validation_agents"], run.settings.validation_agents) == (
        (3, 4, 5), 2520, [3, 4, 5], (3, 4, 5))
