"""The lab's Slurm path on a real one-node Slurm cluster (tests/conftest.py `slurm_cluster`) and the real PostgreSQL
server: `envlab experiment run NAME --slurm` runs an experiment of 2 arms x 1 seed x 1 tiny stage to its end on the
tasks of a submitit job array; a task scancelled in the middle of a stage hands the stage back and another task
completes it, once. The options' checks need no cluster.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import update
from sqlmodel import select

from lab.cli import main
from lab.pages import train
from lab.pages.compare import compare_view
from lab.study.experiments import experiment_runs, find_experiment
from lab.study.slurm import SlurmError, SlurmJob, SlurmOptions, slurm_options, task_states
from lab.text import as_text
from storage.db import make_engine, session
from storage.models import Job
from storage.settings import RunSettings
from tests.recorded import CONFIG, nothing_lost_nothing_twice, running_stage_1

ROOT = Path(__file__).resolve().parents[2]


def new_experiment(name: str, db: str, tmp_path: Path, *, arms: str, seeds: int, boards: int = 4) -> None:
    (tmp_path / "config.json").write_text(CONFIG.model_dump_json())
    assert main(["experiment", "new", "--dev-per-size", "3", "--validation-agents", "2",
                 "--name", name, "--arms", arms, "--seeds", str(seeds), "--stages", "1",
                 "--config", str(tmp_path / "config.json"), "--validation-per-size", "30", "--validation-boards",
                 str(boards), "--grpo", "num_generations=2", "--grpo", "per_device_train_batch_size=16",
                 "--db", db]) == 0


def lab_env(tmp_path: Path) -> dict[str, str]:
    """The environment of the experiment command and its array tasks. A task that dies is seen from Slurm's own
    record (scontrol), not from its heartbeats going quiet: those are given 5 minutes, as a loaded machine (the
    other test process training beside these) once kept a live stage's beats apart for over 30 s."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "ENVLAB_RUNS": str(tmp_path / "runs"),
            "ENVLAB_STALE_S": "300"}


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_an_experiment_runs_to_its_end_on_a_slurm_job_array(db_url: str, tmp_path: Path, monkeypatch, capsys,
                                                            slurm_cluster):
    monkeypatch.setenv("ENVLAB_RUNS", str(tmp_path / "runs"))
    new_experiment("slurm", db_url, tmp_path, arms="fixed,heuristic", seeds=1)
    capsys.readouterr()
    done = subprocess.run([sys.executable, "-m", "lab.cli", "experiment", "run", "slurm", "--slurm", "--slurm-tasks",
                           "2", "--slurm-idle-exit", "3", "--db", db_url], env=lab_env(tmp_path), cwd=tmp_path,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "experiment slurm: 2 of 2 runs done" in done.stdout
    array = re.search(r"slurm array (\d+): 2 task\(s\)", done.stdout).group(1)

    engine = make_engine(db_url)
    experiment = find_experiment(engine, "slurm")
    runs = experiment_runs(engine, experiment.id)
    jobs = nothing_lost_nothing_twice(engine, runs)
    assert {j.attempts for j in jobs} == {1}
    ran = [SlurmJob.of(j) for j in jobs]
    # every job was run by a task of the one array, on the node, which ended normally once idle
    assert {(s.array, s.node, s.state) for s in ran} == {(array, slurm_cluster.node, "COMPLETED")}
    assert {s.task for s in ran} <= {0, 1}
    assert {s.worker for s in ran} == {j.worker for j in jobs}
    logs = {s.log for s in ran}
    assert all(Path(log).is_file() and f"envlab worker: slurm {array}_" in Path(log).read_text() for log in logs)
    assert all(Path(log).parent == tmp_path / "runs" / "experiments" / str(experiment.id) / "slurm" for log in logs)
    said = "".join(Path(log).read_text() for log in logs)  # each stage ran in a child process of its task
    assert all(f"job {j.id} (stage): child process " in said for j in jobs if j.kind == "stage")
    assert all((tmp_path / "runs" / r.uuid / "stage-1").is_dir() for r in runs)  # the runs root every task read

    assert main(["experiment", "status", "slurm", "--db", db_url]) == 0
    status = capsys.readouterr().out.splitlines()
    assert status[:2] == ["experiment slurm: 2 of 2 runs done, 4 of 4 stages", f"slurm arrays: {array}"]
    stage_lines = [line for line in status if line.startswith("  stage ")]
    assert len(stage_lines) == 4
    by_job = {j.id: j for j in jobs}
    for line in stage_lines:
        job_id = int(re.search(r": job (\d+) done, attempt 1, ", line).group(1))
        assert line.endswith(SlurmJob.of(by_job[job_id]).describe())

    # `envlab worker --slurm`: one task for whatever the lab queues; with nothing queued it exits when idle
    assert main(["worker", "--slurm", "--slurm-idle-exit", "1", "--db", db_url]) == 0
    said = capsys.readouterr().out
    adhoc = re.fullmatch(r"slurm array (\d+): 1 worker task\(s\) \(partition \(default\), 0 GPU\(s\), 1 CPU\(s\), "
                         r"mem \(default\), time 240 min\); they exit after 1 s with nothing to claim; logs in (.+)\n",
                         said)
    assert adhoc and Path(adhoc.group(2)) == tmp_path / "runs" / "slurm", said
    deadline = time.monotonic() + 300
    while (state := task_states([adhoc.group(1)]).get(adhoc.group(1), ("?",))[0]) != "COMPLETED":  # a plain job
        assert time.monotonic() < deadline and state in ("PENDING", "RUNNING", "COMPLETING"), state
        time.sleep(0.5)
    [log] = [p.read_text() for p in (tmp_path / "runs" / "slurm").glob(f"{adhoc.group(1)}_*log.out")]
    assert f"envlab worker: slurm {adhoc.group(1)} on {slurm_cluster.node}, GPUs none" in log
    assert "stopped after 0 jobs" in log

    # the pages: the Train tab's jobs table and the Compare tab's list say the same, stage by stage
    for run in runs:
        rows = train.train_view(engine, run.id)["jobs"]
        assert rows["headers"][-1] == "slurm job"
        mine = {j.id: SlurmJob.of(j) for j in jobs if j.run_id == run.id}
        assert {row[0]: row[-1] for row in rows["data"]} == {
            i: f"{s.key} on {s.node} (COMPLETED); log {s.log}" for i, s in mine.items()}
    links = compare_view(engine, experiment.id)["links"]
    stage_jobs = [j for j in jobs if j.kind == "stage"]
    assert links.count(f"| {array}\\_") == len(stage_jobs) == 4  # shown as text: Markdown's specials escaped
    for j in stage_jobs:
        s = SlurmJob.of(j)
        run = next(r for r in runs if r.id == j.run_id)
        cells = [run.id, run.arm, run.seed, j.target, "done", j.id, s.key, s.node, "COMPLETED", s.log]
        assert "| " + " | ".join(as_text(str(c)) for c in cells) + " |" in links
    engine.dispose()


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_task_scancelled_in_the_middle_of_a_stage_leaves_it_to_another_task(db_url: str, tmp_path: Path,
                                                                             monkeypatch, capsys, slurm_cluster):
    """One run, two array tasks that wait long when idle: the task training stage 1 is scancelled while the stage
    runs; the stage is queued again at once (the task hands it back on SIGTERM) and the other task completes it.
    Every job exists once and ends done; stage 1's first attempt was handed back, not counted; its episodes exist
    once."""
    monkeypatch.setenv("ENVLAB_RUNS", str(tmp_path / "runs"))
    engine = make_engine(db_url)

    def cut(task: SlurmJob, driver: subprocess.Popen) -> None:
        capsys.readouterr()
        slurm_cluster.run("scancel", task.key)
        deadline = time.monotonic() + 600
        while {r.status for r in experiment_runs(engine, find_experiment(engine, "cut").id)} != {"done"}:
            assert driver.poll() is None, driver.stdout.read()
            assert time.monotonic() < deadline, "the run was not completed after the scancel"
            time.sleep(0.5)
        # the experiment is done; the other task waits for work: cancel frees it, and the command ends
        assert main(["experiment", "cancel", "cut", "--db", db_url]) == 0
        assert "scancel sent to slurm array(s) " + task.array in capsys.readouterr().out

    first, job, out = _tasks_hit_in_stage_1("cut", db_url, tmp_path, engine, cut, tasks=2, idle_exit_s=600)
    assert "experiment cut: 1 of 1 runs done" in out
    runs = experiment_runs(engine, find_experiment(engine, "cut").id)
    jobs = nothing_lost_nothing_twice(engine, runs, boards=8)
    stage = next(j for j in jobs if j.kind == "stage" and j.target == 1)
    second = SlurmJob.of(stage)
    assert stage.attempts == 1 and second.array == first.array and second.task != first.task  # handed back: uncounted
    assert "-- handed back at step " in stage.log_tail and "got SIGTERM" in stage.log_tail
    assert {j.attempts for j in jobs if j.id != stage.id} == {1}, [  # else which job was tried again, and why
        (j.id, j.kind, j.target, j.attempts, j.error, (j.log_tail or "")[-1500:]) for j in jobs if j.attempts != 1]
    states = dict(line.split() for line in slurm_cluster.run(
        "squeue", "-h", "-t", "all", "-o", "%i %T", "-j", first.array).stdout.splitlines())
    assert states[first.key] == "CANCELLED"
    engine.dispose()


def _tasks_hit_in_stage_1(name: str, db_url: str, tmp_path: Path, engine,
                          hit: Callable[[SlurmJob, subprocess.Popen], object], *, tasks: int = 1,
                          idle_exit_s: int = 3) -> tuple[SlurmJob, Job, str]:
    """An experiment of one run on `tasks` array tasks: `hit` strikes the task training stage 1 in the middle of
    it; the driver runs on to its end. Gives the task as it was when hit, the stage's job then, and the driver's
    output."""
    new_experiment(name, db_url, tmp_path, arms="fixed", seeds=1, boards=8)
    driver = subprocess.Popen([sys.executable, "-m", "lab.cli", "experiment", "run", name, "--slurm",
                               "--slurm-tasks", str(tasks), "--slurm-idle-exit", str(idle_exit_s), "--db", db_url],
                              env=lab_env(tmp_path), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    try:
        deadline = time.monotonic() + 600
        while (job := running_stage_1(engine)) is None or not job.slurm:
            assert driver.poll() is None, driver.stdout.read()
            assert time.monotonic() < deadline, "stage 1 never ran on a slurm task"
            time.sleep(0.1)
        first = SlurmJob.of(job)
        hit(first, driver)
        out, _ = driver.communicate(timeout=600)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 0, out
    return first, job, out


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_task_killed_without_a_word_is_seen_dead_and_its_stage_runs_again(db_url: str, tmp_path: Path,
                                                                           monkeypatch, capsys, slurm_cluster):
    """One run, one array task: the task's worker is SIGKILLed in the middle of stage 1 (as the kernel's OOM killer
    or a lost node ends it: no signal handler runs). The command reads the task's end from scontrol, hands the stage
    back, and, with no task left, submits another array, whose task completes the stage, once."""
    monkeypatch.setenv("ENVLAB_RUNS", str(tmp_path / "runs"))
    engine = make_engine(db_url)
    first, job, out = _tasks_hit_in_stage_1(
        "kill", db_url, tmp_path, engine, lambda task, _: os.kill(int(task.worker.rpartition(":")[2]), signal.SIGKILL))
    assert f"job {job.id}: its slurm job died; queued again for another task" in out
    assert "experiment kill: 1 of 1 runs done" in out
    runs = experiment_runs(engine, find_experiment(engine, "kill").id)
    jobs = nothing_lost_nothing_twice(engine, runs, boards=8)
    stage = next(j for j in jobs if j.id == job.id)
    second = SlurmJob.of(stage)
    assert stage.attempts == 2 and second.array != first.array
    assert f"ended failed: slurm job {first.key} on {first.node} ended FAILED" in stage.log_tail
    engine.dispose()


@pytest.mark.skipif(os.environ.get("ENVLAB_SLURM_REQUEUE") != "1",
                    reason="Slurm holds a requeued job about 2 minutes before it starts again: ENVLAB_SLURM_REQUEUE=1")
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_preempted_task_hands_its_stage_back_and_requeues_itself(db_url: str, tmp_path: Path, monkeypatch,
                                                                   slurm_cluster):
    """One run, one array task: submitit's signal (USR2, what Slurm sends before the time limit, or on preemption
    where the cluster says so) reaches the task in the middle of stage 1. The checkpointing hook hands the stage
    back, submitit requeues the task, and the same array task, started again, completes the stage, once."""
    monkeypatch.setenv("ENVLAB_RUNS", str(tmp_path / "runs"))
    engine = make_engine(db_url)
    first, job, out = _tasks_hit_in_stage_1("preempt", db_url, tmp_path, engine,
                                            lambda task, _: slurm_cluster.run("scancel", "--signal=USR2", task.key))
    assert "experiment preempt: 1 of 1 runs done" in out
    runs = experiment_runs(engine, find_experiment(engine, "preempt").id)
    jobs = nothing_lost_nothing_twice(engine, runs, boards=8)
    stage = next(j for j in jobs if j.id == job.id)
    second = SlurmJob.of(stage)
    assert stage.attempts == 1 and (second.key, first.restarts, second.restarts) == (first.key, 0, 1)  # uncounted
    assert first.task == -1 and first.key == first.array  # one task: submitit submits a plain job
    assert "slurm job reached its time limit or was preempted; requeued (the attempt is not counted)" in stage.log_tail
    assert "Requeued job" in Path(first.log).read_text()  # submitit's own line
    engine.dispose()


def _jobs(engine) -> list[Job]:
    with session(engine) as s:
        return list(s.exec(select(Job)))


def test_the_benchmark_measures_one_and_two_array_tasks_side_by_side(slurm_cluster, tmp_path: Path):
    """benchmarks/bench_slurm.py at its tiniest (one run of one tiny stage per measurement) on the test cluster."""
    done = subprocess.run([sys.executable, "benchmarks/bench_slurm.py", "--quick", "--arms", "fixed", "--seeds", "1"],
                          cwd=ROOT, env={**lab_env(tmp_path), "ENVLAB_BENCH_ROOT": str(tmp_path)},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("experiment: arms fixed, 1 seeds, 1 stages of 8 boards")
    one, two = (re.fullmatch(rf"{n} array task\(s\): +([0-9.]+) runs/hour \(1 runs in [0-9]+ s\)", line)
                for n, line in ((1, lines[1]), (2, lines[2])))
    assert one and two and float(one.group(1)) > 0 and float(two.group(1)) > 0
    ratio = re.fullmatch(r"ratio 2 tasks / 1 task: ([0-9.]+)x", lines[3])
    assert ratio and float(ratio.group(1)) == pytest.approx(float(two.group(1)) / float(one.group(1)), abs=0.02)


# ---------------------------------------------------------------- options, no cluster needed


def test_options_come_from_the_flags_over_the_settings_file_over_the_defaults(tmp_path: Path):
    settings = tmp_path / "lab.toml"
    settings.write_text('[other]\nx = 1\n\n[slurm]\npartition = "gpu"\ngpus = 2\ncpus = 8\nmem = "64G"\ntime = 600\n'
                        'setup = ["module load cuda/12.4", "source /shared/envlab/.venv/bin/activate"]\n')
    options = slurm_options(settings, gpus=1, parallel=4, tasks=None)
    assert options == SlurmOptions(partition="gpu", gpus=1, cpus=8, mem="64G", time=600, parallel=4,
                                   setup=["module load cuda/12.4", "source /shared/envlab/.venv/bin/activate"])
    assert slurm_options() == SlurmOptions()
    assert (SlurmOptions().idle_exit, SlurmOptions().time, SlurmOptions().gpus) == (30.0, 240, 0)


@pytest.mark.parametrize("text, message", [
    ('[slurm]\ngpus = -1\n', "slurm option gpus (settings file {f}): Input should be greater than or equal to 0"),
    ('[slurm]\npartition = "gpu; rm -rf /"\n', "slurm option partition (settings file {f}): String should match"),
    ('[slurm]\nmem = "lots"\n', "slurm option mem (settings file {f}): String should match"),
    ('[slurm]\ngpu = 2\n', "slurm option gpu (settings file {f}): Extra inputs are not permitted"),
    ('slurm = 3\n', "settings file {f}: `slurm` must be a table ([slurm])"),
    ('[slurm\n', "settings file {f}: not TOML"),
])
def test_a_bad_settings_file_is_refused_naming_the_field(tmp_path: Path, text: str, message: str):
    settings = tmp_path / "lab.toml"
    settings.write_text(text)
    with pytest.raises(SlurmError) as err:
        slurm_options(settings)
    assert str(err.value).startswith(message.format(f=settings))


def test_an_experiment_whose_tasks_could_not_claim_its_stages_is_refused_before_anything_is_submitted(empty_lab):
    """A Slurm task's worker claims only stages planned for as many processes as it has GPUs (less its vLLM server's):
    `--slurm-gpus` other than the experiment's processes (one more in vLLM's server mode) is refused before a run is
    resumed or an array submitted (no cluster is asked)."""
    from lab.study.experiments import create_experiment, task_gpus_refusal
    from lab.study.slurm import run_on_slurm
    from storage.models import Experiment
    from storage.settings import ExperimentSettings

    sixteen = RunSettings(stages=1, grpo={"num_generations": 16, "per_device_train_batch_size": 8})
    two = create_experiment(empty_lab, name="two", settings=sixteen, arms=["fixed"], seeds=1, instances=64,
                            processes=2)
    with pytest.raises(SlurmError) as refused:
        run_on_slurm(empty_lab, "unused", two.id, SlurmOptions(gpus=1))
    assert str(refused.value) == ("experiment 'two' is planned for 2 process(es) a stage, one per GPU: its tasks need "
                                  "--slurm-gpus 2, not 1, or none of them claims its stages")
    assert [run.status for run in experiment_runs(empty_lab, two.id)] == ["active"]  # not touched
    with session(empty_lab) as s:
        assert [job.status for job in s.exec(select(Job))] == ["queued"]
    one = create_experiment(empty_lab, name="one", settings=RunSettings(stages=1), arms=["fixed"], seeds=1,
                            instances=8)
    served = Experiment(name="served", settings=ExperimentSettings(  # vLLM is not installed here: not stored
        run=RunSettings(stages=1, grpo={"use_vllm": True, "vllm_mode": "server"}), config=CONFIG, steps_per_stage=1,
        validation_boards=8, processes=1))
    assert [task_gpus_refusal(two, gpus) is None for gpus in (0, 1, 2, 3)] == [False, False, True, False]
    assert [task_gpus_refusal(one, gpus) is None for gpus in (0, 1, 2)] == [True, True, False]
    assert [task_gpus_refusal(served, gpus) is None for gpus in (0, 1, 2)] == [False, False, True]
    assert task_gpus_refusal(served, 1).startswith("experiment 'served' is planned for 1 process(es) a stage, one per "
                                                   "GPU and one for its vLLM server (vLLM's server mode): its tasks "
                                                   "need --slurm-gpus 2, not 1")


def test_a_huge_or_missing_settings_file_is_refused_unread(tmp_path: Path):
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * 70_000)
    with pytest.raises(SlurmError, match=r"big.toml: 70002 bytes, more than 65536"):
        slurm_options(big)
    with pytest.raises(SlurmError, match=r"nope.toml: No such file or directory"):
        slurm_options(tmp_path / "nope.toml")


# ---------------------------------------------------------------- a worker that cannot work refuses to start


def test_a_worker_without_its_database_or_runs_root_refuses_to_start_in_one_line(tmp_path: Path, monkeypatch,
                                                                                 capsys):
    monkeypatch.setenv("ENVLAB_RUNS", str(tmp_path / "runs"))
    with pytest.raises(SystemExit) as ended:
        main(["worker", "--db", "postgresql+psycopg://envlab@127.0.0.1:9/lab", "--exit-when-idle", "0"])
    assert ended.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("envlab worker: database 'postgresql+psycopg://envlab@127.0.0.1:9/lab' cannot be used: ")
    assert "\n" not in err
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("ENVLAB_RUNS", str(tmp_path / "a-file" / "runs"))
    with pytest.raises(SystemExit) as ended:
        main(["worker", "--db", str(tmp_path / "lab.db"), "--exit-when-idle", "0"])
    assert ended.value.code == 2
    assert capsys.readouterr().err == (f"envlab worker: runs root '{tmp_path / 'a-file' / 'runs'}' ($ENVLAB_RUNS) "
                                       "cannot be used: Not a directory\n")
    monkeypatch.setenv("ENVLAB_RUNS", str(tmp_path / "runs"))
    with pytest.raises(SystemExit) as ended:  # both reachable: it starts, finds nothing to claim, and exits
        main(["worker", "--db", str(tmp_path / "lab.db"), "--exit-when-idle", "0"])
    assert ended.value.code == 0 and (tmp_path / "runs").is_dir()


@pytest.mark.parametrize("record", [None, {}, [], "4182_3", {"array": "4182; rm -rf /", "task": 0},
                                    {"array": "4182"}, {"array": "4182", "task": "three"}])
def test_a_record_this_lab_did_not_write_is_no_slurm_job(record):
    """A job row can come from another lab's archive: only a record of the shape `record` writes names a Slurm job
    (its ids may go to scancel)."""
    assert SlurmJob.of(Job(kind="stage", slurm=record)) is None


def test_a_record_reads_back_as_written():
    written = SlurmJob(array="4182", task=3, node="gpu12", state="RUNNING", log="/shared/x/4182_3_0_log.out",
                       gpus="0,1", restarts=1, worker="gpu12:311")
    job = Job(kind="stage", slurm=dict(written.__dict__))
    assert SlurmJob.of(job) == written
    assert written.describe() == "slurm 4182_3 on gpu12 (RUNNING), log /shared/x/4182_3_0_log.out"


def test_cancel_in_the_page_scancels_the_task_running_the_runs_job(engine, tmp_path: Path, slurm_cluster):
    """The Train tab's *Cancel this run*: the run's running job is asked to stop, and the Slurm array task its row
    names is scancelled (a real array task on the test cluster)."""
    from envsim.config import EnvConfig
    from lab.loop import create_run
    from storage import queue
    from storage.db import session as open_session

    submitted = slurm_cluster.run("sbatch", "--parsable", "--array=0-0", "-o", str(tmp_path / "sleep-%A_%a.out"),
                                  "--wrap", "sleep 300").stdout.strip()
    key = f"{submitted}_0"
    deadline = time.monotonic() + 60
    while task_states([submitted]).get(key, ("?",))[0] != "RUNNING":  # as a task that claimed a job is
        assert time.monotonic() < deadline, task_states([submitted])
        time.sleep(0.2)
    with open_session(engine) as s:
        run = create_run(s, name="cut", config=EnvConfig.default(num_instances=8), settings=RunSettings(stages=1),
                         engineer="fixed")
        s.commit()
        job = queue.claim(s, "vm:1")
        s.exec(update(Job).where(Job.id == job.id).values(slurm=dict(SlurmJob(
            array=submitted, task=0, node=slurm_cluster.node, state="RUNNING", log="x", worker="vm:1").__dict__)))
        s.commit()
    said = train.cancel_run_jobs(engine, run.id)
    assert said == (f"Run #{run.id} is cancelled. Cancel requested for job(s) {job.id}: a queued job stops at once, "
                    f"a running one when its worker next reports. Slurm job(s) {key} cancelled (scancel). *Resume* "
                    "picks the run up again.")
    deadline = time.monotonic() + 60
    while task_states([submitted])[key][0] != "CANCELLED":
        assert time.monotonic() < deadline, task_states([submitted])
        time.sleep(0.2)
