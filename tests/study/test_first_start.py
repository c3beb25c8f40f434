"""A new lab's first start imports the example run and the shipped study (lab/study/example.py); one stopped in the
middle of that import is finished by the next start: exactly the runs, decisions and experiments of a first start
left alone, no run twice. `--no-example` keeps a new lab empty for good.

A start here is `add_example` as `envlab serve` calls it, the study imported in the test's own thread; it is stopped
by raising from the import's progress callback at a chosen number of runs in (as a Ctrl+C would), or by the stop
event `envlab serve` sets when the page ends. One test stops a real `envlab serve` with SIGTERM.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlmodel import select

from lab.pages import web as app
from lab.study import example
from lab.study.example import IMPORTING, import_line, shipped_choice
from storage.db import make_engine, runs_root, session, upgrade
from storage.models import Experiment, Run, Shipped, ShippedChoice
from tests.recorded import counts
from tests.servers import free_port

# The shipped study, imported oldest first: hardstart (5 arms x 6 seeds), defaults (3 x 6), second-pass (5 x 8).
TOTAL = 30 + 18 + 40
ROOT = Path(app.__file__).resolve().parents[2]


class Stop(BaseException):
    """A stop in the middle of a start, as a Ctrl+C: no handler of the lab's catches it."""


def _engine(path: Path):
    engine = make_engine(str(path))
    upgrade(engine)
    return engine


def _picture(engine) -> dict:
    """What a lab holds: every table's row count, every run (uuid, name, arm, its experiment's name), every
    experiment with its runs' uuids, and the shipped reports beside the experiments."""
    with session(engine) as s:
        runs = s.exec(select(Run.uuid, Run.name, Run.arm, Experiment.name).join(
            Experiment, Run.experiment_id == Experiment.id, isouter=True)).all()
        experiments = {e.name: e.id for e in s.exec(select(Experiment))}
    uuids = [uuid for uuid, *_ in runs]
    assert len(uuids) == len(set(uuids))  # no run twice
    members = {name: sorted(u for u, _, _, e in runs if e == name) for name in experiments}
    reports = {name: sorted(p.name for p in (runs_root(engine) / "experiments" / str(i) / "report").iterdir())
               for name, i in experiments.items()}
    return dict(counts=counts(engine), runs=sorted(runs, key=str), experiments=members, reports=reports)


def _start(engine, monkeypatch, stop_at: int | None = None) -> list[tuple[int, int]]:
    """One start of the lab (`add_example`); with `stop_at`, stopped from the progress callback once that many
    of the study's runs are in. Returns the progress calls."""
    calls: list[tuple[int, int]] = []
    real = example.import_studies

    def stopping(engine, progress=None, **kwargs):
        def step(done: int, total: int) -> None:
            calls.append((done, total))
            progress(done, total)
            if done == stop_at:
                raise Stop

        return real(engine, progress=step, **kwargs)

    monkeypatch.setattr(app, "import_studies", stopping)
    if stop_at is None:
        app.add_example(engine)
    else:
        with pytest.raises(Stop):
            app.add_example(engine)
    monkeypatch.undo()
    return calls


@pytest.fixture(scope="module")
def left_alone(tmp_path_factory) -> dict:
    """The picture of a lab whose first start was left alone: the example and the whole shipped study."""
    engine = _engine(tmp_path_factory.mktemp("alone") / "envlab.db")
    assert app.add_example(engine) is None
    picture = _picture(engine)
    assert import_line(engine) == "" and not example.studies_missing(engine)
    engine.dispose()
    # the example, then the three experiments of the shipped study
    assert len(picture["runs"]) == 1 + TOTAL and picture["counts"]["experiments"] == 3
    assert sorted(picture["experiments"]) == ["defaults", "hardstart", "second-pass"]
    return picture


# ---------------------------------------------------------------- stopped, then started again


@pytest.mark.parametrize("stop_at", [
    0,  # the example in, nothing of the study
    30,  # between the first experiment and the second: hardstart whole
    TOTAL - 1,  # inside the last experiment, one run of it missing
    TOTAL,  # every run in and every experiment whole, but the start ended before it wrote so
])
def test_a_first_start_stopped_during_the_import_is_finished_by_the_next(tmp_path: Path, monkeypatch, left_alone,
                                                                          stop_at: int):
    engine = _engine(tmp_path / "envlab.db")
    first = _start(engine, monkeypatch, stop_at=stop_at)
    assert first == [(k, TOTAL) for k in range(stop_at + 1)]
    with session(engine) as s:
        assert len(s.exec(select(Run)).all()) == 1 + stop_at  # whole runs only
        # an experiment is here whole or not at all: those before the stop (and none made by the next start twice)
        whole = {0: 0, 5: 0, 30: 1, TOTAL - 1: 2, TOTAL: 3}[stop_at]
        assert len(s.exec(select(Experiment)).all()) == whole
    assert import_line(engine) == ""  # the import is not under way any more
    assert example.studies_missing(engine)
    again = _start(engine, monkeypatch)
    assert again == [(k, TOTAL) for k in range(stop_at, TOTAL + 1)]  # from where the first start stopped
    assert _picture(engine) == left_alone
    assert not example.studies_missing(engine) and _start(engine, monkeypatch) == []  # a third start reads nothing
    assert _picture(engine) == left_alone
    engine.dispose()


def test_a_lab_stopped_at_every_start_gets_there_start_by_start(tmp_path: Path, monkeypatch, left_alone):
    """Stopped while the example is imported, then with the example in but not yet marked, then inside an
    experiment, between two, inside the last: every start goes on from where the one before stopped."""
    engine = _engine(tmp_path / "envlab.db")
    real = example.import_run

    def broken(engine, path):
        raise Stop  # the example's one transaction never commits

    monkeypatch.setattr(example, "import_run", broken)
    with pytest.raises(Stop):
        app.add_example(engine)
    monkeypatch.undo()
    with session(engine) as s:
        assert s.exec(select(Run)).all() == [] and s.get(Shipped, 1).choice == ShippedChoice.TAKE

    def in_unmarked(engine, path):
        real(engine, path)
        raise Stop  # in, before it is marked as the example

    monkeypatch.setattr(example, "import_run", in_unmarked)
    with pytest.raises(Stop):
        app.add_example(engine)
    monkeypatch.undo()
    with session(engine) as s:
        assert [r.settings.example for r in s.exec(select(Run))] == [False]
    assert _start(engine, monkeypatch, stop_at=17) == [(k, TOTAL) for k in range(18)]
    assert _start(engine, monkeypatch, stop_at=48) == [(k, TOTAL) for k in range(17, 49)]  # defaults whole too
    assert _start(engine, monkeypatch, stop_at=60)[0] == (48, TOTAL)
    assert _start(engine, monkeypatch)[0] == (60, TOTAL)
    assert _picture(engine) == left_alone
    with session(engine) as s:
        example_run = s.exec(select(Run).where(Run.experiment_id.is_(None))).one()
        assert (example_run.id, example_run.name, example_run.settings.example) == (1, example.NAME, True)
    engine.dispose()


def test_serve_stops_the_import_after_the_run_it_is_at_and_says_how_far_it_came(tmp_path: Path, monkeypatch, capsys,
                                                                                 left_alone):
    """`envlab serve` imports the study in a thread beside the page and sets its stop event when the page ends:
    the thread stops at the next run, says so, and the command line and the Compare tab said "importing the
    shipped studies: k of n runs" while it ran, nothing once it stopped or ended; an output that is no terminal
    says it in a line at each tenth of the runs."""
    engine = _engine(tmp_path / "envlab.db")
    stop, lines = threading.Event(), []
    real = example.import_studies

    def watched(engine, progress=None, **kwargs):
        def step(done: int, total: int) -> None:
            lines.append(import_line(engine))
            if done == 20:
                stop.set()  # as `main` does when the page ends
            progress(done, total)

        return real(engine, progress=step, **kwargs)

    monkeypatch.setattr(app, "import_studies", watched)
    thread = app.add_example(engine, beside=True, stop=stop)
    thread.join()
    assert lines == [IMPORTING.format(done=k, total=TOTAL) for k in range(21)]
    assert lines[5] == "importing the shipped studies: 5 of 88 runs"
    said = capsys.readouterr().err
    assert "an empty lab: the example run is run #1" in said
    # not a terminal (a log file): a line at the start and at each tenth of the runs, no bar redrawn in place
    assert [line for line in said.splitlines() if line.startswith("importing")] == [
        IMPORTING.format(done=k, total=TOTAL) for k in (0, 9, 18)]
    assert "\r" not in said
    assert said.endswith("the import of the shipped studies stopped at 20 of 88 runs: the next start imports the "
                         "rest\n")
    assert import_line(engine) == ""
    monkeypatch.undo()
    assert app.add_example(engine, beside=True, stop=threading.Event()).join() is None
    assert capsys.readouterr().err.endswith("the shipped study's 3 experiment(s) are on the Compare tab\n")
    assert _picture(engine) == left_alone and app.add_example(engine, beside=True) is None  # nothing left to do
    engine.dispose()


def test_the_compare_tab_says_how_far_the_import_has_come_while_it_runs(tmp_path: Path):
    from lab.pages.compare import CompareTab
    from lab.runs import lab_version

    engine = _engine(tmp_path / "envlab.db")
    assert shipped_choice(engine) == ShippedChoice.TAKE
    tab = CompareTab(engine, *(object() for _ in range(11)))
    example._record(engine, 45, TOTAL)
    shown = tab.show(None)
    assert shown[tab.summary].startswith("importing the shipped studies: 45 of 88 runs\n\nNo experiment in this lab")
    assert not tab.stale(shown[tab.drawn_at], lab_version(engine))
    example._record(engine, 46, TOTAL)
    assert tab.stale(shown[tab.drawn_at], lab_version(engine))  # the poll redraws it
    example._record(engine, 46, 46)  # ended
    shown = tab.show(None)
    assert shown[tab.summary].startswith("No experiment in this lab")
    engine.dispose()


# ---------------------------------------------------------------- the lab's choice, kept


def test_no_example_keeps_a_new_lab_empty_at_every_later_start(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(app, "build_demo", lambda engine, own_worker=True, kept=None: "the page")
    monkeypatch.setattr(app, "launch", lambda demo, *args, **kwargs: None)
    monkeypatch.setattr(app.signal, "signal", lambda *args: None)
    db, port = tmp_path / "envlab.db", str(free_port())
    assert app.main(["--db", str(db), "--port", port, "--no-worker", "--no-example"]) == 0
    assert app.main(["--db", str(db), "--port", port, "--no-worker"]) == 0  # without it: still empty
    engine = _engine(db)
    with session(engine) as s:
        assert s.exec(select(Run)).all() == [] and s.get(Shipped, 1).choice == ShippedChoice.DECLINE
    assert example.ensure_example(engine) is None and not example.studies_missing(engine)
    engine.dispose()


def test_a_lab_that_takes_them_and_is_started_with_no_example_imports_nothing_then(tmp_path: Path, monkeypatch):
    engine = _engine(tmp_path / "envlab.db")
    assert _start(engine, monkeypatch, stop_at=0) == [(0, TOTAL)]
    monkeypatch.setattr(app, "build_demo", lambda engine, own_worker=True, kept=None: "the page")
    monkeypatch.setattr(app, "launch", lambda demo, *args, **kwargs: None)
    monkeypatch.setattr(app.signal, "signal", lambda *args: None)
    assert app.main(["--db", str(tmp_path / "envlab.db"), "--port", str(free_port()), "--no-worker",
                     "--no-example"]) == 0
    with session(engine) as s:
        assert len(s.exec(select(Run)).all()) == 1 and s.get(Shipped, 1).choice == ShippedChoice.TAKE
    engine.dispose()


# ---------------------------------------------------------------- a real stop


def test_a_real_serve_stopped_with_sigterm_during_the_import_is_finished_by_the_next_start(tmp_path: Path,
                                                                                           monkeypatch, left_alone):
    """`envlab serve` in a process of its own, SIGTERM once some runs of the study are in, as the page starts: it
    hands back (exit 0, saying how far it came, whole runs only), and a start left alone then holds the picture of
    a first start left alone."""
    db, port = tmp_path / "envlab.db", free_port()
    env = {k: v for k, v in os.environ.items() if k != "GRADIO_SERVER_NAME"}
    env.update(PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "lab.cli", "serve", "--no-worker", "--port", str(port), "--db",
                             str(db)], cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        deadline, done = time.monotonic() + 180, 0
        while time.monotonic() < deadline and proc.poll() is None and not 0 < done < TOTAL:
            time.sleep(0.2)
            try:
                engine = make_engine(str(db))
                with session(engine) as s:
                    row = s.get(Shipped, 1)
                    done = row.done if row is not None and row.total else 0
                engine.dispose()
            except Exception:  # noqa: BLE001 - the database is being made
                done = 0
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        if done >= TOTAL:
            pytest.skip("the import ended before it could be stopped on this machine")
        assert done > 0, "no run of the shipped study came in within 180 s"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        said = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stopped = re.search(r"the import of the shipped studies stopped at (\d+) of 88 runs: the next start imports the "
                        r"rest\n", said)
    assert stopped, said[-2000:]
    engine = make_engine(str(db))
    with session(engine) as s:
        assert len(s.exec(select(Run)).all()) == 1 + int(stopped[1]) < 1 + TOTAL  # whole runs, and not all of them
    engine.dispose()
    engine = _engine(db)
    _start(engine, monkeypatch)
    assert _picture(engine) == left_alone
    engine.dispose()
