"""The command line checks what it is given before it stores anything: a run's settings, and the database's
location. Each refusal is one line on stderr and exit status 2."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

import app
from lab.cli import main
from storage.db import make_engine
from storage.models import Run


def runs_in(db) -> int:
    engine = make_engine(str(db))
    try:
        with engine.connect() as c:
            return c.execute(select(func.count()).select_from(Run)).scalar_one()
    finally:
        engine.dispose()


@pytest.mark.parametrize("flags, message", [
    (["--instances", "0"], "the initial config is not valid: num_instances = 0 is outside 1..100000"),
    (["--grpo", "bogus_field=1"], "settings['grpo'] has 'bogus_field': not GRPOConfig fields"),
    (["--grpo", "num_generations=abc"], "grpo num_generations = 'abc': GRPOConfig's num_generations is of type int"),
    (["--grpo", "output_dir=/srv/elsewhere"], "grpo: sets output_dir: the lab sets these itself"),
    (["--stages", "0"], "stages = 0: a run trains at least 1 stage"),
    (["--lora", "-1"], "lora = -1"),
    (["--probe-boards", "0"], "probe_boards = 0: Input should be greater than or equal to 1"),
    (["--probe-answers", "1"], "probe_answers = 1: Input should be greater than or equal to 2"),
])
def test_envlab_run_checks_every_setting_before_it_stores_the_run(tmp_path, capsys, flags, message):
    db = tmp_path / "envlab.db"
    assert main(["run", "--db", str(db), "--engineer", "fixed", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("envlab run: ") and message in err, err
    assert runs_in(db) == 0


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
        from tests.test_archive_hostile import build_run  # a real file to import, so the database is reached
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
