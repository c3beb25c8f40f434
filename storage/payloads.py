"""What a job is asked to do: one pydantic model per `JobKind` for its payload.

`Job.payload` is a plain JSON column (its shape depends on the job's kind, and the queue itself never looks
inside). The lab builds a payload from its kind's model when it queues a job, so a payload the model refuses is
never queued, and a job's handler reads it back through the same model (`JobPayload.of`), so a stored job that
lacks a field fails with a message naming that field instead of a `KeyError` deep inside a stage. Reading ignores
keys the model does not know (a job stored by an earlier version that wrote more), and every field added after
jobs were first stored has a default, so those jobs still read.
"""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envsim.config import EnvConfig
from storage.models import Job, JobKind

P = TypeVar("P", bound="JobPayload")


class JobPayload(BaseModel):
    """A job kind's payload; `kind` says which kind. A run's payloads say their stage as `target` (the job's
    `Job.target`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: ClassVar[JobKind]

    @classmethod
    def checked(cls: type[P], data: dict[str, Any], what: str = "payload") -> P:
        """The payload `data` describes; a ValueError naming the first field it gets wrong and what is legal."""
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            e = err.errors(include_url=False)[0]
            field = ".".join(map(str, e["loc"]))
            raise ValueError(f"{what}: {field}: {e['msg']}") from None

    @classmethod
    def of(cls: type[P], job: Job) -> P:
        """The payload of a stored `job` of this kind; a ValueError naming the job and the field it lacks or gets
        wrong."""
        known = {k: v for k, v in (job.payload or {}).items() if k in cls.model_fields}
        return cls.checked(known, f"{job.kind} job {job.id}'s payload")

    def stored(self) -> dict[str, Any]:
        """The JSON `Job.payload` holds."""
        return self.model_dump(mode="json")


class StagePayload(JobPayload):
    """`stage`: train stage `stage_index` of run `run_id` (stage 0: evaluate the run's starting policy)."""

    kind: ClassVar[JobKind] = JobKind.STAGE
    run_id: int
    stage_index: int = Field(ge=0)

    @property
    def target(self) -> int:
        return self.stage_index


class ProposePayload(JobPayload):
    """`propose`: ask run `run_id`'s engineer for the config after stage `after_stage`; `replaces` is the rejected
    proposal the new one answers (None for the first ask after a stage)."""

    kind: ClassVar[JobKind] = JobKind.PROPOSE
    run_id: int
    after_stage: int = Field(ge=0)
    replaces: int | None = None

    @property
    def target(self) -> int:
        return self.after_stage


class BenchmarkPayload(JobPayload):
    """`benchmark`: evaluate stage `stage_index`'s checkpoint of run `run_id` on the benchmark."""

    kind: ClassVar[JobKind] = JobKind.BENCHMARK
    run_id: int
    stage_index: int = Field(ge=0)

    @property
    def target(self) -> int:
        return self.stage_index


class ProbePayload(JobPayload):
    """`probe` (the Measure panel): measure each of `configs` (by label) on checkpoint `checkpoint`, loaded from
    `policy_path`, with `boards` boards per size and `answers` sampled answers each at `temperature`. `run_id`
    (None: no run's settings) says how the policy answers; `proposal_id` is the proposal the measurement serves."""

    kind: ClassVar[JobKind] = JobKind.PROBE
    run_id: int | None = None
    proposal_id: int | None = None
    checkpoint: str
    policy_path: str
    configs: dict[str, EnvConfig]
    seed: int
    boards: int = Field(ge=1)
    answers: int = Field(ge=1)
    temperature: float = Field(gt=0)
