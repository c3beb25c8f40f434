"""Workers on a Slurm cluster: an experiment's stages (or a lab's queued jobs) run by the tasks of a Slurm job
array, submitted with submitit (docs/worker.md).

Slurm schedules the workers, the lab's queue decides what each one does. Each array task is an ordinary envlab
worker (`lab.jobs.worker.run_worker`) on the shared database: it claims jobs (`storage.queue.claim`, exclusive on
PostgreSQL), runs them on the GPUs Slurm gave it (`CUDA_VISIBLE_DEVICES`), records on each job row which Slurm
job ran it (`Job.slurm`: array, task, node, state, log), and exits once it has found nothing to claim for
`idle_exit` seconds, which frees its allocation.

A Slurm job that dies leaves its work to another: when the task is stopped (scancel, time limit, preemption) it
ends its job as failed and queues it again in one transaction (`release`) before it exits; when it dies without
a word (SIGKILL, a node lost), whoever watches the array (`run_on_slurm`) sees its state in `scontrol` and does
the same, and a job whose heartbeat went stale anyway (`storage.queue.reap_stale`) has its run resumed. A
stage's next attempt starts from the checkpoint its last attempt recorded, and the queue's rule that only a
running job can end stays the only way work is written, so nothing is done twice. Before the time limit Slurm
sends submitit's signal (USR2), and the task requeues itself (`SlurmTask.checkpoint`) where the cluster allows.
A job whose Slurm job died `RETRIES` times is left failed, and its run says why.

Options come from the command line, else a settings file's `[slurm]` table (TOML), else the defaults here.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import Engine, update
from sqlmodel import select

from lab.jobs.worker import WorkerOptions, end_process, handlers, run_worker, stop_children, visible_gpus
from lab.loop import advance, after_job, cancel, resume
from lab.study.experiments import (
    ENDED,
    ExperimentError,
    ExperimentProgress,
    experiment_progress,
    experiment_runs,
    find_experiment,
    log_dir,
    match_text,
    restart,
    task_gpus_refusal,
    time_left,
)
from storage import queue
from storage.db import (
    DatabaseUnusable,
    RunsRootUnusable,
    keep_private,
    open_database,
    session,
    usable_runs_root,
)
from storage.models import Experiment, Job, JobKind, JobStatus, Run, RunStatus, Stage
from storage.queue import STALE_SETTING, LostJob, stale_after_s

RETRIES = 3  # attempts of a job whose Slurm job died, before it is left failed
SETTINGS_BYTES = 64 * 1024  # a settings file larger than this is refused unread
LIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING",
        "SUSPENDED", "SIGNALING", "STAGE_OUT")  # a task in one of these may still run (or run again)
LOST = ("slurm job", "worker stopped sending heartbeats")  # how the errors of work whose worker died begin
RESUBMITS = 3  # arrays `run_on_slurm` submits again when every task ended with work left, before it gives up
POLL_S = 2.0
_NAME = r"^[A-Za-z0-9_.:,+-]{1,128}$"


class SlurmError(ValueError):
    """The Slurm path cannot be used as asked (bad option, no `sbatch`, a refused submission); one line."""


class SlurmOptions(BaseModel):
    """What every array task asks Slurm for, and how the array behaves; `[slurm]` of a settings file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    partition: str | None = Field(None, pattern=_NAME)
    account: str | None = Field(None, pattern=_NAME)
    qos: str | None = Field(None, pattern=_NAME)
    gpus: int = Field(0, ge=0, le=64, description="GPUs per array task")
    cpus: int = Field(1, ge=1, le=1024, description="CPUs per array task")
    mem: str | None = Field(None, pattern=r"^[0-9]{1,9}[KMGT]?$", description="memory per task, e.g. 32G")
    time: int = Field(240, ge=1, le=60 * 24 * 30, description="time limit per task, minutes")
    tasks: int | None = Field(None, ge=1, le=10_000, description="array tasks (default: the runs not done)")
    parallel: int | None = Field(None, ge=1, le=10_000, description="array tasks running at once (default: all)")
    idle_exit: float = Field(30.0, ge=0, le=86_400, description="seconds with nothing to claim before a task exits")
    threads: int | None = Field(None, ge=1, le=1024, description="torch threads per task (default: cpus)")
    setup: list[str] = Field(default_factory=list, max_length=50,
                             description="shell lines run before each task's worker (module load, activate, ...)")
    python: str | None = Field(None, max_length=1000, description="the interpreter on the nodes (default: this one)")

    def describe(self) -> str:
        parts = [f"partition {self.partition or '(default)'}", f"{self.gpus} GPU(s)", f"{self.cpus} CPU(s)",
                 f"mem {self.mem or '(default)'}", f"time {self.time} min"]
        return ", ".join(parts)


def read_settings(path: Path) -> dict[str, Any]:
    """The `[slurm]` table of a TOML settings file (other tables are not Slurm's business), unchecked."""
    try:
        size = path.stat().st_size
        if size > SETTINGS_BYTES:
            raise SlurmError(f"settings file {path}: {size} bytes, more than {SETTINGS_BYTES}; is it the right file?")
        data = tomllib.loads(path.read_text())
    except OSError as err:
        raise SlurmError(f"settings file {path}: {err.strerror or err}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise SlurmError(f"settings file {path}: not TOML ({err})") from None
    section = data.get("slurm", {})
    if not isinstance(section, dict):
        raise SlurmError(f"settings file {path}: `slurm` must be a table ([slurm])")
    return section


def slurm_options(settings: Path | None = None, **given: Any) -> SlurmOptions:
    """The options: those `given` (not None) over the settings file's `[slurm]` table over the defaults; a bad
    value is refused naming the field and where it came from."""
    base = read_settings(settings) if settings is not None else {}
    chosen = {**base, **{k: v for k, v in given.items() if v is not None}}
    try:
        return SlurmOptions(**chosen)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "?"
        source = f" (settings file {settings})" if settings is not None and where in base else ""
        raise SlurmError(f"slurm option {where}{source}: {first['msg']}") from None


def add_arguments(parser: Any) -> None:
    """`--slurm` and its options, for `envlab experiment run` and `envlab worker`."""
    g = parser.add_argument_group("Slurm (docs/worker.md)")
    g.add_argument("--slurm", action="store_true", help="run the workers as a Slurm job array (submitit)")
    g.add_argument("--slurm-settings", type=Path, metavar="FILE", help="TOML file whose [slurm] table sets these")
    g.add_argument("--slurm-partition", metavar="NAME")
    g.add_argument("--slurm-account", metavar="NAME")
    g.add_argument("--slurm-gpus", type=int, metavar="N", help="GPUs per array task (default 0)")
    g.add_argument("--slurm-cpus", type=int, metavar="N", help="CPUs per array task (default 1)")
    g.add_argument("--slurm-mem", metavar="SIZE", help="memory per array task, e.g. 32G")
    g.add_argument("--slurm-time", type=int, metavar="MINUTES", help="time limit per array task (default 240)")
    g.add_argument("--slurm-tasks", type=int, metavar="N", help="array tasks (default: the runs not done; worker: 1)")
    g.add_argument("--slurm-parallel", type=int, metavar="K", help="array tasks running at once (default: all)")
    g.add_argument("--slurm-idle-exit", type=float, metavar="SECONDS",
                   help="a task exits after this long with nothing to claim (default 30)")


def options_from_args(args: Any) -> SlurmOptions:
    return slurm_options(args.slurm_settings, partition=args.slurm_partition, account=args.slurm_account,
                         gpus=args.slurm_gpus, cpus=args.slurm_cpus, mem=args.slurm_mem, time=args.slurm_time,
                         tasks=args.slurm_tasks, parallel=args.slurm_parallel, idle_exit=args.slurm_idle_exit,
                         threads=getattr(args, "threads", None))


# ---------------------------------------------------------------- what a job row records


@dataclass(frozen=True)
class SlurmJob:
    """The Slurm array task (or single job) that ran a job (`Job.slurm`)."""

    array: str
    task: int
    node: str
    state: str
    log: str
    gpus: str = ""
    restarts: int = 0
    worker: str = ""  # the worker id the task claims with (host:pid), as the job row's `worker` says

    @property
    def key(self) -> str:
        """The id Slurm's commands take: `ARRAY_TASK`, or the job's own id when it is no array (`task` -1: submitit
        submits a single task as a plain job)."""
        return self.array if self.task < 0 else f"{self.array}_{self.task}"

    @classmethod
    def of(cls, job: Job) -> SlurmJob | None:
        """The job's record, or None for a job no Slurm job ran, or whose record is not one this module wrote
        (a row can come from another lab's archive): its ids may be handed to scancel."""
        slurm = job.slurm
        if not isinstance(slurm, dict) or not re.fullmatch(r"[0-9]{1,20}", str(slurm.get("array", ""))):
            return None
        try:
            return cls(array=str(slurm["array"]), task=int(slurm["task"]), node=str(slurm.get("node", "")),
                       state=str(slurm.get("state", "")), log=str(slurm.get("log", "")),
                       gpus=str(slurm.get("gpus", "")), restarts=int(slurm.get("restarts") or 0),
                       worker=str(slurm.get("worker", "")))
        except (KeyError, TypeError, ValueError):
            return None

    def describe(self) -> str:
        return f"slurm {self.key} on {self.node} ({self.state}), log {self.log}"


def record(engine: Engine, job_id: int, slurm: SlurmJob) -> None:
    """Write on a running job which Slurm task runs it."""
    with session(engine) as s:
        s.exec(update(Job).where(Job.id == job_id, Job.status == JobStatus.RUNNING)
               .values(slurm=asdict(slurm)).execution_options(synchronize_session=False))
        s.commit()


def release(engine: Engine, job_id: int, why: str, *, counted: bool = True) -> Job | None:
    """End a running job whose Slurm job stopped as failed with `why`, and queue it again in the same
    transaction (its next attempt resumes from its recorded checkpoint), unless a cancel had been asked or it
    died `RETRIES` times. Not `counted` (Slurm stopped a live task: scancel, its time limit, preemption): handed
    back, the attempt not counted against the retries (`storage.queue.hand_back`). None when the job was not
    running (ended already, or released by someone else)."""
    with session(engine) as s:
        job = s.get(Job, job_id, populate_existing=True)
        if job is None or job.status != JobStatus.RUNNING:
            return None
        if not counted:
            return queue.hand_back(s, job_id, why)
        try:
            ended = queue.fail(s, job_id, why, commit=False)
        except LostJob:
            s.rollback()
            return None
        if ended.status == JobStatus.FAILED and ended.attempts < RETRIES:
            ended = queue.requeue(s, job_id, commit=False)
        s.commit()
        return ended


# ---------------------------------------------------------------- one array task


class Stopped(BaseException):
    """Slurm asked the task to stop (SIGTERM: scancel, the time limit, preemption); raised in the main thread."""


@dataclass
class SlurmTask:
    """One array task: an envlab worker on `db` that records its Slurm job on each job it claims and exits when
    idle. Pickled by submitit; what it holds while it runs is not."""

    db: str
    runs: str
    stale_s: float
    idle_exit_s: float
    threads: int | None = None
    poll_s: float = 1.0
    by_run: bool = False  # the oldest run's jobs first (`storage.queue.claim`): an experiment's tasks claim so
    _current: int | None = field(default=None, init=False, repr=False)
    _engine: Engine | None = field(default=None, init=False, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _current=None, _engine=None)

    def __call__(self) -> int:
        """Run the worker until it has nothing to claim; returns how many jobs it ran (submitit keeps it)."""
        import submitit

        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="%(asctime)s %(name)s %(levelname)s %(message)s")
        env = submitit.JobEnvironment()
        task = -1 if env.array_task_id is None else int(env.array_task_id)
        me = SlurmJob(array=str(env.array_job_id or env.job_id), task=task,
                      node=env.hostname, state="RUNNING", log=str(env.paths.stdout), gpus=",".join(visible_gpus()),
                      restarts=int(os.environ.get("SLURM_RESTART_COUNT") or 0),
                      worker=f"{socket.gethostname()}:{os.getpid()}")
        os.environ.update({"ENVLAB_DB": self.db, "ENVLAB_RUNS": self.runs, STALE_SETTING: str(self.stale_s)})
        keep_private()  # an entry point of its own: what it writes under the runs root is this user's alone
        if self.threads:
            os.environ["OMP_NUM_THREADS"] = str(self.threads)
        try:
            self._engine = engine = open_database(self.db)
            usable_runs_root(engine)
        except (DatabaseUnusable, RunsRootUnusable) as err:
            print(f"envlab worker (slurm {me.key} on {me.node}): {err}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        print(f"envlab worker: slurm {me.key} on {me.node}, GPUs {me.gpus or 'none'}, runs root {self.runs}",
              file=sys.stderr, flush=True)

        stopping = threading.Event()

        def stop(signum: int, frame: Any) -> None:
            why = f"slurm job {me.key} on {me.node} got {signal.Signals(signum).name}"
            if stopping.is_set():  # a second: now
                raise Stopped(why)
            print(f"envlab worker: {why}: handing the job in hand back and stopping", file=sys.stderr, flush=True)
            end_process(why)  # the job stops at its next step, saves and goes back to the queue, uncounted
            stopping.set()

        signal.signal(signal.SIGTERM, stop)

        def claimed(engine: Engine, job: Job) -> None:
            self._current = job.id
            record(engine, job.id, me)

        def after(engine: Engine, job: Job) -> None:
            self._current = None
            after_job(engine, job)

        # As any worker's: a job that loads a model runs in a child process (under `accelerate launch` on the
        # task's GPUs), whose memory is given back when it ends; a signal that stops the task ends the child's
        # process group too (`lab.jobs.worker.run_child`) and hands the job back.
        try:
            options = WorkerOptions(worker_id=me.worker, poll_s=self.poll_s, stale_s=self.stale_s, after=after,
                                    claimed=claimed, idle_exit_s=self.idle_exit_s, gpus=visible_gpus(),
                                    stop=stopping, by_run=self.by_run)
            return run_worker(engine, handlers(), options)
        except Stopped as err:
            job_id = self._current
            self._release(f"{err}: stopped (scancel, time limit or preemption) during the job", counted=False)
            held = f"job {job_id} handed back to the queue" if job_id else "it held no job"
            print(f"envlab worker: {err}; {held}", file=sys.stderr, flush=True)
            return 0
        finally:
            engine.dispose()

    def _release(self, why: str, *, counted: bool = True) -> None:
        if self._current is None:
            return
        engine = open_database(self.db)  # a fresh pool: the signal may have cut a statement short on the old one
        try:
            release(engine, self._current, why, counted=counted)
        finally:
            engine.dispose()
        self._current = None

    def checkpoint(self) -> Any:
        """submitit's hook, called on its signal before the time limit (or on preemption): stop the job in hand,
        hand it back to the queue and requeue this task (a fresh one, from the same settings).

        submitit requeues the task and exits once this returns, so the job's child is stopped here and waited for
        (`stop_children`): it saves its checkpoint and hands its job back itself before the task lets go of it; a
        job released while its child still trained could be claimed again and resume from an older checkpoint."""
        import submitit

        why = "slurm job reached its time limit or was preempted; requeued"
        stop_children(why)
        self._release(why, counted=False)
        # the same settings, `by_run` among them (the requeued task claims as its array's tasks do)
        return submitit.helpers.DelayedSubmission(SlurmTask(**self.__getstate__()))


# ---------------------------------------------------------------- submitting and watching


def require_slurm() -> None:
    from storage.settings import SettingsError
    from training.settings import check_slurm_package

    try:
        check_slurm_package()
    except SettingsError as err:
        raise SlurmError(str(err)) from None
    absent = [command for command in ("sbatch", "scontrol", "scancel") if shutil.which(command) is None]
    if absent:
        raise SlurmError(f"no {', '.join(absent)} on PATH: run this on a machine of the cluster (a login node) "
                         "with Slurm's commands")


def submit(options: SlurmOptions, *, db: str, runs: Path, tasks: int, folder: Path, name: str = "envlab",
           by_run: bool = False) -> list[str]:
    """Submit `tasks` workers as one Slurm job array; returns the array's job id. Logs go to `folder`. `by_run`:
    its workers claim the oldest run's jobs first (an experiment's: its runs end seed by seed)."""
    import submitit

    require_slurm()
    folder.mkdir(parents=True, exist_ok=True)
    executor = submitit.SlurmExecutor(folder=folder, python=options.python)
    parameters: dict[str, Any] = dict(job_name=name, cpus_per_task=options.cpus, time=options.time,
                                      array_parallelism=options.parallel or tasks, setup=list(options.setup),
                                      stderr_to_stdout=True,  # one log per task: the worker's lines and submitit's
                                      additional_parameters={"open_mode": "append"})  # a requeued task adds to it
    for key in ("partition", "account", "qos", "mem"):
        if getattr(options, key) is not None:
            parameters[key] = getattr(options, key)
    if options.gpus:
        parameters["gres"] = f"gpu:{options.gpus}"
    executor.update_parameters(**parameters)
    task = SlurmTask(db=db, runs=str(runs), stale_s=stale_after_s(), idle_exit_s=options.idle_exit,
                     threads=options.threads or options.cpus, by_run=by_run)
    try:
        with executor.batch():
            jobs = [executor.submit(task) for _ in range(tasks)]
    except Exception as err:  # sbatch refused: submitit raises with its stderr
        raise SlurmError(f"sbatch refused the array: {str(err).strip().splitlines()[-1] if str(err) else err}"
                         ) from None
    return sorted({j.job_id.partition("_")[0] for j in jobs})


_FIELD = re.compile(r"(\w+)=(\S*)")


def task_states(arrays: Sequence[str]) -> dict[str, tuple[str, str, int]]:
    """`{"ARRAY_TASK": (state, node, restarts)}` (`{"JOB": ...}` for a plain job) of the tasks of `arrays` that
    `scontrol` still knows (a pending range counts each of its tasks). An array that ended long enough ago to be
    forgotten is absent.

    Raises:
        SlurmError: the controller did not answer (nothing can be concluded about the tasks this time).
    """
    states: dict[str, tuple[str, str, int]] = {}
    for array in arrays:
        try:
            shown = subprocess.run(["scontrol", "show", "job", "-o", str(array)], capture_output=True, text=True,
                                   timeout=60)
        except subprocess.TimeoutExpired:
            raise SlurmError("scontrol did not answer in 60 s") from None
        if shown.returncode != 0:
            if "invalid job id" in shown.stderr.lower():
                continue  # forgotten: it ended MinJobAge ago
            raise SlurmError(f"scontrol show job {array}: {shown.stderr.strip() or shown.returncode}")
        for line in shown.stdout.splitlines():
            f = dict(_FIELD.findall(line))
            state, node = f.get("JobState", "UNKNOWN"), f.get("NodeList", "")
            restarts = int(f.get("Restarts") or 0)
            if "ArrayJobId" not in f:  # a single task: a plain job
                states[f.get("JobId", str(array))] = (state, node, restarts)
                continue
            for part in f.get("ArrayTaskId", "").partition("%")[0].split(","):
                first, _, last = part.partition("-")
                if first.isdigit():
                    for t in range(int(first), int(last or first) + 1):
                        states[f"{f['ArrayJobId']}_{t}"] = (state, node, restarts)
    return states


def scancel(keys: Sequence[str]) -> None:
    """Cancel Slurm jobs (`ARRAY` or `ARRAY_TASK`); those that ended already are no error."""
    if keys:
        subprocess.run(["scancel", *keys], capture_output=True, text=True, timeout=60)


@dataclass
class Watch:
    """What `sweep` found: jobs handed back, runs resumed, tasks alive."""

    released: list[int] = field(default_factory=list)
    resumed: list[int] = field(default_factory=list)
    alive: int = 0


def sweep(engine: Engine, arrays: Sequence[str], run_ids: Sequence[int]) -> Watch:
    """One look at the arrays: refresh the state each job row shows of its Slurm task, hand back the running
    jobs whose task is no longer running them, and resume the runs that failed only because a worker died."""
    try:
        states = task_states(arrays)
    except SlurmError:
        return Watch(alive=1)  # the controller is busy or restarting: look again at the next poll
    watch = Watch(alive=sum(state in LIVE for state, _, _ in states.values()))
    with session(engine) as s:
        jobs = [(j, mine) for j in s.exec(select(Job).where(Job.run_id.in_(run_ids))) if (mine := SlurmJob.of(j))]
    for job, mine in jobs:
        state, node, restarts = states.get(mine.key, (None, mine.node, mine.restarts))
        if job.status == JobStatus.RUNNING and job.worker != mine.worker:
            continue  # claimed again, by a task that has not written its own record yet
        if job.status == JobStatus.RUNNING and (state != "RUNNING" or restarts != mine.restarts):
            if state == "COMPLETING" and restarts == mine.restarts:
                continue  # its processes are still ending: the worker records why (a SIGTERM) itself; look again
            why = f"slurm job {mine.key} on {mine.node} ended {state or '(forgotten by scontrol)'}"
            if release(engine, job.id, why) is not None:
                watch.released.append(job.id)
            continue
        if state is not None and state != mine.state and job.status != JobStatus.RUNNING:
            with session(engine) as s:
                s.exec(update(Job).where(Job.id == job.id).values(slurm={**job.slurm, "state": state})
                       .execution_options(synchronize_session=False))
                s.commit()
    for run_id in run_ids:
        if _lost_worker(engine, run_id):
            resume(engine, run_id)
            advance(engine, run_id)
            watch.resumed.append(run_id)
    return watch


def _lost_worker(engine: Engine, run_id: int) -> bool:
    """Whether a run failed only because its job's worker died (and that job has retries left)."""
    with session(engine) as s:
        run = s.get(Run, run_id)
        if run is None or run.status != RunStatus.FAILED:
            return False
        job = s.exec(select(Job).where(Job.run_id == run_id).order_by(Job.id.desc())).first()
    return (job is not None and job.status == JobStatus.FAILED and (job.error or "").startswith(LOST)
            and job.attempts < RETRIES)


def experiment_arrays(engine: Engine, experiment_id: int) -> list[str]:
    """The Slurm arrays submitted for an experiment, and any other whose tasks ran its jobs."""
    with session(engine) as s:
        experiment = s.get(Experiment, experiment_id)
        listed = [a for a in experiment.settings.slurm_arrays if a.isdigit()]
        run_ids = [r.id for r in s.exec(select(Run).where(Run.experiment_id == experiment_id))]
        recorded = {sl.array for j in s.exec(select(Job).where(Job.run_id.in_(run_ids))) if (sl := SlurmJob.of(j))}
    return sorted(set(listed) | recorded, key=lambda a: (len(a), a))


def _note_array(engine: Engine, experiment_id: int, arrays: Sequence[str]) -> None:
    with session(engine) as s:
        experiment = s.get(Experiment, experiment_id)
        experiment.settings = experiment.settings.model_copy(
            update={"slurm_arrays": [*experiment.settings.slurm_arrays, *map(str, arrays)]})
        s.add(experiment)
        s.commit()


def run_on_slurm(engine: Engine, db: str, key: str | int, options: SlurmOptions, *,
                 on_progress: Callable[[ExperimentProgress], None] | None = None,
                 say: Callable[[str], None] | None = None, poll_s: float = POLL_S,
                 wait_for_tasks_s: float = 120.0) -> ExperimentProgress:
    """Run an experiment to its end with Slurm array tasks as its workers (on the database `db`, a URL or path
    every node reaches).

    Every run that is not done is resumed first (`lab.study.experiments.restart`), then one array is submitted (one
    task per unfinished run unless `options.tasks` says otherwise). Each poll refreshes the tasks' states on the
    job rows, hands back the jobs of tasks that died (`sweep`), and, when every task has ended but work is left
    (tasks exit when idle), submits another array (`RESUBMITS` times in a row without a stage done, at most).
    Once every run has ended, waits up to `wait_for_tasks_s` for the tasks to exit, so the rows show their last
    state. The tasks outlive this command: killed, it leaves them to finish the queue (`envlab experiment cancel`
    stops them). Refused before anything is resumed or submitted where a task of `options.gpus` GPUs could not
    claim the experiment's stages (`task_gpus_refusal`).
    """
    say = say or (lambda line: None)
    experiment = find_experiment(engine, key)
    if refusal := task_gpus_refusal(experiment, options.gpus):  # before anything is resumed or submitted
        raise SlurmError(refusal)
    root = usable_runs_root(engine)
    for line in restart(engine, experiment.id):
        say(line)
    folder = log_dir(engine, experiment) / "slurm"
    resubmits = 0

    def submit_array() -> None:
        left = [r for r in experiment_runs(engine, experiment.id) if r.status not in ENDED]
        tasks = options.tasks or max(1, len(left))
        arrays = submit(options, db=db, runs=root, tasks=tasks, folder=folder, name=f"envlab-{experiment.name}",
                        by_run=True)
        _note_array(engine, experiment.id, arrays)
        say(f"slurm array {', '.join(arrays)}: {tasks} task(s) ({options.describe()}), logs in {folder}")

    progress = experiment_progress(engine, experiment.id)
    if not progress.ended:
        submit_array()
    moved, done = time.monotonic(), progress.done
    while True:
        progress = experiment_progress(engine, experiment.id)
        run_ids = [r.id for r in progress.runs]
        watch = sweep(engine, experiment_arrays(engine, experiment.id), run_ids)
        for job_id in watch.released:
            say(f"job {job_id}: its slurm job died; queued again for another task")
        for run_id in watch.resumed:
            say(f"run {run_id}: its worker died; resumed")
        progress = experiment_progress(engine, experiment.id)
        if on_progress is not None:
            on_progress(progress)
        if progress.ended:
            break
        if progress.done > done:
            resubmits, done = 0, progress.done  # work moves: the count is of arrays in a row that moved nothing
        if watch.alive == 0 and not watch.released:
            if resubmits >= RESUBMITS:
                raise ExperimentError(f"every slurm task ended with work left, {RESUBMITS + 1} arrays in a row; "
                                      f"their logs: {folder}. Fix the cause and run the command again to resume.")
            resubmits += 1
            submit_array()
        if time.monotonic() - moved > 10:  # a safety net: the tasks' hook advances runs too
            for run in progress.runs:
                if run.status not in ENDED:
                    advance(engine, run.id)
            moved = time.monotonic()
        time.sleep(poll_s)
    arrays = experiment_arrays(engine, experiment.id)
    deadline = time.monotonic() + wait_for_tasks_s
    while time.monotonic() < deadline and sweep(engine, arrays, run_ids).alive:
        time.sleep(poll_s)
    return progress


def submit_workers(engine: Engine, db: str, options: SlurmOptions) -> tuple[list[str], Path]:
    """`envlab worker --slurm`: an array of `options.tasks` (default 1) workers for whatever the lab queues;
    they exit when idle. Returns the array ids and the log folder."""
    root = usable_runs_root(engine)
    folder = root / "slurm"
    return submit(options, db=db, runs=root, tasks=options.tasks or 1, folder=folder), folder


# ---------------------------------------------------------------- cancelling and showing


def cancel_experiment(engine: Engine, key: str | int) -> list[str]:
    """Cancel every run of an experiment (`lab.loop.cancel`) and its Slurm arrays (scancel); one line each."""
    experiment = find_experiment(engine, key)
    lines = []
    for run in experiment_runs(engine, experiment.id):
        if run.status in ENDED:
            continue
        jobs = cancel(engine, run.id)
        lines.append(f"run {run.id} ({run.arm}, seed {run.seed}) cancelled" +
                     (f"; job(s) {', '.join(map(str, jobs))} asked to stop" if jobs else ""))
    arrays = experiment_arrays(engine, experiment.id)
    if arrays and shutil.which("scancel"):
        scancel(arrays)
        lines.append(f"scancel sent to slurm array(s) {', '.join(arrays)}")
    return lines


def cancel_slurm_of(engine: Engine, job_ids: Sequence[int]) -> list[str]:
    """Cancel (scancel) the Slurm tasks running these jobs; returns their `ARRAY_TASK` ids. For the page's
    Cancel: the job is cancelled in the queue already, this frees the task's allocation at once."""
    with session(engine) as s:
        keys = sorted({sl.key for j in s.exec(select(Job).where(Job.id.in_(list(job_ids))))
                       if (sl := SlurmJob.of(j)) and j.status in (JobStatus.RUNNING, JobStatus.CANCELLED)})
    if keys and shutil.which("scancel"):
        scancel(keys)
        return keys
    return []


@dataclass(frozen=True)
class StageJob:
    """A stage of a run and the last job that worked on it: who ran it, where, and its log."""

    run: Run
    stage: int
    status: str
    job: Job | None

    @property
    def slurm(self) -> SlurmJob | None:
        return SlurmJob.of(self.job) if self.job else None

    def where(self) -> str:
        if self.job is None:
            return "no job yet"
        ran = self.slurm.describe() if self.slurm else f"worker {self.job.worker or '(none yet)'}"
        return f"job {self.job.id} {self.job.status}, attempt {self.job.attempts}, {ran}"


def stage_jobs(engine: Engine, run_ids: Sequence[int]) -> list[StageJob]:
    """Each stage of these runs with its last stage job, in run then stage order."""
    with session(engine) as s:
        runs = {r.id: r for r in s.exec(select(Run).where(Run.id.in_(list(run_ids))))}
        stages = list(s.exec(select(Stage).where(Stage.run_id.in_(list(run_ids))).order_by(Stage.run_id, Stage.index)))
        jobs: dict[tuple[int, int], Job] = {}
        for j in s.exec(select(Job).where(Job.run_id.in_(list(run_ids)), Job.kind == JobKind.STAGE).order_by(Job.id)):
            jobs[(j.run_id, j.target)] = j
    return [StageJob(runs[stage.run_id], stage.index, str(stage.status), jobs.get((stage.run_id, stage.index)))
            for stage in stages]


SLURM_HEADERS = ["run", "arm", "seed", "stage", "status", "job", "slurm job", "node", "state", "log"]


def slurm_rows(engine: Engine, run_ids: Sequence[int]) -> list[list[Any]]:
    """One row per stage for the pages: the run, the stage and the Slurm job that ran it ('' off Slurm)."""
    rows = []
    for sj in stage_jobs(engine, run_ids):
        sl = sj.slurm
        rows.append([sj.run.id, sj.run.arm or "", sj.run.seed, sj.stage, sj.status, sj.job.id if sj.job else "",
                     sl.key if sl else "", sl.node if sl else "", sl.state if sl else "", sl.log if sl else ""])
    return rows


def status_lines(engine: Engine, key: str | int) -> list[str]:
    """`envlab experiment status NAME`: each run, each stage, the job and the Slurm job that ran it."""
    experiment = find_experiment(engine, key)
    progress = experiment_progress(engine, experiment.id)
    lines = [f"experiment {experiment.name}: {progress.count(RunStatus.DONE)} of {len(progress.runs)} runs done, "
             f"{progress.done} of {progress.total} stages"]
    if left := time_left(engine, progress):
        lines.append(left)
    if experiment.settings.matched is not None:
        lines.append(f"compute matched ({experiment.settings.matched.mode}): {match_text(experiment.settings)}")
    arrays = experiment_arrays(engine, experiment.id)
    if arrays:
        lines.append(f"slurm arrays: {', '.join(arrays)}")
    current = None
    for sj in stage_jobs(engine, [r.id for r in progress.runs]):
        if sj.run.id != current:
            current = sj.run.id
            reason = f": {sj.run.status_reason}" if sj.run.status_reason else ""
            lines.append(f"run {sj.run.id} ({sj.run.arm}, seed {sj.run.seed}) {sj.run.status}{reason}")
        lines.append(f"  stage {sj.stage} {sj.status}: {sj.where()}")
    return lines
