"""The command line checks what it is given before it stores anything: a run's settings, and the database's
location. Each refusal is one line on stderr and exit status 2."""

from __future__ import annotations

import unittest.mock

import pytest
from sqlalchemy import func, select

from lab.cli import main
from lab.pages import web as app
from storage.db import make_engine
from storage.models import Experiment, Run


def runs_in(db, table=Run) -> int:
    if not db.exists():  # refused before the database was opened
        return 0
    engine = make_engine(str(db))
    try:
        with engine.connect() as c:
            return c.execute(select(func.count()).select_from(table)).scalar_one()
    finally:
        engine.dispose()


@pytest.mark.parametrize("flags, message", [
    (["--instances", "0"], "argument --instances: 0 is less than 1: a stage trains on at least 1 board"),
    (["--grpo", "bogus_field=1"], "grpo: bogus_field: not a GRPOConfig field a run may set"),
    (["--grpo", "num_generations=abc"], "grpo num_generations = 'abc': GRPOConfig's num_generations is of type int"),
    (["--grpo", "output_dir=/srv/elsewhere"], "grpo: output_dir: not a GRPOConfig field a run may set"),
    (["--stages", "0"], "argument --stages: 0 is less than 1: a run trains at least 1 stage"),
    (["--lora", "-1"], "argument --lora: -1 is less than 0"),
    (["--probe-boards", "0"], "argument --probe-boards: 0 is less than 1: a probe draws at least 1 board per size"),
    (["--probe-answers", "1"], "argument --probe-answers: 1 is less than 2: a probe samples at least 2 answers per "
                               "board"),
    (["--probe-answers", "65"], "argument --probe-answers: 65 is more than 64: 64 answers per board"),
])
def test_envlab_run_checks_every_setting_before_it_stores_the_run(tmp_path, capsys, flags, message):
    db = tmp_path / "envlab.db"
    assert main(["run", "--db", str(db), "--engineer", "fixed", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("envlab run: ") and message in err, err
    assert runs_in(db) == 0


REFUSED_GRPO = ("not a GRPOConfig field a run may set (a run sets how its policy learns and samples; where its files, "
                "logs and weights go and what code it loads are the lab's: docs/training.md, \"GRPO fields\")")


@pytest.mark.parametrize("pair", [
    "trackio_space_id=attacker-org/leak", "trackio_bucket_id=attacker-org/bucket",
    "trackio_static_space_id=attacker-org/static", "log_completions_hub_repo=attacker-org/completions",
    "vllm_server_base_url=http://attacker.example:8000", "vllm_server_host=attacker.example", "trust_remote_code=true",
    'model_init_kwargs={"trust_remote_code": true}', "push_to_hub=true", "hub_token=hf_stolen",
    "accelerator_config=/dev/zero", "deepspeed=/srv/ds.json", "fsdp_config=/srv/fsdp.json", "output_dir=/srv",
])
def test_a_grpo_field_outside_the_allow_list_is_refused_naming_it(tmp_path, capsys, pair):
    """Beside a tracker the lab keeps on this machine, a field that would send the run's data off it (with this
    machine's Hub token), write or read elsewhere, or load foreign code is refused in one line naming it."""
    db = tmp_path / "envlab.db"
    field = pair.partition("=")[0]
    assert main(["run", "--db", str(db), "--engineer", "fixed", "--grpo", "report_to=trackio", "--grpo", pair]) == 2
    assert capsys.readouterr().err == f"envlab run: grpo: {field}: {REFUSED_GRPO}\n"
    assert runs_in(db) == 0


@pytest.mark.parametrize("value, refused", [
    ('"all"', "'all'"), ('["trackio", "comet_ml"]', "['trackio', 'comet_ml']"), ('"mlflow"', "'mlflow'"),
])
def test_report_to_names_only_trackers_that_keep_their_records_here(tmp_path, capsys, value, refused):
    db = tmp_path / "envlab.db"
    assert main(["run", "--db", str(db), "--engineer", "fixed", "--grpo", f"report_to={value}"]) == 2
    assert capsys.readouterr().err == (f"envlab run: grpo: report_to {refused}: a run reports to none, tensorboard, "
                                       "trackio, wandb only (trackers that keep their records on this machine)\n")
    assert runs_in(db) == 0


def test_the_learning_and_sampling_knobs_a_run_sets_are_grpo_fields_it_may_set():
    """What the docs, the scenarios and the tests set passes, and the allow-list names only GRPOConfig fields (TRL
    renaming one would otherwise leave it refused by name at the stage)."""
    import dataclasses

    from trl import GRPOConfig

    from storage.settings import GRPO_FIELDS, RunSettings
    from training.settings import check_grpo

    knobs = {"learning_rate": 1e-5, "num_generations": 4, "temperature": 0.9, "beta": 0.0, "max_steps": 8,
             "per_device_train_batch_size": 8, "gradient_accumulation_steps": 2, "num_iterations": 1, "epsilon": 0.2,
             "loss_type": "dapo", "scale_rewards": "group", "max_completion_length": 64, "top_p": 0.95, "top_k": 50,
             "seed": 3, "logging_steps": 1, "save_steps": 50, "save_strategy": "no", "save_only_model": True,
             "report_to": ["trackio", "tensorboard"], "lr_scheduler_type": "cosine", "warmup_steps": 2,
             "weight_decay": 0.01, "max_grad_norm": 1.0, "bf16": False, "use_vllm": True, "vllm_mode": "server"}
    settings = RunSettings.checked(stages=1, grpo=knobs)
    assert (settings.grpo, check_grpo(settings, 64, "tiny")) == (knobs, 8)  # as TRL reads them: 8 steps
    assert GRPO_FIELDS - {f.name for f in dataclasses.fields(GRPOConfig)} == set()


@pytest.mark.parametrize("command", [["run", "--stages", "1"], ["export", "1", "--out", "x.zip"], ["import", "x.zip"],
                                     ["worker", "--once"], ["experiment", "list"],
                                     ["experiment", "new", "--name", "n", "--arms", "fixed"], ["serve"]])
@pytest.mark.parametrize("where", ["file-as-folder", "folder-as-file"])
def test_an_unusable_database_location_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, command, where):
    """A folder that cannot hold the file (its parent is a file), or a path that is a folder: SQLite's
    "unable to open database file" and the like, said in one line by every command that opens the database."""
    (tmp_path / "a-file").write_text("not a folder")
    (tmp_path / "a-folder.db").mkdir()
    db = str(tmp_path / "a-file" / "sub" / "envlab.db") if where == "file-as-folder" else str(tmp_path / "a-folder.db")
    monkeypatch.chdir(tmp_path)
    if command == ["import", "x.zip"]:
        from lab.archive import export_run
        from storage.db import upgrade
        from tests.recorded import build_run  # a real file to import, so the database is reached
        source = make_engine(str(tmp_path / "source" / "envlab.db"))
        upgrade(source)
        export_run(source, build_run(source), tmp_path / "x.zip")
        source.dispose()
    if command == ["serve"]:
        rc = app.main(["--db", db, "--no-worker", "--no-example", "--port", "0"])
        prefix = "envlab serve: "
    else:
        try:
            rc = main([*command, "--db", db])
        except SystemExit as exit_:  # `envlab worker` ends with the worker's status
            rc = exit_.code
        prefix = f"envlab {command[0]}: "
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith(prefix) and "cannot be used: " in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("argv, message", [
    (["run", "--stages", "1000000000000"], "argument --stages: 1,000,000,000,000 is more than 1,000: each stage "
                                           "trains and evaluates the policy"),
    (["run", "--stages", "0"], "argument --stages: 0 is less than 1: a run trains at least 1 stage"),
    (["run", "--instances", "100001"], "argument --instances: 100,001 is more than 100,000: a config's "
                                       "num_instances is at most 100,000"),
    (["run", "--validation-boards", "-3"], "argument --validation-boards: -3 is less than 1"),
    (["run", "--validation-per-size", "99999"], "argument --validation-per-size: 99,999 is more than 10,000"),
    (["run", "--lora", "100000"], "argument --lora: 100,000 is more than 4,096: a LoRA rank above a model's width"),
    (["generate", "--n", "100000000000"], "argument --n: 100,000,000,000 is more than 10,000,000: about 10 hours"),
    (["generate", "--n", "-5"], "argument --n: -5 is less than 1: generate at least 1 board"),
    (["generate", "--n", "five"], "argument --n: 'five' is not a whole number"),
    (["bench-suite", "--workers", "1000"], "argument --workers: 1,000 is more than 64: each worker is a process"),
    (["experiment", "new", "--name", "e", "--arms", "fixed", "--seeds", "1000"],
     "argument --seeds: 1,000 is more than 100: every seed is one more run of every arm"),
    (["experiment", "new", "--name", "e", "--arms", "fixed", "--stages", "5000"], "argument --stages: 5,000 is more"),
    (["experiment", "run", "e", "--workers", "0"], "argument --workers: 0 is less than 1: at least 1 worker"),
    (["experiment", "run", "e", "--threads", "99999"], "argument --threads: 99,999 is more than 1,024"),
    (["run", "--seed", "-1"], "argument --seed: -1 is less than 0: numpy's generators take no negative seed"),
    (["run", "--seed", "1.5"], "argument --seed: '1.5' is not a whole number from 0 to 2,147,483,647"),
    (["run", "--seed", "2147483648"], "argument --seed: 2,147,483,648 is more than 2,147,483,647: a run's seed is "
                                      "stored in a 32-bit column"),
])
def test_every_count_has_bounds_that_say_why(tmp_path, capsys, argv, message):
    """Refused by the parser in one line, before anything is read, opened or stored."""
    db = tmp_path / "envlab.db"
    assert main([*argv, *(["--db", str(db)] if argv[0] in ("run", "experiment") else [])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert err.startswith(f"envlab {argv[0]}"), err
    assert not db.exists()


def test_generate_streams_its_boards_and_writes_the_file_whole(tmp_path, capsys):
    """Boards go out as they are made: the first lines of standard output come before the last board is made,
    and a file appears whole at the end (a `.part` beside it meanwhile) with every board once."""
    import envsim.generator as generator
    from lab.cli import boards as cli

    seen: list[int] = []
    real = generator.stratified

    def watched(*args, **kwargs):
        for board in real(*args, **kwargs):
            seen.append(len(capsys.readouterr().out.splitlines()))  # lines written before this board was made
            yield board

    out = tmp_path / "boards.jsonl"
    with unittest.mock.patch.object(generator, "stratified", watched):
        assert main(["generate", "--n", "12", "--seed", "3"]) == 0
    assert seen[0] == 0 and seen[-1] >= 1  # the 12th board was made after the first ones were written
    assert main(["generate", "--n", "12", "--seed", "3", "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert len(lines) == len(set(lines)) == 12 and not out.with_name("boards.jsonl.part").exists()
    assert capsys.readouterr().out.endswith(f"12 boards -> {out}\n")
    assert cli.boards is generator.boards


@pytest.mark.parametrize("argv, message", [
    (["run", "--engineer", "fixed", "--name", "n" * 201], "run name is 201 characters long; at most 200 are stored"),
    (["experiment", "new", "--arms", "fixed", "--name", "e" * 201],
     "experiment name is 201 characters long; at most 200 are stored"),
    (["experiment", "new", "--arms", "fixed", "--name", "e", "--description", "d" * 10_001],
     "experiment description is 10,001 characters long; at most 10,000 are stored"),
    (["experiment", "new", "--arms", "fixed", "--seeds", "2", "--name", "e" * 190],  # "e...e / fixed / seed 1"
     "arm 'fixed': run name is 207 characters long; at most 200 are stored (EXPERIMENT / ARM / seed K): shorten the "
     "experiment's or the arm's name"),
])
def test_a_name_or_description_over_its_bound_is_refused_before_anything_is_stored(tmp_path, capsys, argv, message):
    db = tmp_path / "envlab.db"
    assert main([*argv, "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert err == f"envlab {argv[0]}: {message}\n"
    assert runs_in(db) == runs_in(db, Experiment) == 0


def test_slurm_on_a_sqlite_file_is_refused_naming_postgresql(tmp_path, capsys):
    from lab.cli import main

    db = str(tmp_path / "lab.db")
    new = ["experiment", "new", "--name", "e", "--arms", "fixed", "--seeds", "1", "--stages", "1", "--db", db]
    assert main(new) == 0
    capsys.readouterr()
    assert main(["experiment", "run", "e", "--slurm", "--db", db]) == 2
    assert capsys.readouterr().err.strip() == (
        "envlab experiment: --slurm needs a database every node's tasks can share: PostgreSQL (--db "
        "postgresql+psycopg://user@host/envlab); a SQLite file is not safe there (docs/worker.md)")
