"""The lab's tables: experiments, runs, stages, proposals, decisions, jobs, episodes, stage metrics, training logs,
and the lab's one row about the shipped example and studies.

Records are stored as JSON. The ones every layer reads are typed by their column (`Typed`): a stage's, a
proposal's and a decision's config are `envsim.config.EnvConfig`s, a run's and an experiment's settings are
`storage.settings` records, validated before they are stored and handed back as models. Instances, plans and
outcomes are whatever the lab writes (`envsim`'s `model_dump(mode="json")`). The typed records are frozen and
JSON columns do not track edits made inside a dict: assign a new value to change one.

Rows are an audit trail. The lab inserts rows and moves job and stage rows through their
statuses; it never updates a decision in place and never deletes a row. That is why there are no
ON DELETE rules and why `decisions.proposal_id` is UNIQUE: the database itself, not the code,
keeps "one decision per proposal" true when two people click at once.

Evaluation rows (episodes, stage metrics) and training logs are keyed by `(run_id, stage_index)`
rather than by a stage row, so the same query shape serves every per-stage chart, including an
evaluation of a policy that no stage row describes (e.g. the checkpoint before the first stage).

Timestamps are timezone-aware UTC on both SQLite (which stores no zone) and PostgreSQL.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from enum import IntEnum, StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator
from sqlalchemy import JSON, CheckConstraint, DateTime, Index, Text, UniqueConstraint, false, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator
from sqlmodel import AutoString, Field, SQLModel

from envsim.config import GLOBALS, EnvConfig
from envsim.instance import Instance
from envsim.suite import Split
from storage.settings import ExperimentSettings, RunSettings

# Deterministic constraint names: the same on SQLite and PostgreSQL, so migrations can name them.
SQLModel.metadata.naming_convention = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


# The lab's vocabulary: every status, kind and action is one of these names, and a CHECK constraint on its
# column keeps the database to them (the columns are plain strings: no database enum type to migrate).
# `Split` (the instance sets) lives with the suite that builds them.


class RunStatus(StrEnum):
    """Where a run stands. `failed` and `cancelled` wait for a person (resume, retry, switch engineer)."""

    ACTIVE = "active"  # a stage or a proposal is queued or running
    WAITING = "waiting"  # a proposal waits for a person's decision
    FAILED = "failed"  # a job failed for good; `Run.status_reason` says which and why
    CANCELLED = "cancelled"  # a person stopped it
    DONE = "done"  # every stage trained and evaluated


class StageStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class JobKind(StrEnum):
    """What a job does; its `target` names the stage it is about."""

    STAGE = "stage"  # train stage `target` (stage 0: evaluate the starting policy)
    PROPOSE = "propose"  # ask the engineer for the config after stage `target`
    BENCHMARK = "benchmark"  # evaluate stage `target`'s checkpoint on the 3,150-board benchmark
    PROBE = "probe"  # measure configs for a proposal on stage `target`'s checkpoint (the Measure panel)


class Action(StrEnum):
    """What was done with a proposal."""

    ACCEPT = "accept"
    EDIT = "edit"
    REJECT = "reject"
    AUTO = "auto"


ACTIVE_JOB = (JobStatus.QUEUED, JobStatus.RUNNING)

# JSONB on PostgreSQL (comparable, indexable), JSON text elsewhere.
JSONType = JSON().with_variant(JSONB(), "postgresql")


class Unreadable:
    """A typed column's value that its model does not read (a row an older version stored unchecked): the row
    and every other row still load; reading any field of this value raises a ValueError naming the problem."""

    def __init__(self, model: str, problem: str, raw: Any) -> None:
        self.model, self.problem, self.raw = model, problem, raw

    def __getattr__(self, name: str) -> Any:
        raise ValueError(f"this stored {self.model} is not valid ({self.problem}): its {name} cannot be read")

    def __repr__(self) -> str:
        return f"Unreadable({self.model}: {self.problem})"


class Typed(TypeDecorator[Any]):
    """A JSON column that holds one pydantic model: a model or a dict on the way in (a dict is validated by the
    model first, so nothing the model refuses is ever stored), the model on the way out (`Unreadable` where a
    stored row does not validate: `storage/migrations` keeps old rows readable)."""

    impl = JSONType
    cache_ok = True

    def __init__(self, model: type[BaseModel], *, exclude_none: bool = False) -> None:
        super().__init__()
        self.model = model
        self.exclude_none = exclude_none  # leave out fields that are None (a run's settings: what has a value)

    def dump(self, value: Any) -> Any:
        """The JSON a value is stored as (an archive writes the same)."""
        if isinstance(value, Unreadable):
            return value.raw
        if not isinstance(value, self.model):
            value = self.model.model_validate(value)
        return value.model_dump(mode="json", exclude_none=self.exclude_none)

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        return None if value is None else self.dump(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        if value is None:
            return None
        try:
            return self.model.model_validate(value)
        except ValidationError as err:
            e = err.errors(include_url=False)[0]
            where = ".".join(map(str, e["loc"]))
            return Unreadable(self.model.__name__, f"{where + ': ' if where else ''}{e['msg']}", value)


class TypedRow:
    """A table whose typed columns hold their model from the moment they are set: a dict assigned to one (a row made
    in code, or read from an archive) is validated and turned into the model there, so a row in a session reads the
    same before and after it is stored, and nothing its model refuses gets as far as the database."""

    def __setattr__(self, name: str, value: Any) -> None:
        column = type(self).__table__.columns.get(name)  # type: ignore[attr-defined]
        if column is not None and isinstance(column.type, Typed) and value is not None \
                and not isinstance(value, column.type.model | Unreadable):
            value = column.type.model.model_validate(value)
        super().__setattr__(name, value)


def utcnow() -> datetime:
    """The current time, timezone-aware UTC (the only kind of datetime the tables accept)."""
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A `timestamptz` on PostgreSQL; on SQLite a naive UTC string that reads back as aware UTC.

    Naive datetimes are refused on the way in: a naive local time written by one machine would be
    read as UTC by another.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass a timezone-aware one (storage.models.utcnow())")
        value = value.astimezone(UTC)
        return value if dialect.name == "postgresql" else value.replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _in(column: str, values: type[StrEnum]) -> str:
    return f"{column} IN ({', '.join(repr(str(v)) for v in values)})"


def new_uuid() -> str:
    return uuid.uuid4().hex


class Experiment(TypedRow, SQLModel, table=True):
    """A named set of runs (arms x seeds) that share everything but the engineer and the seed (lab.study.experiments).

    `arms` lists each arm as the lab defines it (name, engineer, backend, context preset); `settings` holds
    what every run shares and the compute it buys (stages, instances, GRPO settings, steps per stage,
    validation boards, the initial config). An experiment has no status of its own: its runs have.
    """

    __tablename__ = "experiments"
    __table_args__ = (UniqueConstraint("name"),)

    id: int | None = Field(default=None, primary_key=True)
    name: str
    description: str = Field(default="", sa_type=Text)
    policy: str
    arms: list[Any] = Field(default_factory=list, sa_type=JSONType)
    seeds: int
    settings: ExperimentSettings = Field(sa_type=Typed(ExperimentSettings))
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class Run(TypedRow, SQLModel, table=True):
    """A sequence of stages with its own policy, engineer, settings and seed.

    `settings` holds the run's knobs as the lab defines them (including `auto_apply`: accept
    proposals without a person). `status` says where the run stands and `status_reason` why, when it
    stopped (e.g. "proposal after stage 2 failed: ..."). `uuid` names the run's folder under the runs
    root: run ids restart at 1 in every database, so two labs that share a folder never share files.
    A run of an experiment names it (`experiment_id`) and its `arm` there; other runs have neither.
    """

    __tablename__ = "runs"
    __table_args__ = (UniqueConstraint("uuid"), CheckConstraint(_in("status", RunStatus), name="status"))

    id: int | None = Field(default=None, primary_key=True)
    uuid: str = Field(default_factory=new_uuid)
    name: str
    description: str = Field(default="", sa_column_kwargs={"server_default": ""})
    policy: str
    engineer: str
    engineer_backend: str
    settings: RunSettings = Field(sa_type=Typed(RunSettings, exclude_none=True))
    seed: int
    status: RunStatus = Field(default=RunStatus.ACTIVE, sa_type=AutoString)
    status_reason: str = Field(default="", sa_type=Text, sa_column_kwargs={"server_default": ""})
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    experiment_id: int | None = Field(default=None, foreign_key="experiments.id", index=True)
    arm: str | None = None


MAX_REPLAY = GLOBALS["num_instances"][1]  # a stage trains on at most this many boards, replayed ones among them


class Replay(BaseModel):
    """Boards a stage trains on as they are, beside those it draws from its config: the `learnability` engineer's
    buffer of the most learnable boards it probed (`lab.engineers.learnability`). Each is a whole labelled board (the
    rewards read its solver labels), checked as any board is (`Instance`) wherever the record is read; at most
    `MAX_REPLAY` of them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    boards: tuple[Instance, ...] = Field(max_length=MAX_REPLAY)

    @field_validator("boards")
    @classmethod
    def _labelled(cls, boards: tuple[Instance, ...]) -> tuple[Instance, ...]:
        for i, board in enumerate(boards):
            if board.opt_soc is None or board.opt_makespan is None or board.needs_wait is None \
                    or board.reference_plan is None:
                raise ValueError(f"board {i} ({board.id}) has no solver labels: a replayed board is trained on as "
                                 "the generator labels it")
        return boards

    def sizes_text(self) -> str:
        """How many boards per map size, smallest first: `3: 40, 4: 88`."""
        counts: dict[int, int] = {}
        for board in self.boards:
            counts[board.size] = counts.get(board.size, 0) + 1
        return ", ".join(f"{size}: {n}" for size, n in sorted(counts.items()))


class ProbeCompute(BaseModel):
    """What an engineer's probes cost, as `Proposal.compute` holds it (JSON): the answers sampled and the seconds
    spent by the probes the cache did not answer, how many probes it ran, and how many of them the cache answered."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    completions: int = 0
    seconds: float = 0.0
    probes: int = 0
    cached: int = 0


class Stage(TypedRow, SQLModel, table=True):
    """One GRPO training stage of a run on one environment config; `index` counts from 0 within the run.

    `checkpoint` is the trained policy's folder relative to the runs root (`storage.db.runs_root`), or,
    for stage 0, the run's policy spec ("tiny", a model name or an absolute folder). `replay` is the boards the
    stage trains on as they are (its proposal's, `Replay`), the rest drawn from `config`; None: every board drawn.
    """

    __tablename__ = "stages"
    __table_args__ = (UniqueConstraint("run_id", "index"), CheckConstraint(_in("status", StageStatus), name="status"))

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="runs.id")
    index: int
    config: EnvConfig = Field(sa_type=Typed(EnvConfig))
    status: StageStatus = Field(default=StageStatus.QUEUED, sa_type=AutoString)
    checkpoint: str | None = None
    started_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    finished_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    replay: Replay | None = Field(default=None, sa_type=Typed(Replay))


class Proposal(TypedRow, SQLModel, table=True):
    """What an engineer returned for the stage after `after_stage`, kept whole even when it failed.

    `parsed_config` is what the answer said (None when it could not be read), `projected_config`
    is that config moved onto the legal space (None when nothing legal could be made of it),
    `adjustments` lists what the projection changed, `diff` compares the projected config with the
    current one, and `error` says why a failed proposal failed. `replay` is the boards the next stage would train
    on as they are (`Replay`; None: none), which a decision that applies a config passes on to the stage.
    """

    __tablename__ = "proposals"
    __table_args__ = (Index(None, "run_id", "after_stage"),)

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="runs.id")
    after_stage: int
    engineer: str
    prompt: str = Field(sa_type=Text)
    raw_answer: str = Field(sa_type=Text)
    parsed_config: dict[str, Any] | None = Field(default=None, sa_type=JSONType)
    projected_config: EnvConfig | None = Field(default=None, sa_type=Typed(EnvConfig))
    adjustments: list[Any] = Field(default_factory=list, sa_type=JSONType)
    rationale: str = Field(default="", sa_type=Text)
    diff: dict[str, Any] = Field(default_factory=dict, sa_type=JSONType)
    error: str | None = Field(default=None, sa_type=Text)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    compute: dict[str, Any] | None = Field(default=None, sa_type=JSONType)  # probes the engineer ran (learnability)
    replay: Replay | None = Field(default=None, sa_type=Typed(Replay))

    @property
    def spent(self) -> ProbeCompute | None:
        """`compute`, typed; None where the engineer probed nothing."""
        return ProbeCompute.model_validate(self.compute) if self.compute else None


class Decision(TypedRow, SQLModel, table=True):
    """What was done with a proposal: at most one per proposal (UNIQUE), never updated or deleted.

    `config` is the config actually applied: the projected one for accept and auto, the person's
    edited one for edit, None for reject. Write it with `storage.decisions.record_decision`.
    """

    __tablename__ = "decisions"
    __table_args__ = (
        UniqueConstraint("proposal_id"),
        CheckConstraint(_in("action", Action), name="action"),
    )

    id: int | None = Field(default=None, primary_key=True)
    proposal_id: int = Field(foreign_key="proposals.id")
    action: Action = Field(sa_type=AutoString)
    user: str
    config: EnvConfig | None = Field(default=None, sa_type=Typed(EnvConfig))
    note: str = Field(default="", sa_type=Text)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    probes: list[Any] | None = Field(default=None, sa_type=JSONType)  # keys of the probes the person saw


class Job(SQLModel, table=True):
    """A unit of background work (a `JobKind`) on stage `target` of run `run_id`, claimed by one worker.

    Move jobs through their statuses with `storage.queue` only: it is what keeps a job claimed by
    one worker at a time. `log_tail` holds the last `storage.queue.LOG_TAIL_LINES` lines.
    A run has at most one queued or running job of each kind and target: a partial unique index, so
    two processes that advance one run at the same moment cannot queue the same work twice.
    """

    __tablename__ = "jobs"
    __table_args__ = (
        Index(None, "status", "id"),
        Index("ix_jobs_claim", "status", "priority", "id"),
        Index("uq_jobs_active_target", "run_id", "kind", "target", unique=True,
              sqlite_where=text("status IN ('queued', 'running')"),
              postgresql_where=text("status IN ('queued', 'running')")),
        CheckConstraint(_in("status", JobStatus), name="status"),
        CheckConstraint(_in("kind", JobKind), name="kind"),
    )

    id: int | None = Field(default=None, primary_key=True)
    kind: JobKind = Field(sa_type=AutoString)
    run_id: int | None = Field(default=None, foreign_key="runs.id", index=True)
    target: int | None = None
    payload: dict[str, Any] = Field(default_factory=dict, sa_type=JSONType)
    status: JobStatus = Field(default=JobStatus.QUEUED, sa_type=AutoString)
    worker: str | None = None
    step: int = 0
    total: int | None = None
    heartbeat_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    cancel_requested: bool = False
    log_tail: str = Field(default="", sa_type=Text)
    error: str | None = Field(default=None, sa_type=Text)
    result: dict[str, Any] | None = Field(default=None, sa_type=JSONType)
    attempts: int = 0
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    started_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    finished_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    needs_gpu: bool = Field(default=False, sa_column_kwargs={"server_default": false()})  # only a GPU worker's
    priority: int = Field(default=0, sa_column_kwargs={"server_default": "0"})  # `Priority`: higher is claimed first
    # the processes a training stage was planned for (`RunSettings.processes`): only a worker that launches that many
    # claims it (one per GPU it owns; one without a GPU counts as one). None: any worker (every other job)
    processes: int | None = None
    # a training stage in vLLM's server mode: its processes are those of a worker's GPUs less its server's
    vllm_server: bool = Field(default=False, sa_column_kwargs={"server_default": false()})
    # the Slurm array task that ran it (`lab.study.slurm.SlurmJob`: array, task, node, state, log); None off Slurm
    slurm: dict[str, Any] | None = Field(default=None, sa_type=JSONType)


class Priority(IntEnum):
    """How urgent a job is: a person waits on an interactive one (claimed first), nobody on an experiment's."""

    BACKGROUND = 0  # a run's own stages and proposals, an experiment's, a benchmark
    INTERACTIVE = 10  # a Measure, a stage queued after a person's decision on the page


class Episode(SQLModel, table=True):
    """One evaluation instance, the policy's answer and its outcome; `failure` is None when valid.

    `split` names the instance set (`Split`); `size` and `num_agents` are copied
    out of the instance JSON so that per-size queries need no JSON functions; `subset` is a benchmark
    board's wait subset (0.25, 0.5, 0.75), for the leaderboard's per-subset table.
    """

    __tablename__ = "episodes"
    __table_args__ = (Index(None, "run_id", "stage_index", "split"), CheckConstraint(_in("split", Split), name="split"))

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="runs.id")
    stage_index: int
    split: Split = Field(sa_type=AutoString)
    instance_id: str
    instance: dict[str, Any] = Field(sa_type=JSONType)
    size: int
    num_agents: int
    completion: str = Field(sa_type=Text)
    plan: dict[str, Any] | list[Any] | None = Field(default=None, sa_type=JSONType)
    outcome: dict[str, Any] = Field(default_factory=dict, sa_type=JSONType)
    valid: bool
    optimal: bool
    failure: str | None = None
    subset: float | None = None


class StageMetric(SQLModel, table=True):
    """A stage's evaluation summed per map size and agent count: one row per (run, stage, split, size, agents).

    A size's numbers are the sum of its rows over agent counts, an agent count's the sum over sizes
    (`lab.results.stage_summaries` reads both); the size x failure-type table is
    `{(row.size, kind): n summed over rows for kind, n in row.failures.items()}`.
    `failures` counts episodes per failure type (types with no episode are left out).
    """

    __tablename__ = "stage_metrics"
    __table_args__ = (UniqueConstraint("run_id", "stage_index", "split", "size", "agents"),
                      CheckConstraint(_in("split", Split), name="split"))

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="runs.id")
    stage_index: int
    split: Split = Field(sa_type=AutoString)
    size: int
    # the boards' agent count (`Instance.num_agents`); 2 for a row inserted without one (an older archive's:
    # validation and dev boards were 2-agent boards, storage/migrations/versions/0013)
    agents: int = Field(sa_column_kwargs={"server_default": "2"})
    episodes: int
    valid: int
    optimal: int
    failures: dict[str, int] = Field(default_factory=dict, sa_type=JSONType)


class TrainingLog(SQLModel, table=True):
    """One logged training step of a stage; `metrics` holds what the trainer reported
    (reward, loss, kl, completion length, step time, ...)."""

    __tablename__ = "training_logs"
    __table_args__ = (Index(None, "run_id", "stage_index", "step"),)

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="runs.id")
    stage_index: int
    step: int
    metrics: dict[str, Any] = Field(default_factory=dict, sa_type=JSONType)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class Probe(SQLModel, table=True):
    """A config's boards answered by a checkpoint, measured for GRPO signal (`training.probe`): one row per
    cache key, a hash of (config, checkpoint, seed, boards, answers, temperature, and the run's thinking mode and
    completion length where not their defaults), so asking twice costs nothing.

    `checkpoint` is the policy as a stage row names it (relative to the runs root, or a spec such as `tiny`).
    `sizes` maps each map size to its measurement (valid and optimal answers, learnability, the shares of
    boards with no valid answer and with every answer valid); `completions` and `seconds` are what it cost.
    No run id: a probe belongs to a checkpoint, and every run of a policy shares its stage 0.
    """

    __tablename__ = "probes"
    __table_args__ = (UniqueConstraint("key"),)

    id: int | None = Field(default=None, primary_key=True)
    key: str
    config: dict[str, Any] = Field(sa_type=JSONType)
    checkpoint: str
    seed: int
    boards: int
    answers: int
    temperature: float
    sizes: dict[str, Any] = Field(default_factory=dict, sa_type=JSONType)
    completions: int
    seconds: float
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class Evaluation(SQLModel, table=True):
    """One split's evaluation of a stage under `key`, a hash of everything that determines its answers (the
    policy's files, the boards, the decoding and its seed where it samples: `training.shared`).

    A row with no `source_run_id` is the one evaluation that generates the answers of its key: the partial unique
    index lets one stage hold it at a time, so a second worker with the same key waits for the first instead of
    generating the same answers again. A row with a `source_run_id` is a stage that copied that evaluation's
    episodes and stage metrics into its own (stage 0 of runs that start from one checkpoint: evaluated once).
    No foreign key: like a probe it stays in its database (an archive carries a run's episodes, not the claim).
    """

    __tablename__ = "evaluations"
    __table_args__ = (
        UniqueConstraint("run_id", "stage_index", "split"),
        Index("uq_evaluations_key", "key", unique=True, sqlite_where=text("source_run_id IS NULL"),
              postgresql_where=text("source_run_id IS NULL")),
        CheckConstraint(_in("split", Split), name="split"),
    )

    id: int | None = Field(default=None, primary_key=True)
    key: str
    run_id: int
    stage_index: int
    split: Split = Field(sa_type=AutoString)
    source_run_id: int | None = None  # None: this stage generated the answers; else the run they were copied from
    source_stage_index: int | None = None
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)



class ShippedChoice(StrEnum):
    """Whether a lab takes in the shipped example run and studies (`lab.study.example`, docs/example.md): decided
    on its first `envlab serve` and kept."""

    TAKE = "take"  # every start imports what of them is still missing
    DECLINE = "decline"  # started with `--no-example`, or on a database that held a run already: never imported


class Shipped(SQLModel, table=True):
    """The lab's one row about the shipped example and studies: the choice its first `envlab serve` made, how far
    the import of the studies has come (`done` of `total` runs, under way while `done < total`: the command line
    and the Compare tab say so), and `studies`, the digest of the shipped databases once all of them are in (a later
    start that finds the same files reads none of them)."""

    __tablename__ = "shipped"
    __table_args__ = (CheckConstraint(_in("choice", ShippedChoice), name="choice"),)

    id: int = Field(default=1, primary_key=True)  # one row: two first starts at once store one choice
    choice: ShippedChoice = Field(sa_type=AutoString)
    done: int = 0
    total: int = 0
    studies: str = ""
    decided_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
