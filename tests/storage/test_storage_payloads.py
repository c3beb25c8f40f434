"""Job payloads: each kind's model round-trips through the queue, and a malformed payload is refused with a message
naming the field, where the lab queues one and where a handler reads a stored one."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine

from envsim.config import EnvConfig
from storage import queue
from storage.db import session
from storage.models import Job, JobKind
from storage.payloads import BenchmarkPayload, JobPayload, ProbePayload, ProposePayload, StagePayload

EVERY_KIND = [
    StagePayload(run_id=3, stage_index=2),
    ProposePayload(run_id=3, after_stage=1, replaces=7),
    BenchmarkPayload(run_id=3, stage_index=0),
    ProbePayload(run_id=3, proposal_id=7, checkpoint="stage-1", policy_path="/runs/3/stage-1", seed=5, boards=2,
                 answers=3, temperature=0.7, configs={"now": EnvConfig.default(num_instances=8)}),
]


def _stored(engine: Engine, kind: JobKind, payload: dict[str, Any]) -> Job:
    with session(engine) as s:
        job_id = queue.enqueue(s, kind, payload).id
    with session(engine) as s:
        return s.get(Job, job_id)


def test_every_kind_has_a_payload_model():
    assert sorted(type(p).kind for p in EVERY_KIND) == sorted(JobKind)


@pytest.mark.parametrize("payload", EVERY_KIND, ids=lambda p: p.kind)
def test_a_payload_reads_back_from_its_stored_job_as_it_was_queued(empty_lab: Engine, payload: JobPayload):
    job = _stored(empty_lab, payload.kind, payload.stored())
    assert type(payload).of(job) == payload
    assert job.payload["run_id"] == 3  # the JSON keys an archive rewrites (`lab.archive.JSON_IDS`)


def test_a_run_payload_says_its_stage_as_the_jobs_target():
    assert [getattr(p, "target", None) for p in EVERY_KIND] == [2, 1, 0, None]


@pytest.mark.parametrize(("model", "data", "message"), [
    (StagePayload, {"run_id": 1, "stage_index": -1},
     "payload: stage_index: Input should be greater than or equal to 0"),
    (StagePayload, {"run_id": "one", "stage_index": 1},
     "payload: run_id: Input should be a valid integer, unable to parse string as an integer"),
    (ProposePayload, {"run_id": 1, "after_stage": 0, "replace": 3}, "payload: replace: Extra inputs are not permitted"),
    (BenchmarkPayload, {"stage_index": 1}, "payload: run_id: Field required"),
    (ProbePayload, {"checkpoint": "tiny", "policy_path": "tiny", "configs": {}, "seed": 0, "boards": 0, "answers": 3,
                    "temperature": 0.7}, "payload: boards: Input should be greater than or equal to 1"),
])
def test_a_malformed_payload_is_refused_where_it_is_made_naming_the_field(model: type[JobPayload],
                                                                          data: dict[str, Any], message: str):
    with pytest.raises(ValueError) as refused:
        model.checked(data)
    assert str(refused.value) == message


def test_a_probe_payloads_config_is_checked_as_every_config_is():
    config = {**EnvConfig.default().model_dump(mode="json"), "hole_ratio": {"3": 5}}
    with pytest.raises(ValueError) as refused:
        ProbePayload.checked({"checkpoint": "tiny", "policy_path": "tiny", "configs": {"now": config}, "seed": 0,
                              "boards": 2, "answers": 3, "temperature": 0.7})
    assert str(refused.value) == ("payload: configs.now: Value error, hole_ratio covers sizes [3] but data_ratio "
                                  "covers [3, 4, 5, 6, 7, 8, 9, 10]; hole_ratio[3] = 5 is outside 0..0.5")


def test_a_stored_job_without_a_field_fails_to_read_naming_the_job_and_the_field(empty_lab: Engine):
    job = _stored(empty_lab, JobKind.STAGE, {"run_id": 4})
    with pytest.raises(ValueError) as refused:
        StagePayload.of(job)
    assert str(refused.value) == f"stage job {job.id}'s payload: stage_index: Field required"


def test_a_stored_job_with_a_key_its_model_no_longer_knows_still_reads(empty_lab: Engine):
    job = _stored(empty_lab, JobKind.PROPOSE, {"run_id": 4, "after_stage": 2, "engineer": "random"})
    assert ProposePayload.of(job) == ProposePayload(run_id=4, after_stage=2, replaces=None)


def test_a_probe_job_for_no_run_reads_with_none(empty_lab: Engine):
    job = _stored(empty_lab, JobKind.PROBE, {"checkpoint": "tiny", "policy_path": "tiny", "configs": {}, "seed": 0,
                                              "boards": 2, "answers": 3, "temperature": 0.7})
    assert (ProbePayload.of(job).run_id, ProbePayload.of(job).proposal_id) == (None, None)
