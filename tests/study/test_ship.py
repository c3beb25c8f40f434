"""`envlab experiment ship`: an experiment's database packed as docs/results ships it, its report from that copy,
refused while runs go on, and imported by a new lab as the shipped study is (lab/study/ship.py)."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

from sqlmodel import func, select

from lab import cli
from lab.study.comparison import comparison, summary_rows
from lab.study.example import import_studies
from lab.study.experiments import create_experiment
from storage.db import make_engine, session, upgrade
from storage.models import Episode, Run
from storage.settings import RunSettings
from tests.recorded import CONFIG, scripted_experiment


def _unpacked(packed: Path, to: Path):
    with gzip.open(packed, "rb") as src, to.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    engine = make_engine(str(to))
    upgrade(engine)
    return engine


def _count(engine, what) -> int:
    with session(engine) as s:
        return s.exec(select(func.count()).select_from(what)).one()


def test_a_done_experiment_ships_as_one_folder_that_a_new_lab_imports(empty_lab, tmp_path, capsys):
    scripted_experiment(empty_lab, name="cmp", seeds=2, stages=1)
    db, out = str(tmp_path / "lab.db"), tmp_path / "results" / "cmp"
    assert _count(empty_lab, Episode) == 128  # 4 runs x 2 stages x 8 boards, validation and dev
    assert cli.main(["experiment", "ship", "cmp", "--out", str(out), "--db", db]) == 0
    printed = capsys.readouterr().out
    assert f"database: {out / 'study.db.gz'}" in printed
    assert (f"the report again from what is shipped: gunzip -k {out / 'study.db.gz'} && envlab experiment report cmp "
            f"--db {out / 'study.db'} --out {out}") in printed
    assert {p.name for p in out.iterdir()} == {"study.db.gz", "report.md", "runs.csv", "summary.csv",
                                                "differences.csv", "curves.png"}
    shipped = _unpacked(out / "study.db.gz", tmp_path / "shipped.db")
    assert (_count(shipped, Episode), _count(shipped, Run)) == (0, 4)  # the metrics stay, the episodes do not
    assert summary_rows(comparison(shipped, "cmp")) == summary_rows(comparison(empty_lab, "cmp"))
    assert (out / "report.md").read_text().startswith("# Experiment cmp")
    shipped.dispose()
    first = (out / "study.db.gz").read_bytes()
    assert cli.main(["experiment", "ship", "cmp", "--out", str(out), "--db", db]) == 0
    assert (out / "study.db.gz").read_bytes() == first  # the same database packs to the same bytes
    assert _count(empty_lab, Episode) == 128  # the source keeps everything

    lab = make_engine(str(tmp_path / "new-lab.db"))
    upgrade(lab)
    assert len(import_studies(lab, folder=tmp_path / "results")) == 1
    assert summary_rows(comparison(lab, "cmp")) == summary_rows(comparison(empty_lab, "cmp"))
    lab.dispose()


def test_an_experiment_with_runs_going_on_is_refused_unless_partial(empty_lab, tmp_path, capsys):
    create_experiment(empty_lab, name="going", arms=["fixed"], seeds=2, config=CONFIG,
                      settings=RunSettings(stages=1, validation_boards=8))
    db, out = str(tmp_path / "lab.db"), tmp_path / "going"
    assert cli.main(["experiment", "ship", "going", "--out", str(out), "--db", db]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "experiment going: 2 of 2 runs not done (run 1, 2): run it to its end first, or ship it as it stands with "
        "--partial")
    assert not out.exists()  # nothing written
    assert cli.main(["experiment", "ship", "going", "--out", str(out), "--partial", "--db", db]) == 0
    assert (out / "study.db.gz").is_file() and (out / "report.md").read_text().startswith("# Experiment going")
    assert cli.main(["experiment", "ship", "nothing", "--out", str(out), "--db", db]) == 2
    assert "nothing" in capsys.readouterr().err
