"""The background scripts' shared parts and their refusals: `scripts/fixed-commit.sh` checks a clone out at the
commit asked for, `scripts/snapshot.sh` saves a study's state and restores it on another machine, and
`scripts/study-second-pass.sh` and `scripts/headroom-steps.sh` refuse to start before the headroom screen's report
exists (where no snapshot of the study is there to go on from)."""

from __future__ import annotations

import gzip
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest

from storage.models import Episode, Evaluation, RunStatus, Stage, StageStatus

ROOT = Path(__file__).resolve().parent.parent


def _head() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_fixed_commit_clones_once_and_checks_the_commit_out(tmp_path: Path) -> None:
    work, head = tmp_path / "work", _head()
    first = subprocess.run(["git", "-C", str(ROOT), "rev-list", "--max-parents=0", "HEAD"], capture_output=True,
                           text=True, check=True).stdout.split()[0]
    script = f'source "{ROOT}/scripts/fixed-commit.sh"; fixed_commit "{ROOT}" "{work}" "$1"; ' \
             f'git -C "{work}/src" rev-parse HEAD'
    for commit in (head, first, head):  # cloned the first time, then fetched and checked out again
        done = subprocess.run(["bash", "-c", script, "-", commit], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == commit and (work / "COMMIT").read_text() == f"{commit}\n"
    assert (work / "src" / "scripts" / "fixed-commit.sh").is_file()


@pytest.mark.parametrize(("script", "needs"), [("study-second-pass.sh", "report/report.md"),
                                              ("headroom-steps.sh", "report/gains.csv")])
def test_what_follows_the_screen_waits_for_its_report(tmp_path: Path, script: str, needs: str) -> None:
    (tmp_path / "headroom").mkdir()
    done = subprocess.run(["bash", str(ROOT / "scripts" / script)], capture_output=True, text=True,
                          env={**os.environ, "WORK": str(tmp_path), "SNAPSHOT": str(tmp_path / "no-snapshot")})
    assert done.returncode == 2
    assert done.stderr == (f"the headroom screen in {tmp_path}/headroom is not done (no {needs}): "
                           "bash scripts/headroom-screen.sh\n")
    assert sorted(os.listdir(tmp_path)) == ["headroom"] and os.listdir(tmp_path / "headroom") == []  # nothing made


def _snapshot(*call: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f'source "{ROOT}/scripts/snapshot.sh"; "$@"', "-", *call],
                          capture_output=True, text=True)


def test_a_snapshot_restores_what_the_study_goes_on_from(tmp_path: Path) -> None:
    """Run 1 is done; run 2 has stage 1 done and stage 2 half trained. The snapshot holds the database (without the
    episodes of run 1's stage 1, which no one reads again; its stage 0 is the evaluation later runs copy), run 2's
    stage 1 and the board file; not run 1's checkpoints, nor run 2's stage in progress."""
    work, snap = tmp_path / "second-pass", tmp_path / "repo" / "under-way"
    for stage in ("r1/stage-1/policy", "r1/stage-2/policy", "r2/stage-1/policy", "r2/stage-2/trl/checkpoint-64"):
        (work / "runs" / stage).mkdir(parents=True)
    for policy in ("r1/stage-1/policy", "r1/stage-2/policy", "r2/stage-1/policy"):
        (work / "runs" / policy / "model.safetensors").write_bytes(policy.encode() * 1000)
    (work / "runs" / "r2" / "stage-1" / "trained.json").write_text("{}")
    (work / "runs" / "r2" / "stage-2" / "trl" / "checkpoint-64" / "optimizer.pt").write_bytes(b"half a stage")
    (work / "runs" / "validation.jsonl").write_text('{"board": 1}\n')
    (work / "COMMIT").write_text("9c1d580\n")
    db = work / "second-pass.db"
    with sqlite3.connect(db) as con:  # the columns the save reads, by the lab's own names (checked below)
        con.execute('create table stages (run_id int, "index" int, status text, checkpoint text)')
        con.executemany("insert into stages values (?, ?, ?, ?)", [
            (1, 0, "done", f"{tmp_path}/src/assets/tiny-policy"), (1, 1, "done", "r1/stage-1/policy"),
            (1, 2, "done", "r1/stage-2/policy"), (2, 0, "done", f"{tmp_path}/src/assets/tiny-policy"),
            (2, 1, "done", "r2/stage-1/policy"), (2, 2, "running", None)])
        con.execute("create table runs (id int, status text)")
        con.executemany("insert into runs values (?, ?)", [(1, "done"), (2, "active")])
        con.execute("create table evaluations (run_id int, stage_index int, split text, source_run_id int)")
        con.executemany("insert into evaluations values (?, ?, ?, ?)", [
            (1, 0, "validation", None), (1, 1, "validation", None), (2, 0, "validation", 1)])
        con.execute("create table episodes (id int, run_id int, stage_index int, split text)")
        con.executemany("insert into episodes values (?, ?, ?, ?)", [
            (1, 1, 0, "validation"), (2, 1, 1, "validation"), (3, 2, 0, "validation"), (4, 2, 1, "validation")])
    saved = _snapshot("snapshot_save", str(work), str(db), str(snap))
    assert saved.returncode == 0, saved.stderr
    assert saved.stdout.startswith(f"snapshot of {work} in {snap}: ")
    assert sorted(os.listdir(snap)) == ["COMMIT", "WORK", "runs.tar.gz", "second-pass.db.gz"]  # no temporary left
    assert (snap / "WORK").read_text() == f"{work}\n" and (snap / "COMMIT").read_text() == "9c1d580\n"

    moved = tmp_path / "elsewhere" / "second-pass"  # the database names stage 0's checkpoint by its path
    refused = _snapshot("snapshot_restore", str(snap), str(moved), str(moved / "second-pass.db"))
    assert refused.returncode == 2 and not moved.exists()
    assert refused.stderr == (f"the snapshot in {snap} was taken in {work}, and its database names checkpoints "
                              "there; restore it with WORK set so that the study's folder is that path\n")
    refused = _snapshot("snapshot_restore", str(snap), str(work), str(db))  # never over a study that is there
    assert refused.returncode == 2 and refused.stderr == (f"{db} exists: a study is here already; the snapshot in "
                                                          f"{snap} is not restored over it\n")

    subprocess.run(["rm", "-r", str(work)], check=True)  # a new machine
    restored = _snapshot("snapshot_restore", str(snap), str(work), str(db))
    assert restored.returncode == 0, restored.stderr
    assert restored.stdout == f"restored {work} from the snapshot in {snap} (commit 9c1d580)\n"
    with sqlite3.connect(db) as con:
        assert con.execute('select run_id, "index", checkpoint from stages where "index" = 1').fetchall() == [
            (1, 1, "r1/stage-1/policy"), (2, 1, "r2/stage-1/policy")]
        assert [row[0] for row in con.execute("select id from episodes order by id")] == [1, 3, 4]
    files = sorted(str(p.relative_to(work)) for p in work.rglob("*") if p.is_file())
    assert files == ["runs/r2/stage-1/policy/model.safetensors", "runs/r2/stage-1/trained.json",
                     "runs/validation.jsonl", "second-pass.db"]
    assert (work / "runs" / "r2" / "stage-1" / "policy" / "model.safetensors").read_bytes() == \
        b"r2/stage-1/policy" * 1000
    assert {"run_id", "stage_index", "split"} <= set(Episode.model_fields)
    assert {"run_id", "stage_index", "split", "source_run_id"} <= set(Evaluation.model_fields)
    assert {"run_id", "index", "status", "checkpoint"} <= set(Stage.model_fields)
    assert (RunStatus.DONE, StageStatus.DONE) == ("done", "done")


def _empty_study(tmp_path: Path) -> Path:
    """A study's folder with no run yet: its database (`s.db`, the tables a save reads) and its COMMIT."""
    work = tmp_path / "work"
    (work / "runs").mkdir(parents=True)
    (work / "COMMIT").write_text("9c1d580\n")
    with sqlite3.connect(work / "s.db") as con:
        con.execute('create table stages (run_id int, "index" int, status text, checkpoint text)')
        con.execute("create table runs (id int, status text)")
        con.execute("create table evaluations (run_id int, stage_index int, split text, source_run_id int)")
        con.execute("create table episodes (id int, run_id int, stage_index int, split text)")
    return work


def test_a_study_is_saved_every_so_often_while_it_runs_and_once_after(tmp_path: Path) -> None:
    """`snapshot_every 2 PID ...`: PID (a 3 s sleep) is alive at the first check (2 s), so one save then, and one
    after it ended (checked at about 4 s); a process already gone gets the one save after."""
    work, snap = _empty_study(tmp_path), tmp_path / "snap"
    for lives, saves in ((3, 2), (0, 1)):
        done = subprocess.run(["bash", "-c", f'source "{ROOT}/scripts/snapshot.sh"; sleep {lives} & '
                               f'snapshot_every 2 $! "{work}" "{work}/s.db" "{snap}"'], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert len(lines) == saves and all(line.startswith(f"snapshot of {work} in {snap}: ") for line in lines)
    assert sorted(os.listdir(snap)) == ["COMMIT", "WORK", "runs.tar.gz", "s.db.gz"]


def test_two_saves_at_once_leave_one_whole_snapshot(tmp_path: Path) -> None:
    """The hourly save and a `save` by hand at the same moment: one waits for the other (they write the same
    temporary files), and the snapshot is whole: the database decompresses with nothing after its end."""
    work, snap = _empty_study(tmp_path), tmp_path / "snap"
    with sqlite3.connect(work / "s.db") as con:
        con.execute("alter table episodes add column note text")
        con.executemany("insert into episodes values (?, 1, 0, 'validation', ?)",
                        [(i, f"answer {i} " * 50) for i in range(5000)])  # a database of some size to write
    save = f'snapshot_save "{work}" "{work}/s.db" "{snap}"'
    done = subprocess.run(["bash", "-c", f'source "{ROOT}/scripts/snapshot.sh"; {save} & {save}; wait $!'],
                          capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.count(f"snapshot of {work} in {snap}: ") == 2
    assert sorted(os.listdir(snap)) == ["COMMIT", "WORK", "runs.tar.gz", "s.db.gz"]
    tested = subprocess.run(["gzip", "-t", str(snap / "s.db.gz")], capture_output=True, text=True)
    assert (tested.returncode, tested.stderr) == (0, "")
    copy = tmp_path / "copy.db"
    copy.write_bytes(gzip.decompress((snap / "s.db.gz").read_bytes()))
    with sqlite3.connect(copy) as con:
        assert con.execute("select count(*) from episodes").fetchone() == (5000,)


def test_the_study_script_says_what_is_missing_before_it_starts(tmp_path: Path) -> None:
    """Saving where no study is, and starting without the environment .ci/setup makes: one line each, nothing made."""
    env = {**os.environ, "WORK": str(tmp_path), "SNAPSHOT": str(tmp_path / "snapshot")}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "study-second-pass.sh"), "save"], capture_output=True,
                          text=True, env=env)
    assert (done.returncode, done.stderr) == (2, f"no study in {tmp_path}/second-pass to save\n")
    bare = tmp_path / "checkout"  # a checkout with no .venv
    (bare / "scripts").mkdir(parents=True)
    scripts = ("study-second-pass.sh", "make-example.sh", "gemma-memory.sh")
    for name in (*scripts, "fixed-commit.sh", "snapshot.sh"):
        (bare / "scripts" / name).write_text((ROOT / "scripts" / name).read_text())
    for name in scripts:
        done = subprocess.run(["bash", str(bare / "scripts" / name)], capture_output=True, text=True, env=env)
        assert (done.returncode, done.stderr) == (2, f"no environment in {bare}/.venv: bash .ci/setup first\n"), name
    assert sorted(os.listdir(tmp_path)) == ["checkout"]


def test_the_study_after_the_gate_refuses_to_start_without_a_gate(tmp_path: Path) -> None:
    """`scripts/study-adapt.sh` on a machine with neither a finished gate nor a running one: one line that says which
    command starts the gate, exit 2, and no study made."""
    done = subprocess.run(["bash", str(ROOT / "scripts" / "study-adapt.sh"), _head()], capture_output=True, text=True,
                          env={**os.environ, "WORK": str(tmp_path), "SNAPSHOT": str(tmp_path / "no-snapshot")})
    assert done.returncode == 2
    gate = tmp_path / "gate"
    assert done.stderr.splitlines() == [f"envlab gate: no gate database at {gate}/gate.db",
                                        f"the gate in {gate} is neither done nor running: bash scripts/gate.sh"]
    assert not (tmp_path / "adapt" / "made").exists() and not (tmp_path / "adapt" / "adapt.db").exists()
