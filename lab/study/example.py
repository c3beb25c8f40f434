"""The shipped example: a real 3-stage run that a new lab imports on its first start, and the shipped study.

Without it, `envlab serve` on a fresh machine opens a lab where every tab says there is nothing yet, and a
teacher who wants to replay trajectories has to train first. So envlab ships one run, `assets/example-run.zip`
(a run archive, docs/archive.md): the `tiny` policy trained for 3 stages from the round-0 config by the
heuristic engineer, seed 0, with a person's decisions on its proposals, one of each kind, each with its reason.
`scripts/make_example.py` makes it (docs/example.md).

`ensure_example(engine)` imports it into an empty database (`envlab serve` does, unless `--no-example`);
`import_studies(engine)` adds the shipped study's experiments (docs/results/README.md).
"""

from __future__ import annotations

import gzip
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import Engine
from sqlmodel import select

from lab.archive import export_run, import_run
from lab.study.comparison import REPORT_FILES
from lab.study.experiments import experiment_runs, list_experiments, log_dir
from storage.db import make_engine, session, upgrade
from storage.models import Experiment, Run

EXAMPLE = Path(__file__).resolve().parents[2] / "assets" / "example-run.zip"
NAME = "example: tiny policy, heuristic engineer"
DESCRIPTION = ("Example: a real 3-stage run shipped with envlab (assets/example-run.zip, docs/example.md), imported "
               "when the lab first started on an empty database. The tiny policy, the heuristic engineer, seed 0; "
               "one proposal rejected, one edited, two accepted, each with its reason. Its checkpoints are not "
               "shipped: read and replay it; train your own from the Runs tab.")


# ---------------------------------------------------------------- a lab's first start


def ensure_example(engine: Engine, path: str | Path | None = None) -> int | None:
    """Import the example run (`path`, default `EXAMPLE`) into a database that holds no run yet, mark it
    (`settings.example`) and return its id; None when the database holds a run already. Raises
    `lab.archive.ArchiveError` for a missing or unreadable file, or when another process imported it meanwhile
    (the archive refuses a run twice)."""
    with session(engine) as s:
        if s.exec(select(Run.id)).first() is not None:
            return None
    run_id = import_run(engine, EXAMPLE if path is None else path)
    with session(engine) as s:
        run = s.get(Run, run_id)
        run.settings = run.settings.model_copy(update={"example": True})  # a new value: the record is frozen
        s.add(run)
        s.commit()
    return run_id


STUDIES = Path(__file__).resolve().parents[2] / "docs" / "results"  # the shipped study: */study.db.gz


def import_studies(engine: Engine, folder: str | Path = STUDIES,
                   progress: Callable[[int, int], object] | None = None) -> list[int]:
    """Import the experiments of the shipped study (`folder/*/study.db.gz`, docs/results/README.md) with their
    runs, so that a new lab's Compare tab shows what the README shows; returns the new experiments' ids. Each
    run travels as a run archive (new ids here); an experiment appears only once all its runs are in, with its
    runs attached in one transaction, so a page that reads meanwhile never compares a half-imported one.
    `progress(done, total)` after each run, `total` the runs of every shipped database (`envlab serve` draws a bar
    on the command line). The report shipped with an experiment (`shipped_report`) is copied where `envlab
    experiment report` writes one, so the Compare tab links it."""
    made = []
    with tempfile.TemporaryDirectory(prefix="envlab-study-") as scratch:
        studies, shipped = [], sorted(Path(folder).glob("*/study.db.gz"))
        try:  # every shipped database opened first, so `total` counts the runs of all of them
            for k, packed in enumerate(shipped):
                db = Path(scratch) / f"study-{k}.db"
                with gzip.open(packed, "rb") as src, db.open("wb") as dst:
                    shutil.copyfileobj(src, dst)
                study = make_engine(str(db))
                studies.append(study)
                upgrade(study)
            # oldest first over every database, so the newest study is the newest here (the Compare tab opens on it)
            plans = sorted(((p.experiment, packed, study, experiment_runs(study, p.experiment.id))
                            for packed, study in zip(shipped, studies, strict=True) for p in list_experiments(study)),
                           key=lambda plan: plan[0].created_at)
            total, done = sum(len(runs) for *_, runs in plans), 0
            for experiment, packed, study, runs in plans:
                arms = {}
                for run in runs:
                    archive = export_run(study, run.id, Path(scratch) / f"run-{run.id}.zip")
                    arms[import_run(engine, archive)] = run.arm
                    archive.unlink()
                    done += 1
                    if progress is not None:
                        progress(done, total)
                made.append(_attach(engine, experiment, arms))
                _copy_report(shipped_report(packed.parent, experiment.name), engine, made[-1])
        finally:
            for study in studies:
                study.dispose()
    return made


def shipped_report(folder: Path, name: str) -> Path | None:
    """The folder of experiment `name`'s shipped report beside its database in `folder`: `folder/NAME/` (a database
    of several experiments, one report folder each), else `folder` itself when its report.md is that experiment's
    (`envlab experiment ship` writes them side by side); None when neither is."""
    for place in (folder / name, folder):
        report = place / "report.md"
        if not place.resolve().is_relative_to(folder.resolve()) or not report.is_file():
            continue  # a name that leads out of the folder is no report of its
        if report.read_text().split("\n", 1)[0] == f"# Experiment {name}":
            return place
    return None


def _copy_report(source: Path | None, engine: Engine, experiment_id: int) -> None:
    if source is None:
        return
    with session(engine) as s:
        experiment = s.get(Experiment, experiment_id)
    to = log_dir(engine, experiment) / "report"
    to.mkdir(parents=True, exist_ok=True)
    for name in REPORT_FILES.values():
        if (source / name).is_file():
            shutil.copyfile(source / name, to / name)


def _attach(engine: Engine, experiment: Experiment, arms: dict[int, str | None]) -> int:
    """The experiment stored here, its imported runs (`arms`: run id here -> arm) attached in the same commit."""
    with session(engine) as s:
        row = Experiment(**experiment.model_dump(exclude={"id"}))
        s.add(row)
        s.flush()
        for run_id, arm in arms.items():
            mine = s.get(Run, run_id)
            mine.experiment_id, mine.arm = row.id, arm
            s.add(mine)
        s.commit()
        return row.id
