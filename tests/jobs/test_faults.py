"""Faults a lab meets on its own machine: a full disk and a damaged database file are said in one plain line, a job
that meets a full disk goes back to the queue with nothing lost, and the page's worker is started again when it dies
(docs/worker.md, "Faults")."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import event, text

from lab.jobs import worker
from lab.jobs.worker import KeptWorker, WorkerOptions, run_worker, start_worker
from storage import queue
from storage.db import DatabaseDamaged, DatabaseFull, make_engine, session, upgrade
from storage.models import Job

ROOT = Path(__file__).resolve().parents[2]


def _job(engine, job_id: int) -> Job:
    with session(engine) as s:
        return s.get(Job, job_id, populate_existing=True)


@pytest.fixture
def small_disk(tmp_path: Path):
    """A real 8 MiB filesystem (tmpfs), mounted for the test and unmounted after; skipped where mounting is not
    allowed (not root, a container without CAP_SYS_ADMIN)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if shutil.which("mount") is None or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk)],
                                                       capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill(disk: Path) -> Path:
    """Write a file until the disk is full; returns it (delete it to free the disk)."""
    filler = disk / "filler"
    with filler.open("wb") as out:
        try:
            while True:
                out.write(b"\0" * 65536)
                out.flush()
        except OSError as err:
            assert err.errno == errno.ENOSPC
    return filler


def test_a_full_disk_at_a_checkpoint_hands_the_job_back_uncounted_and_the_next_attempt_resumes(small_disk: Path,
                                                                                                  monkeypatch):
    """A real full filesystem: the handler's checkpoint write fails with ENOSPC; the job is handed back (queued, the
    attempt not counted, its first checkpoint kept), the worker returns instead of crashing, and once space is
    freed the next attempt resumes from that checkpoint and finishes."""
    monkeypatch.setattr(worker, "FULL_DISK_WAIT_S", 0.01)
    engine = make_engine(str(small_disk / "envlab.db"))
    upgrade(engine)
    with session(engine) as s:
        job_id = queue.enqueue(s, "stage", {"run_id": 1, "stage_index": 1}).id

    def stage(engine, job, progress) -> dict:
        if job.result:
            progress(2, 2, f"resuming from {job.result['checkpoint']}")
            return {"resumed_from": job.result["checkpoint"], "attempt": job.attempts}
        (small_disk / "checkpoint-1").write_bytes(b"weights")
        progress(1, 2, "saved step 1", result={"checkpoint": "checkpoint-1"})
        filler = _fill(small_disk)
        try:
            (small_disk / "checkpoint-2").write_bytes(b"w" * 1_000_000)
        finally:
            filler.unlink()  # freed before the hand-back is written (the next test writes on a full database)

    # One worker: the first attempt is handed back, the worker waits before its next claim, then resumes the job.
    assert run_worker(engine, {"stage": stage}, WorkerOptions(worker_id="w", poll_s=0.01, once=True)) == 2
    done = _job(engine, job_id)
    assert (done.status, done.attempts, done.result) == ("done", 1, {"resumed_from": "checkpoint-1", "attempt": 1})
    handed = [line for line in done.log_tail.splitlines() if line.startswith("-- handed back")]
    assert len(handed) == 1 and handed[0].startswith(
        "-- handed back at step 1 of 2: the disk is full ([Errno 28] No space left on device")
    assert (small_disk / "checkpoint-1").read_bytes() == b"weights"
    engine.dispose()


def test_a_full_database_at_a_heartbeat_is_handed_back_once_it_can_be_written_and_the_worker_goes_on(
        engine, monkeypatch):
    """Simulated: the database's heartbeat write, then the first two tries of the hand-back, raise
    `DatabaseFull` (monkeypatched; what SQLite's SQLITE_FULL becomes, `test_a_full_sqlite_file_...`). The worker
    does not crash: it tries the hand-back again every `FULL_DISK_WAIT_S` until it is written, waits before its next
    claim, and the job's earlier checkpoint is kept."""
    monkeypatch.setattr(worker, "FULL_DISK_WAIT_S", 0.01)
    with session(engine) as s:
        job_id = queue.enqueue(s, "stage", {}).id
    full = DatabaseFull(errno.ENOSPC, "database or disk is full", "runs/envlab.db")
    real_heartbeat, real_hand_back = queue.heartbeat, queue.hand_back
    tries = []

    def heartbeat(s, job, step, total, line=None, result=None):
        if step == 2 and not tries:
            raise full
        return real_heartbeat(s, job, step, total, line, result)

    def hand_back(s, job, why, **kwargs):
        tries.append(why)
        if len(tries) <= 2:
            raise full
        return real_hand_back(s, job, why, **kwargs)

    monkeypatch.setattr(queue, "heartbeat", heartbeat)
    monkeypatch.setattr(queue, "hand_back", hand_back)

    def stage(engine, job, progress) -> dict:
        progress(1, 3, "saved step 1", result={"checkpoint": "checkpoint-1"})
        progress(2, 3)
        return {"attempt": job.attempts, "from": job.result}

    assert run_worker(engine, {"stage": stage}, WorkerOptions(worker_id="w", poll_s=0.01, once=True)) == 2
    why = ("the disk is full (the disk is full: the database runs/envlab.db could not be written (database or disk "
           "is full); free some space: what was written before is kept)")
    assert tries == [why] * 3
    done = _job(engine, job_id)
    assert (done.status, done.attempts, done.result) == ("done", 1, {"attempt": 1,
                                                                     "from": {"checkpoint": "checkpoint-1"}})
    assert f"-- handed back at step 1 of 3: {why} (the attempt is not counted)" in done.log_tail.splitlines()


def test_a_full_sqlite_file_raises_one_plain_line_naming_it(tmp_path: Path):
    """A real SQLITE_FULL: the file may grow no further (`PRAGMA max_page_count`, SQLite's own bound); the write
    raises `DatabaseFull`, an OSError of ENOSPC, whose message names the file and holds no SQL."""
    path = tmp_path / "envlab.db"
    engine = make_engine(str(path))
    upgrade(engine)
    event.listen(engine, "connect", lambda conn, _: conn.execute("PRAGMA max_page_count = 1"))
    engine.dispose()
    with pytest.raises(DatabaseFull) as raised, session(engine) as s:
        s.exec(text("CREATE TABLE filler (x BLOB)"))
        for _ in range(100):
            s.exec(text("INSERT INTO filler VALUES (zeroblob(100000))"))
    assert raised.value.errno == errno.ENOSPC
    assert str(raised.value) == (f"the disk is full: the database {path} could not be written (database or disk is "
                                 "full); free some space: what was written before is kept")
    engine.dispose()


def _damage(path: Path) -> None:
    with path.open("r+b") as f:
        f.write(b"this is no database at all" * 4)


def test_a_database_damaged_while_the_lab_runs_is_one_line_naming_the_file(tmp_path: Path):
    """A real damaged file: its header overwritten while an engine is open on it. The next query raises
    `DatabaseDamaged`, one line naming the file, no SQL, no parameters, no link; Gradio's error box (the page runs
    with `show_error=True`) shows that line."""
    from gradio.utils import error_payload

    from lab.runs import run_list

    path = tmp_path / "envlab.db"
    engine = make_engine(str(path))
    upgrade(engine)
    assert run_list(engine) == []
    engine.dispose()
    _damage(path)
    with pytest.raises(DatabaseDamaged) as raised:
        run_list(engine)
    said = (f"the database file {path} is damaged (file is not a database): restore it from a copy, or start the lab "
            "on another file (--db, $ENVLAB_DB)")
    assert str(raised.value) == said
    assert error_payload(raised.value, show_error=True)["error"] == said  # what the page's error box shows
    engine.dispose()


def test_the_command_line_and_the_worker_say_a_damaged_database_in_one_line(tmp_path: Path):
    path = tmp_path / "envlab.db"
    engine = make_engine(str(path))
    upgrade(engine)
    engine.dispose()
    _damage(path)
    for command in (["worker", "--once"], ["experiment", "list"]):
        done = subprocess.run([sys.executable, "-m", "lab.cli", *command, "--db", str(path)], capture_output=True,
                              text=True, timeout=120, cwd=ROOT)
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip().splitlines()[-1] == (
            f"envlab {command[0]}: the database file {path} is damaged (file is not a database): restore it from a "
            "copy, or start the lab on another file (--db, $ENVLAB_DB)")
        assert "Traceback" not in done.stderr


def _wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_the_pages_worker_killed_by_sigkill_is_started_again_and_takes_the_next_job(tmp_path: Path, capfd):
    """A real `envlab worker` beside the page (what `envlab serve` starts), killed with SIGKILL: a new one starts,
    said in one line, and it claims the job queued after the death."""
    db = tmp_path / "envlab.db"
    engine = make_engine(str(db))
    upgrade(engine)
    kept = KeptWorker(lambda: start_worker(str(db), options=["--poll", "0.05", "--kinds", "probe", "--nice", "0",
                                                             "--in-process"], die_with_parent=True, own_group=True),
                      poll_s=0.05)
    kept.start()
    first = kept.proc
    try:
        os.kill(first.pid, signal.SIGKILL)
        _wait_for(lambda: kept.proc is not first)
        with session(engine) as s:
            job_id = queue.enqueue(s, "probe", {}).id
        _wait_for(lambda: _job(engine, job_id).status == "failed")  # ran: a probe of no configs fails
        assert _job(engine, job_id).worker.endswith(f":{kept.proc.pid}")
        assert kept.down is None
        assert (f"the lab's worker (pid {first.pid}) was killed by signal SIGKILL: started again (pid "
                f"{kept.proc.pid})") in capfd.readouterr().err
    finally:
        kept.stopping.set()
        kept.join()
        kept.proc.terminate()
        kept.proc.wait(timeout=60)
        engine.dispose()


def test_a_worker_that_keeps_dying_is_left_down_with_one_line_saying_so(monkeypatch, capfd):
    monkeypatch.setattr(worker, "RESTARTS", 2)
    kept = KeptWorker(lambda: subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"]), poll_s=0.02)
    kept.start()
    kept.join(timeout=60)
    assert not kept.is_alive()
    assert kept.down == (f"the lab's worker (pid {kept.proc.pid}) exited with status 3; it died 3 times in 5 min, so "
                         "it is not started again: nothing here runs its jobs; start one with `envlab worker`")
    err = capfd.readouterr().err
    assert err.count("exited with status 3: started again") == 2 and err.count(kept.down) == 1


def test_a_database_on_a_full_filesystem_says_so_in_one_line_on_the_command_line(small_disk: Path):
    """A real full filesystem under the database (an 8 MiB tmpfs filled up): the lab's write fails with
    `DatabaseFull`, and `envlab` prints the one line the command line gives any full disk, exit status 2."""
    db = small_disk / "envlab.db"
    engine = make_engine(str(db))
    upgrade(engine)
    _fill(small_disk)
    with pytest.raises(DatabaseFull) as raised, session(engine) as s:
        for _ in range(100):
            queue.enqueue(s, "probe", {"filler": "x" * 200_000})
    assert str(raised.value) == (f"the disk is full: the database {db} could not be written (database or disk is "
                                 "full); free some space: what was written before is kept")
    engine.dispose()
    done = subprocess.run([sys.executable, "-m", "lab.cli", "experiment", "new", "--name", "full", "--arms", "fixed",
                           "--seeds", "1", "--stages", "1", "--db", str(db)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"envlab experiment: the disk is full writing {db} (database or disk is full): nothing was left half-written; "
        "free some space and run it again")
