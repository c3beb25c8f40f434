"""An experiment made shippable: its SQLite database packed as `<folder>/study.db.gz` (a consistent copy taken
while workers may still write, episodes left out: the report and the Compare tab read the per-size metrics) and its
report written beside it from that packed copy, so the shipped report is what the shipped database gives.
A folder of `docs/results/` holding a `study.db.gz` is imported into every new lab (`lab.study.example`)."""

from __future__ import annotations

import gzip
import shutil
import sqlite3
import tempfile
from pathlib import Path

from sqlalchemy import Engine

from lab.study.comparison import comparison, write_report
from lab.study.experiments import ExperimentError, experiment_runs, find_experiment
from storage.db import make_engine, upgrade
from storage.models import RunStatus

PACKED = "study.db.gz"


def sqlite_file(engine: Engine) -> Path:
    """The file of an SQLite database; any other database is refused (`ExperimentError`), saying so."""
    if engine.url.get_backend_name() != "sqlite" or not engine.url.database or engine.url.database == ":memory:":
        raise ExperimentError(f"only an SQLite database file can be packed, not {engine.url.render_as_string()}: "
                              "copy the experiment into one first (envlab export / import)")
    return Path(engine.url.database)


def pack(source: Path, packed: Path) -> None:
    """`source` (an SQLite file, possibly in use) copied consistently by SQLite's backup, its episodes deleted,
    vacuumed and gzipped to `packed` with no timestamp, so the same database packs to the same bytes."""
    packed.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".pack-", dir=packed.parent) as scratch:
        copy = Path(scratch) / "study.db"
        src, dst = sqlite3.connect(source), sqlite3.connect(copy)
        try:
            src.backup(dst)
            dst.execute("DELETE FROM episodes")
            dst.commit()
            dst.execute("VACUUM")
        finally:
            src.close()
            dst.close()
        partial = Path(scratch) / PACKED
        with copy.open("rb") as raw, gzip.GzipFile(partial, "wb", compresslevel=9, mtime=0) as out:
            shutil.copyfileobj(raw, out)
        partial.replace(packed)  # all or nothing: a shipped file is never half written


def ship(engine: Engine, key: str | int, out: Path, *, partial: bool = False) -> dict[str, Path | str]:
    """Experiment `key` packed into `out` (`study.db.gz`) with its report, the report made from the packed copy.
    Refused while a run has not ended, unless `partial`; returns what was written."""
    experiment = find_experiment(engine, key)
    source = sqlite_file(engine)
    runs = experiment_runs(engine, experiment.id)
    left = [r for r in runs if r.status != RunStatus.DONE]
    if left and not partial:
        raise ExperimentError(f"experiment {experiment.name}: {len(left)} of {len(runs)} runs not done "
                              f"(run {', '.join(str(r.id) for r in left[:5])}{' ...' if len(left) > 5 else ''}): "
                              "run it to its end first, or ship it as it stands with --partial")
    packed = out / PACKED
    pack(source, packed)
    with tempfile.TemporaryDirectory(prefix="envlab-ship-") as scratch:
        db = Path(scratch) / "study.db"
        with gzip.open(packed, "rb") as src, db.open("wb") as dst:
            shutil.copyfileobj(src, dst)
        shipped = make_engine(str(db))
        try:
            upgrade(shipped)  # as `envlab experiment report` does
            written = write_report(comparison(shipped, experiment.name), out)
        finally:
            shipped.dispose()
    return {"database": packed, **written}
