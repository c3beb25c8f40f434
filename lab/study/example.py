"""The shipped example: a real 3-stage run that a new lab imports on its first start, and the shipped study.

Without it, `envlab serve` on a fresh machine opens a lab where every tab says there is nothing yet, and a
teacher who wants to replay trajectories has to train first. So envlab ships one run, `assets/example-run.zip`
(a run archive, docs/archive.md): the `tiny` policy trained for 3 stages from the round-0 config by the
heuristic engineer, seed 0, with a person's decisions on its proposals, one of each kind, each with its reason.
`scripts/make_example.py` makes it (docs/example.md).

A lab's first `envlab serve` decides whether it takes them (`shipped_choice`: yes on a database that holds no
run, unless `--no-example`) and the lab keeps that choice (`storage.models.Shipped`). A lab that takes them
imports at every start what of them is still missing, matched by the shipped runs' uuids, which an import keeps:
`ensure_example(engine)` the example run, `import_studies(engine)` the shipped study's experiments
(docs/results/README.md), each experiment whole or not at all. A start stopped in the middle of the import leaves
whole runs and whole experiments, and the next start goes on from there; nothing is imported twice.
"""

from __future__ import annotations

import gzip
import hashlib
import shutil
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from sqlalchemy import Engine, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import col, select

from lab.archive import export_run, import_run, read_manifest
from lab.study.comparison import REPORT_FILES
from lab.study.experiments import experiment_runs, list_experiments, log_dir
from storage.db import make_engine, session, upgrade
from storage.models import Experiment, Run, Shipped, ShippedChoice

EXAMPLE = Path(__file__).resolve().parents[2] / "assets" / "example-run.zip"
NAME = "example: tiny policy, 2 to 5 agents, heuristic engineer"
DESCRIPTION = ("Example: a real 3-stage run shipped with envlab (assets/example-run.zip, docs/example.md), imported "
               "when the lab first started on an empty database. The tiny policy on boards of 2 to 5 agents, the "
               "heuristic engineer, seed 0; "
               "one proposal rejected, one edited, two accepted, each with its reason. Its checkpoints are not "
               "shipped: read and replay it; train your own from the Runs tab.")


def said_in(run_id: int) -> str:
    """The line that says a first start brought the example in."""
    return f"an empty lab: the example run is run #{run_id} (--no-example leaves a new lab empty)"


IMPORTING = "importing the shipped studies: {done} of {total} runs"  # the command line's and the Compare tab's


# ---------------------------------------------------------------- a lab's first start


def shipped_choice(engine: Engine, take: bool = True) -> ShippedChoice:
    """The lab's choice about the shipped example and studies: the one stored, else made now and stored, `TAKE`
    when `take` (no `--no-example`) on a database that holds no run, else `DECLINE`. Made once: of two first
    starts at once, the first to store it decides (the row's key)."""
    with session(engine) as s:
        row = s.get(Shipped, 1)
        if row is not None:
            return row.choice
        empty = s.exec(select(Run.id)).first() is None
        choice = ShippedChoice.TAKE if take and empty else ShippedChoice.DECLINE
        s.add(Shipped(choice=choice))
        try:
            s.commit()
        except IntegrityError:
            s.rollback()
            return s.exec(select(Shipped.choice)).one()
    return choice


def ensure_example(engine: Engine, path: str | Path | None = None, take: bool = True) -> int | None:
    """Import the example run (`path`, default `EXAMPLE`) into a lab that takes the shipped runs (`shipped_choice`,
    decided now on a first start) and does not hold it yet (its uuid), mark it (`settings.example`) and return its
    id; None when the lab declined them or holds it already. Raises `lab.archive.ArchiveError` for a missing or
    unreadable file, or when another process imported it meanwhile (the archive refuses a run twice)."""
    if shipped_choice(engine, take) != ShippedChoice.TAKE:
        return None
    path = EXAMPLE if path is None else Path(path)
    uuid = read_manifest(path)["run"]["uuid"]
    with session(engine) as s:
        found = s.exec(select(Run).where(Run.uuid == uuid)).first()
    run_id = import_run(engine, path) if found is None else found.id
    if found is None or not found.settings.example:  # marked in a commit of its own: a stop between is made good
        with session(engine) as s:
            run = s.get(Run, run_id)
            run.settings = run.settings.model_copy(update={"example": True})  # a new value: the record is frozen
            s.add(run)
            s.commit()
    return run_id if found is None else None


STUDIES = Path(__file__).resolve().parents[2] / "docs" / "results"  # the shipped study: */study.db.gz


def studies_digest(folder: str | Path = STUDIES) -> str:
    """A digest of the shipped databases in `folder` (`*/study.db.gz`): names and bytes."""
    digest = hashlib.sha256()
    for packed in sorted(Path(folder).glob("*/study.db.gz")):
        digest.update(f"{packed.relative_to(folder).as_posix()}\0{packed.stat().st_size}\0".encode())
        digest.update(packed.read_bytes())
    return digest.hexdigest()


def studies_missing(engine: Engine, folder: str | Path = STUDIES) -> bool:
    """Whether this start has shipped studies to import: the lab takes them (`shipped_choice`), and its last import
    that ended whole was not of these very files (a first start, a stopped one, or a newer envlab's study)."""
    with session(engine) as s:
        row = s.get(Shipped, 1)
    return row is not None and row.choice == ShippedChoice.TAKE and row.studies != studies_digest(folder)


def import_line(engine: Engine) -> str:
    """"importing the shipped studies: k of n runs" while an import is under way, else ""."""
    with session(engine) as s:
        row = s.get(Shipped, 1)
    return IMPORTING.format(done=row.done, total=row.total) if row is not None and row.done < row.total else ""


def import_studies(engine: Engine, folder: str | Path = STUDIES,
                   progress: Callable[[int, int], object] | None = None) -> list[int]:
    """Import what this lab does not hold yet of the experiments of the shipped study (`folder/*/study.db.gz`,
    docs/results/README.md) with their runs, so that a new lab's Compare tab shows what the README shows; returns
    the ids of the experiments made now. Each run travels as a run archive (new ids here, its uuid kept); a run
    whose uuid is here already is not imported again. An experiment appears only once all its runs are in, with
    its runs attached in one transaction, so a page that reads meanwhile never compares a half-imported one, and
    a stop between leaves runs that the next import attaches. An experiment whose name another experiment here
    holds is left out.

    `progress(done, total)` first, then after each run but the last of its experiment, and once its experiment is
    made: `total` the runs of every shipped experiment this lab takes, `done` those here (`envlab serve` draws a
    bar on the command line; the lab's `Shipped` row says the same to the Compare tab until the import ends, or
    stops: an exception raised by `progress` stops it there). The report shipped with an experiment
    (`shipped_report`) is copied where `envlab experiment report` writes one, so the Compare tab links it. Once
    the import ends, the row keeps the files' digest (`studies_missing`)."""
    made, done = [], 0
    digest = studies_digest(folder)
    with tempfile.TemporaryDirectory(prefix="envlab-study-") as scratch, ExitStack() as opened:
        plans = _plans(Path(folder), Path(scratch), opened)
        with session(engine) as s:
            here = {uuid: (run_id, experiment_id) for uuid, run_id, experiment_id in s.exec(
                select(Run.uuid, Run.id, Run.experiment_id).where(
                    col(Run.uuid).in_([run.uuid for *_, runs in plans for run in runs])))}
            names = set(s.exec(select(Experiment.name)))
        whole = [bool(runs) and all(here.get(run.uuid, (0, None))[1] is not None for run in runs)
                 for *_, runs in plans]
        plans = [(plan, is_whole) for plan, is_whole in zip(plans, whole, strict=True)
                 if is_whole or plan[0].name not in names]  # a name taken here: left out
        total = sum(len(runs) for (*_, runs), _ in plans)
        done = sum(run.uuid in here for (*_, runs), _ in plans for run in runs)

        def step() -> None:
            _record(engine, done, total)
            if progress is not None:
                progress(done, total)

        try:
            step()
            for (experiment, packed, study, runs), is_whole in plans:
                report = shipped_report(packed.parent, experiment.name)
                if is_whole:  # made by an earlier start, which may have stopped before its report was copied
                    _copy_report(report, engine, here[runs[0].uuid][1], over=False)
                    continue
                arms = {here[run.uuid][0]: run.arm for run in runs if run.uuid in here}
                missing = [run for run in runs if run.uuid not in here]
                for k, run in enumerate(missing):
                    archive = export_run(study, run.id, Path(scratch) / f"run-{run.id}.zip")
                    arms[import_run(engine, archive)] = run.arm
                    archive.unlink()
                    done += 1
                    if k < len(missing) - 1:
                        step()
                made.append(_attach(engine, experiment, arms))
                _copy_report(report, engine, made[-1])
                step()
        finally:
            _record(engine, done, done)  # the import is no longer under way
        with session(engine) as s:
            s.exec(update(Shipped).values(studies=digest))
            s.commit()
    return made


def _plans(folder: Path, scratch: Path, opened: ExitStack) -> list[tuple[Experiment, Path, Engine, list[Run]]]:
    """Every experiment of every shipped database (each unpacked into `scratch` and opened, closed by `opened`),
    oldest first over all of them, so the newest study is the newest here (the Compare tab opens on it): the
    experiment, its packed file, its database and its runs."""
    studies = []
    for k, packed in enumerate(sorted(folder.glob("*/study.db.gz"))):
        db = scratch / f"study-{k}.db"
        with gzip.open(packed, "rb") as src, db.open("wb") as dst:
            shutil.copyfileobj(src, dst)
        study = make_engine(str(db))
        opened.callback(study.dispose)
        upgrade(study)
        studies.append((packed, study))
    return sorted(((p.experiment, packed, study, experiment_runs(study, p.experiment.id))
                   for packed, study in studies for p in list_experiments(study)),
                  key=lambda plan: plan[0].created_at)


def _record(engine: Engine, done: int, total: int) -> None:
    """How far the import of the shipped studies has come, in the lab's `Shipped` row (none: nothing recorded)."""
    with session(engine) as s:
        s.exec(update(Shipped).values(done=done, total=total))
        s.commit()


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


def _copy_report(source: Path | None, engine: Engine, experiment_id: int, over: bool = True) -> None:
    """The shipped report where `envlab experiment report` writes the experiment's; without `over`, only where
    no report is yet (one written here since is kept)."""
    if source is None:
        return
    with session(engine) as s:
        experiment = s.get(Experiment, experiment_id)
    to = log_dir(engine, experiment) / "report"
    if to.exists() and not over:
        return
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
