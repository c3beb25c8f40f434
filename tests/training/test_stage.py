"""GRPO stages with a tiny policy and a tiny budget: the real trainer, the real rewards, the real database.

The policy is a very small Qwen3 (two layers, width 64) taught the answer format with a few supervised
steps first: a randomly initialised model never writes a plan, so every reward would be 0, every
advantage 0, and GRPO would (correctly) not move a single weight.
"""

from __future__ import annotations

import dataclasses
import errno
import importlib.util
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from sqlalchemy import Engine
from sqlmodel import select

from envsim.config import EnvConfig
from envsim.generator import generate
from envsim.prompts import compact_answer
from lab.engineers.bandit import bandit
from lab.jobs.worker import WorkerOptions, run_worker
from lab.loop import evidence_for
from storage import queue
from storage.db import make_engine, runs_root, session, upgrade
from storage.models import Episode, Job, Run, Stage, StageMetric, TrainingLog
from storage.settings import RunSettings
from training import advantage
from training import evaluate as evaluation
from training.policy import build_tiny, load_policy
from training.progress import Cancelled
from training.stage import (
    StageArgs,
    StageError,
    evaluation_restarts,
    grpo_config,
    installed_fields,
    merged,
    needs_fsdp,
    run_stage,
    run_stage_job,
    stage_args,
    stage_seed,
    start_dtype,
    start_policy,
    train,
    validation_boards,
)
from training.tokenizer import compact_text

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=2, head_dim=32)
CONFIG = EnvConfig.default(sizes=(3,), num_instances=8)
GRPO = dict(max_steps=3, num_generations=4, per_device_train_batch_size=8, learning_rate=1e-3, save_steps=2,
            temperature=1.0)
SETTINGS = RunSettings(stages=1, grpo=GRPO)  # a stage's settings outside a run: every default but GRPO's
PROBE = "model.layers.0.mlp.up_proj.weight"


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def writer(one_thread, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small policy that writes `Agent i : ...` lines (some right, most wrong), saved as a checkpoint."""
    torch.manual_seed(0)
    policy = build_tiny(0, **SMALL)
    tok = policy.tokenizer
    boards = generate(CONFIG, 16, seed=99)
    rows, prompt_lengths = [], []
    for b in boards:
        prompt = tok(policy.prompt(b))["input_ids"]
        answer = tok(compact_text(compact_answer(b.reference_plan, b)))["input_ids"] + [tok.eos_token_id]
        rows.append(prompt + answer)
        prompt_lengths.append(len(prompt))
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tok.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    for r, (row, n) in enumerate(zip(rows, prompt_lengths, strict=True)):
        ids[r, :len(row)] = torch.tensor(row)
        labels[r, n:len(row)] = torch.tensor(row[n:])
    mask = (torch.arange(width)[None] < torch.tensor(list(map(len, rows)))[:, None]).long()
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=3e-3)
    policy.model.train()
    for _ in range(40):
        loss = policy.model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return policy.save(tmp_path_factory.mktemp("writer") / "policy")


def _run(engine: Engine, policy: str, stages: int = 2, config: EnvConfig = CONFIG, **settings) -> int:
    with session(engine) as s:
        run = Run(name="t", policy=policy, engineer="fixed", engineer_backend="", seed=7,
                  # 2-agent validation and dev boards: the fewest, and the first sets' (`FIRST_AGENTS`)
                  settings={"stages": stages, "grpo": GRPO, "validation_boards": 8, "validation_agents": [2],
                            **settings})
        s.add(run)
        s.commit()
        for k in range(stages):
            s.add(Stage(run_id=run.id, index=k, config=config.model_dump(mode="json"), status="queued"))
        s.commit()
        return run.id


def _run_dir(engine: Engine, run_id: int) -> Path:
    with session(engine) as s:
        return runs_root(engine) / s.get(Run, run_id).uuid


def _probe(policy) -> torch.Tensor:
    return dict(policy.model.named_parameters())[PROBE].detach().clone()


def test_a_grpo_stage_moves_the_weights_logs_each_step_and_resumes_after_a_cancel(empty_lab: Engine, writer: Path,
                                                                                  tmp_path: Path):
    run_id = _run(empty_lab, str(writer))
    args = StageArgs(run_id=run_id, stage_index=1, seed=stage_seed(7, 1), policy=str(writer), config=CONFIG,
                     run_dir=_run_dir(empty_lab, run_id), run_uuid="u", settings=SETTINGS)
    reports: list[tuple] = []

    def cancel_at_step_2(step, total, line=None, result=None) -> bool:
        reports.append((step, total, line, result))
        return step >= 2

    policy = load_policy(str(writer))
    before = _probe(policy)
    with pytest.raises(Cancelled, match=r"cancelled at step 2/3; requeue to resume from .*checkpoint-2"):
        train(empty_lab, args, policy, cancel_at_step_2)
    assert (args.trainer_dir / "checkpoint-2").is_dir()  # saved on the way out
    assert not args.policy_dir.exists()
    assert (2, 3, "saved " + str(args.trainer_dir / "checkpoint-2"),
            {"checkpoint": str(args.trainer_dir / "checkpoint-2")}) in reports

    # A new attempt (a fresh process would load the same starting policy) resumes from checkpoint-2.
    reports.clear()
    policy = load_policy(str(writer))
    summary = train(empty_lab, args, policy, lambda *a, **k: reports.append(a + (k.get("result"),)) and False)
    assert summary["steps"] == 3 and summary["resumed_from"] == str(args.trainer_dir / "checkpoint-2")
    assert summary["train_runtime"] > 0
    assert (0, None, f"resuming from {args.trainer_dir / 'checkpoint-2'}",
            {"checkpoint": str(args.trainer_dir / "checkpoint-2")}) in reports

    trained = load_policy(str(args.policy_dir))
    assert not torch.equal(_probe(trained), before)
    assert torch.equal(_probe(trained), _probe(policy))

    with session(empty_lab) as s:
        logs = s.exec(select(TrainingLog).where(TrainingLog.run_id == run_id).order_by(TrainingLog.id)).all()
    assert [(log.stage_index, log.step) for log in logs] == [(1, 1), (1, 2), (1, 3)]
    for log in logs:
        assert {"reward", "reward_std", "loss", "rewards/validity_reward/mean", "rewards/format_reward/mean",
                "completions/mean_length", "step_time", "learning_rate"} <= set(log.metrics)
    assert any(log.metrics["reward_std"] > 0 for log in logs)  # some group had something to learn from
    # each step's row keeps its 2 boards' advantages: the resumed attempt's step 3 beside the first attempt's 1 and 2
    assert [sum(r["groups"] for r in log.metrics[advantage.CELLS]) for log in logs] == [2, 2, 2]
    assert advantage.read([log.metrics for log in logs]) == {(2, 3): advantage.CellSignal(
        6, 24, sum(r["abs_advantage"] for log in logs for r in log.metrics[advantage.CELLS]))}


MIXED = EnvConfig(data_ratio={3: 0.5, 4: 0.5}, hole_ratio={3: 0.2, 4: 0.2}, wait_ratio={3: 0.25, 4: 0.25},
                  agent_ratio={2: 0.5, 3: 0.5}, num_instances=8)


def test_a_stage_records_trls_advantages_per_cell_of_its_boards_and_the_bandit_reads_them(empty_lab: Engine,
                                                                                         writer: Path):
    run_id = _run(empty_lab, str(writer), config=MIXED)
    args = StageArgs(run_id=run_id, stage_index=1, seed=stage_seed(7, 1), policy=str(writer), config=MIXED,
                     run_dir=_run_dir(empty_lab, run_id), run_uuid="u", settings=SETTINGS)
    train(empty_lab, args, load_policy(str(writer)), lambda *a, **k: False)

    with session(empty_lab) as s:
        rows = [log.metrics for log in s.exec(select(TrainingLog).where(TrainingLog.run_id == run_id)
                                              .order_by(TrainingLog.step))]
        run = s.get(Run, run_id)
        evidence = evidence_for(s, run, after_stage=1)
    assert len(rows) == 3 and all(advantage.CELLS in row for row in rows)
    cells = advantage.read(rows)
    boards = {(b.num_agents, b.size) for b in generate(MIXED, 8, seed=args.seed)}
    assert boards == {(2, 3), (3, 3), (2, 4), (3, 4)} and set(cells) <= boards
    # 3 steps of 8 answers, 4 to a board: 2 boards (prompt groups) a step, 6 in all
    assert sum(c.groups for c in cells.values()) == 6 and sum(c.completions for c in cells.values()) == 24
    assert all(sum(r["groups"] for r in row[advantage.CELLS]) == 2 for row in rows)
    assert all(math.isfinite(c.abs_advantage) and c.abs_advantage >= 0 for c in cells.values())
    assert any(c.abs_advantage > 0 for c in cells.values())  # some group had something to learn from

    assert evidence.current.cells == cells and evidence.history[0].cells is None  # stage 0 trains nothing
    answer = bandit(evidence, seed=0)
    assert answer.error is None and answer.projection.config.agent_counts == (2, 3)
    for (k, s), c in cells.items():
        assert f"{k} agents, size {s}: stage 1: r {c.mean:.3f} ({c.groups} group" in answer.rationale


def test_advantages_scored_after_the_last_logged_step_go_into_that_steps_row(empty_lab: Engine, writer: Path):
    run_id = _run(empty_lab, str(writer))
    args = StageArgs(run_id=run_id, stage_index=1, seed=stage_seed(7, 1), policy=str(writer), config=CONFIG,
                     run_dir=_run_dir(empty_lab, run_id), run_uuid="u",
                     settings=RunSettings(stages=1, grpo=dict(GRPO, logging_steps=2)))
    train(empty_lab, args, load_policy(str(writer)), lambda *a, **k: False)
    with session(empty_lab) as s:
        rows = s.exec(select(TrainingLog).where(TrainingLog.run_id == run_id).order_by(TrainingLog.step)).all()
    assert [(row.step, sum(r["groups"] for r in row.metrics[advantage.CELLS])) for row in rows] == [(2, 4), (3, 2)]
    assert set(rows[1].metrics) == {advantage.CELLS}  # step 3 logged nothing else


def test_a_lora_stage_trains_adapters_and_saves_a_whole_model(empty_lab: Engine, writer: Path, tmp_path: Path):
    run_id = _run(empty_lab, str(writer), lora=4)
    args = stage_args(empty_lab, run_id, 0)
    assert args.lora == 4
    # 8 answers a board: the writer's answers read as a plan about one time in ten, so a group of 8 mixes rewards
    # (and moves the adapters) more often than not, and 3 steps of 2 groups almost surely hold one
    args = StageArgs(run_id=run_id, stage_index=1, seed=stage_seed(7, 1), policy=str(writer), config=CONFIG,
                     run_dir=_run_dir(empty_lab, run_id), run_uuid="u",
                     settings=RunSettings(stages=2, lora=4, grpo=dict(GRPO, num_generations=8,
                                                                      per_device_train_batch_size=16)))
    policy = load_policy(str(writer))
    before = {name: p.detach().clone() for name, p in policy.model.named_parameters()}
    summary = train(empty_lab, args, policy, lambda *a, **k: False)
    assert summary["steps"] == 3
    assert not (args.policy_dir / "adapter_config.json").exists()  # the adapters are folded in
    trained = load_policy(str(args.policy_dir))
    after = dict(trained.model.named_parameters())
    assert set(after) == set(before)  # the same plain model, no adapter weights left
    changed = [name for name in before if not torch.equal(before[name], after[name])]
    # LoRA touches only the linear layers' weights: embeddings and norms stay as they were
    assert changed and all(name.endswith("proj.weight") for name in changed)


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


def test_a_bf16_autocast_stage_saves_its_float32_master_weights_and_the_next_stage_starts_from_them(
        empty_lab: Engine, writer: Path):
    """A full fine-tune trains float32 master weights under bf16 autocast (here on the CPU); at a small learning
    rate most of its updates are below half a bf16 step, so a policy saved in bf16 would round them away at the
    stage boundary. The saved policy is float32 and equal, weight for weight, to the master weights TRL checkpointed
    at the last step, and the next stage loads exactly those."""
    run_id = _run(empty_lab, str(writer))
    settings = RunSettings(stages=3, grpo=dict(GRPO, max_steps=2, learning_rate=1e-5, bf16=True))
    args = StageArgs(run_id=run_id, stage_index=1, seed=stage_seed(7, 1), policy=str(writer), config=CONFIG,
                     run_dir=_run_dir(empty_lab, run_id), run_uuid="u", settings=settings)
    policy = start_policy(args, "cpu")
    start = {name: p.detach().clone() for name, p in policy.model.named_parameters()}
    train(empty_lab, args, policy, lambda *a, **k: False)
    master = _weights(args.trainer_dir / "checkpoint-2")  # the trainer's float32 weights after its last step
    saved = _weights(args.policy_dir)
    assert set(saved) == set(master)
    assert {t.dtype for t in saved.values()} == {torch.float32}
    assert all(torch.equal(saved[name], master[name]) for name in master)
    # what bf16 would have lost: the weights the stage moved whose bf16 value did not move (most of them)
    moved = {name: saved[name] != start[name] for name in saved}
    lost = sum(int((m & (saved[name].bfloat16() == start[name].bfloat16())).sum()) for name, m in moved.items())
    assert lost > 0.5 * sum(int(m.sum()) for m in moved.values()) > 0  # 85% here
    # the next stage starts from exactly those weights
    following = start_policy(dataclasses.replace(args, stage_index=2, policy=str(args.policy_dir)), "cpu")
    loaded = dict(following.model.named_parameters())
    assert all(loaded[name].dtype == torch.float32 and torch.equal(loaded[name], master[name]) for name in master)


def test_lora_merges_into_a_float32_copy_of_a_bf16_base_and_later_stages_load_float32():
    """LoRA on a bf16 base (as a chat model loads on a GPU): its adapters' product, below half a bf16 step of the
    weights, survives the merge in float32 and would round away in bf16. A LoRA stage from stage 2 on loads its
    starting checkpoint (a trained stage's, float32) in float32."""
    from peft import get_peft_model

    from training.policy import lora_config

    torch.manual_seed(0)
    base = build_tiny(0, **SMALL).model.to(torch.bfloat16)
    model = get_peft_model(base, lora_config(4))
    layer = model.base_model.model.model.layers[0].mlp.up_proj
    with torch.no_grad():
        layer.lora_B["default"].weight.fill_(1e-5)
    base_weight = layer.base_layer.weight.detach().float().clone()
    delta = layer.get_delta_weight("default").detach().float()
    assert delta.abs().max() < 2e-4 and layer.lora_A["default"].weight.dtype == torch.float32
    whole = merged(model)
    weight = dict(whole.named_parameters())[PROBE]
    assert weight.dtype == torch.float32 and not hasattr(whole, "peft_config")
    assert torch.equal(weight.detach(), base_weight + delta)
    kept_in_bf16 = (base_weight + delta).bfloat16().float() != base_weight
    assert kept_in_bf16.float().mean() < 0.1  # in bf16 nearly all of the stage's update would be gone

    args = StageArgs(run_id=1, stage_index=1, seed=0, policy="", config=CONFIG, run_dir=Path("r"), run_uuid="u",
                     settings=RunSettings(stages=3, lora=4))
    assert start_dtype(args) is None  # stage 1: the run's policy as it comes (bf16 on a GPU)
    assert start_dtype(dataclasses.replace(args, stage_index=2)) == torch.float32
    assert start_dtype(dataclasses.replace(args, settings=RunSettings(stages=3))) == torch.float32  # full


def test_stage_jobs_through_the_worker_evaluate_then_train_and_record(empty_lab: Engine, writer: Path, tmp_path: Path):
    run_id = _run(empty_lab, str(writer), grpo=dict(GRPO, max_steps=2))
    ran = []
    for k in (0, 1):
        with session(empty_lab) as s:
            queue.enqueue(s, "stage", {"run_id": run_id, "stage_index": k})
        ran.append(run_worker(empty_lab, {"stage": run_stage_job}, WorkerOptions(poll_s=0.01, once=True)))
    assert ran == [1, 1]
    with session(empty_lab) as s:
        jobs = s.exec(select(Job).order_by(Job.id)).all()
        stages = s.exec(select(Stage).where(Stage.run_id == run_id).order_by(Stage.index)).all()
        episodes = s.exec(select(Episode).where(Episode.run_id == run_id)).all()
        metrics = s.exec(select(StageMetric).where(StageMetric.run_id == run_id)).all()
        steps = s.exec(select(TrainingLog.step).where(TrainingLog.run_id == run_id)).all()
    assert [(j.status, j.error) for j in jobs] == [("done", None), ("done", None)]
    run_dir = _run_dir(empty_lab, run_id)
    assert [(st.status, st.checkpoint) for st in stages] == [
        ("done", str(writer.resolve())), ("done", f"{run_dir.name}/stage-1/policy")]
    assert all(st.started_at <= st.finished_at for st in stages)
    assert [(j.result["stage_index"], j.result["episodes"], j.result["train"].get("steps")) for j in jobs] == [
        (0, 8, None), (1, 8, 2)]
    sizes = [b.size for b in validation_boards(8, agents=(2,))]
    assert sizes == list(range(3, 11))  # spread over the set: one board per size
    assert sorted((e.stage_index, e.size) for e in episodes) == sorted((k, s) for k in (0, 1) for s in sizes)
    assert {(m.stage_index, m.episodes) for m in metrics} == {(k, 1) for k in (0, 1)}
    assert len(metrics) == 16
    assert sorted(steps) == [1, 2]
    assert "evaluating on 8 validation boards" in jobs[1].log_tail and "step 2/2 reward" in jobs[1].log_tail

    # An attempt after one that died between storing its evaluation and ending its job: the trained policy and
    # the stored evaluation are kept, neither redone.
    lines: list[str] = []
    again = run_stage_job(empty_lab, jobs[1], lambda step, total, line=None, result=None: bool(lines.append(line)))
    assert again == jobs[1].result
    assert again["train"]["steps"] == 2 and again["train"]["train_runtime"] > 0
    assert f"stage 1 was trained by an earlier attempt: loading {run_dir / 'stage-1' / 'policy'}" in lines
    assert "the validation results of an earlier attempt are stored already: kept" in lines
    with session(empty_lab) as s:
        assert len(s.exec(select(Episode).where(Episode.run_id == run_id)).all()) == 16


def test_an_evaluation_handed_back_with_nothing_stored_starts_again_from_its_first_board_and_says_so(
        empty_lab: Engine, writer: Path, monkeypatch):
    """Stage 0's job, handed back at board 5 of its 8 validation boards with none of them stored (its worker got
    SIGTERM; recorded here through the queue's own calls), is claimed again: the new attempt builds the boards (no
    cache on this machine: its log says how many at each quarter), says that it evaluates again from the first board
    and why, and stores each board's episode once. A first attempt's line says neither."""
    monkeypatch.setenv("ENVLAB_CACHE", "")  # no machine cache: the standard set of 240 boards is built here
    run_id = _run(empty_lab, str(writer), stages=1)
    starts = "evaluating on 8 validation boards"
    with session(empty_lab) as s:
        job = queue.enqueue(s, "stage", {"run_id": run_id, "stage_index": 0})
        queue.claim(s, "w1")
        queue.heartbeat(s, job.id, 0, 8, starts)
        queue.heartbeat(s, job.id, 5, 8)
        queue.hand_back(s, job.id, "its worker got SIGTERM")
    assert run_worker(empty_lab, {"stage": run_stage_job}, WorkerOptions(poll_s=0.01, once=True)) == 1
    with session(empty_lab) as s:
        job = s.get(Job, job.id)
        episodes = s.exec(select(Episode).where(Episode.run_id == run_id)).all()
    assert (job.status, job.attempts, len(episodes), len({e.instance_id for e in episodes})) == ("done", 1, 8, 8)
    lines = job.log_tail.splitlines()
    assert lines[:3] == [starts, "-- handed back at step 5 of 8: its worker got SIGTERM (the attempt is not counted)",
                         "reading the validation and dev boards of 2 agents (built once on this machine, then read "
                         "from its cache)"]
    assert [line for line in lines if line.startswith("built ")] == [
        f"built {n} of 240 validation boards (once on this machine)" for n in (60, 120, 180, 240)]
    assert (f"{starts} again from the first board: an earlier attempt stopped at board 5 of 8, and none of its "
            "boards are stored") in lines
    assert evaluation_restarts("", starts, 0) == evaluation_restarts("evaluating on 80 validation boards", starts,
                                                                      0) == ""
    assert evaluation_restarts(f"{starts}\n-- requeued after attempt 1 ended failed: x", starts, 0) == (
        " again from the first board: an earlier attempt stopped before its end, and none of its boards are stored")
    assert evaluation_restarts(f"{starts}\n-- handed back at step 6 of 8: the disk is full", starts, 6) == (
        " from board 7 on: an earlier attempt stopped at board 6 of 8, and the 6 boards it scored are stored")


def test_an_evaluation_stopped_part_way_keeps_what_it_scored_and_goes_on_from_there(empty_lab: Engine, writer: Path,
                                                                                  monkeypatch):
    """Stage 0's validation, 3 boards a batch, stopped after its second batch: exactly the 6 episodes it scored are
    stored (as an evaluation never stopped answers them) and no metrics. The next attempt answers only the last batch,
    says from which board it goes on, and stores each board once: its episodes, metrics and result are those of an
    evaluation of the same policy never stopped."""
    monkeypatch.setattr(evaluation, "BATCH_SIZE", 3)
    run_id = _run(empty_lab, str(writer), stages=1)
    args = stage_args(empty_lab, run_id, 0)
    boards = validation_boards(8, args.validation_per_size, args.run_dir.parent, args.validation_agents)
    whole = evaluation.evaluate(start_policy(args, "cpu"), boards, batch_size=3)
    answers = {r.instance.id: r.completion for r in whole}
    seen: list[tuple[int, int | None, str | None]] = []

    def stop_at(board: int | None) -> Callable[..., bool]:
        def progress(step: int, total: int | None, line: str | None = None, result: dict | None = None) -> bool:
            seen.append((step, total, line))
            return total == 8 and step == board
        return progress

    def stored() -> tuple[list[Episode], list[StageMetric]]:
        with session(empty_lab) as s:
            return (list(s.exec(select(Episode).where(Episode.run_id == run_id))),
                    list(s.exec(select(StageMetric).where(StageMetric.run_id == run_id))))

    with pytest.raises(Cancelled):
        run_stage(empty_lab, args, stop_at(6))
    episodes, metrics = stored()
    assert len(episodes) == 6 and metrics == []
    assert {e.instance_id: e.completion for e in episodes}.items() <= answers.items()
    seen.clear()
    result = run_stage(empty_lab, args, stop_at(None))
    starts = "evaluating on 8 validation boards"
    assert [(step, total) for step, total, _ in seen if total == 8] == [(6, 8), (8, 8), (8, 8)]  # one batch answered
    assert f"{starts} from board 7 on: an earlier attempt stopped, and the 6 boards it scored are stored" in [
        line for _, _, line in seen]
    episodes, metrics = stored()
    assert sorted(e.instance_id for e in episodes) == sorted(b.id for b in boards)  # each board once
    assert {e.instance_id: e.completion for e in episodes} == answers
    assert {(m.size, m.agents): (m.episodes, m.valid, m.optimal, m.failures) for m in metrics} == {
        cell: (t.episodes, t.valid, t.optimal, t.failures) for cell, t in evaluation.cell_metrics(whole).items()}
    assert (result["episodes"], result["valid_rate"], result["optimal_rate"]) == (
        8, sum(r.outcome.valid for r in whole) / 8, sum(r.outcome.optimal for r in whole) / 8)


def test_a_full_disk_mid_evaluation_loses_only_the_batch_under_way(empty_lab: Engine, writer: Path, monkeypatch):
    """The disk fills as stage 0 stores its second batch of 3 validation episodes (ENOSPC at that write): the worker
    hands the job back with the first batch stored, and the next attempt goes on from board 4, says so, and answers
    only the boards left (the first batch is not written again): 8 episodes, each board once."""
    from lab.jobs import worker

    monkeypatch.setattr(evaluation, "BATCH_SIZE", 3)
    monkeypatch.setattr(worker, "FULL_DISK_WAIT_S", 0.01)
    run_id = _run(empty_lab, str(writer), stages=1)
    real, writes = evaluation.store_episodes, []

    def fills_at_the_second(*args, **kwargs):
        writes.append(len(args[-1]))
        if len(writes) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluation, "store_episodes", fills_at_the_second)
    with session(empty_lab) as s:
        job = queue.enqueue(s, "stage", {"run_id": run_id, "stage_index": 0})
    # handed back, then claimed again by the same worker (`once` runs until the queue is empty)
    assert run_worker(empty_lab, {"stage": run_stage_job}, WorkerOptions(poll_s=0.01, once=True)) == 2
    with session(empty_lab) as s:
        job = s.get(Job, job.id)
        episodes = s.exec(select(Episode).where(Episode.run_id == run_id, Episode.split == "validation")).all()
    assert job.status == "done" and writes == [3, 3, 3, 2]  # the failed write's batch answered again, no other
    assert "-- handed back at step 3 of 8: the disk is full" in job.log_tail
    assert sorted(e.instance_id for e in episodes) == sorted({e.instance_id for e in episodes}) and len(episodes) == 8
    assert ("evaluating on 8 validation boards from board 4 on: an earlier attempt stopped at board 3 of 8, and the 3 "
            "boards it scored are stored") in job.log_tail.splitlines()


def test_the_dev_boards_are_evaluated_after_the_validation_boards_and_change_nothing_else(
        empty_lab: Engine, writer: Path):
    """A run with dev boards and one without, same seed: the same trained weights and validation answers; the dev
    episodes are extra, none on a validation board."""
    runs = [_run(empty_lab, str(writer), grpo=dict(GRPO, max_steps=1), dev_per_size=3), _run(empty_lab, str(writer),
                                                                                        grpo=dict(GRPO, max_steps=1))]
    for run_id in runs:
        for k in (0, 1):
            with session(empty_lab) as s:
                queue.enqueue(s, "stage", {"run_id": run_id, "stage_index": k})
            assert run_worker(empty_lab, {"stage": run_stage_job}, WorkerOptions(poll_s=0.01, once=True)) == 1
    with session(empty_lab) as s:
        def episodes(run_id: int, split: str) -> list[tuple[int, str, str]]:
            return [(e.stage_index, e.instance_id, e.completion) for e in s.exec(
                select(Episode).where(Episode.run_id == run_id, Episode.split == split).order_by(Episode.id))]

        assert episodes(runs[0], "validation") == episodes(runs[1], "validation") and episodes(runs[1], "dev") == []
        dev = episodes(runs[0], "dev")
        metrics = s.exec(select(StageMetric).where(StageMetric.run_id == runs[0], StageMetric.split == "dev")).all()
        log = s.exec(select(Job.log_tail).order_by(Job.id)).first()
    assert len(dev) == 2 * 24 and len(metrics) == 2 * 8  # 3 boards per size, sizes 3..10, stages 0 and 1
    assert not {i for _, i, _ in dev} & {b.id for b in validation_boards(agents=(2,))}  # none of its validation boards
    assert "evaluating on 24 dev boards (what the engineer reads)" in log
    trained = [load_policy(str(_run_dir(empty_lab, r) / "stage-1" / "policy")) for r in runs]
    assert torch.equal(_probe(trained[0]), _probe(trained[1]))


def test_a_run_validated_at_two_agent_counts_stores_and_shows_each_counts_rates(empty_lab: Engine, writer: Path):
    """`validation_agents` (2, 3): 4 validation boards spread over the (count, size) cells, 3 dev boards per (count,
    size); every stage stores metrics at both counts, and the Stage review's note adds the per-count table."""
    from lab.pages.review import review

    run_id = _run(empty_lab, str(writer), grpo=dict(GRPO, max_steps=1), validation_boards=4, dev_per_size=3,
                  validation_agents=[2, 3])
    for k in (0, 1):
        with session(empty_lab) as s:
            queue.enqueue(s, "stage", {"run_id": run_id, "stage_index": k})
        assert run_worker(empty_lab, {"stage": run_stage_job}, WorkerOptions(poll_s=0.01, once=True)) == 1
    with session(empty_lab) as s:
        assert [(j.status, j.error) for j in s.exec(select(Job))] == [("done", None)] * 2
        metrics = s.exec(select(StageMetric).where(StageMetric.run_id == run_id)).all()
    cells = {(m.stage_index, m.split, m.agents, m.size): m.episodes for m in metrics}
    # 480 boards (30 per (count, size)), every 120th: sizes 3 and 7 at 2 agents, then at 3
    assert {key: n for key, n in cells.items() if key[1] == "validation"} == {
        (k, "validation", agents, size): 1 for k in (0, 1) for agents in (2, 3) for size in (3, 7)}
    assert {key: n for key, n in cells.items() if key[1] == "dev"} == {
        (k, "dev", agents, size): 3 for k in (0, 1) for agents in (2, 3) for size in range(3, 11)}
    assert (_run_dir(empty_lab, run_id).parent / "validation-30-agents-2-3.jsonl").is_file()
    note = review(empty_lab, run_id, 1, plots=False)["note"]
    assert "over 4 validation boards" in note and "| agents | boards | valid | optimal |" in note
    assert [line.split(" | ")[:2] for line in note.splitlines() if line.startswith("| 2 ") or line.startswith(
        "| 3 ")] == [["| 2", "2"], ["| 3", "2"]]


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_a_missing_or_corrupt_starting_checkpoint_fails_the_job_with_a_clear_error(empty_lab: Engine, writer: Path,
                                                                                   tmp_path: Path, damage: str):
    broken = tmp_path / "stage-0-policy"
    if damage == "truncated":
        broken.mkdir()
        for f in writer.iterdir():
            data = f.read_bytes()
            (broken / f.name).write_bytes(data[: len(data) // 2] if f.suffix == ".safetensors" else data)
    run_id = _run(empty_lab, str(writer))
    with session(empty_lab) as s:
        stage0 = s.exec(select(Stage).where(Stage.run_id == run_id, Stage.index == 0)).one()
        stage0.status, stage0.checkpoint = "done", str(broken)
        s.add(stage0)
        s.commit()
        job_id = queue.enqueue(s, "stage", {"run_id": run_id, "stage_index": 1}).id
    assert run_worker(empty_lab, {"stage": run_stage_job}, WorkerOptions(poll_s=0.01, once=True)) == 1
    with session(empty_lab) as s:
        job = s.get(Job, job_id)
        stage1 = s.exec(select(Stage).where(Stage.run_id == run_id, Stage.index == 1)).one()
    assert job.status == "failed" and stage1.status == "failed"
    assert job.error.startswith("training.stage.StageError: cannot load the starting policy of stage 1 "
                                f"(stage 0's checkpoint '{broken}'): ")
    why = "no checkpoint folder there" if damage == "missing" else "truncated safetensors file"
    assert why in job.error


def test_a_stage_whose_previous_stage_has_no_checkpoint_is_refused(empty_lab: Engine, tmp_path: Path):
    run_id = _run(empty_lab, "tiny")
    with pytest.raises(StageError, match="stage 0 of run 1 has no checkpoint \\(it is queued\\); run it first"):
        stage_args(empty_lab, run_id, 1)
    args = stage_args(empty_lab, run_id, 0)
    grpo = args.settings.grpo
    assert (args.policy, args.seed, grpo) == ("tiny", stage_seed(7, 0), GRPO)
    assert stage_seed(7, 0) != stage_seed(7, 1) != stage_seed(8, 1)


def test_grpo_config_is_our_defaults_under_the_runs_overrides(tmp_path: Path):
    args = StageArgs(run_id=1, stage_index=2, seed=123, policy="x", config=CONFIG, run_dir=tmp_path, run_uuid="u")
    config = grpo_config(args, {"num_generations": 2, "report_to": ["tensorboard"], "use_vllm": True,
                                "vllm_mode": "server"}, max_completion_length=40, prompt_style="compact")
    assert (config.output_dir, config.seed, config.max_completion_length, config.num_generations) == (
        str(tmp_path / "stage-2" / "trl"), 123, 40, 2)
    assert (config.use_cpu, config.bf16, config.learning_rate, config.reward_weights) == (
        not torch.cuda.is_available(), False, 2e-5, [1.0, 1.0, 0.2, 0.2])
    assert (config.per_device_train_batch_size, config.scale_rewards) == (32, "none")
    assert config.report_to == ["tensorboard"] and config.vllm_mode == "server"
    assert config.use_vllm is (importlib.util.find_spec("vllm") is not None)  # no vLLM here: transformers
    llm = grpo_config(args, {}, 40)  # an LLM: TRL's own learning rate and reward scaling
    assert (llm.learning_rate, llm.num_generations, llm.per_device_train_batch_size, llm.scale_rewards) == (
        1e-6, 4, 8, "group")
    with pytest.raises(StageError, match=r"settings\['grpo'\] has 'max_stepz': not GRPOConfig fields"):
        grpo_config(args, {"max_stepz": 3}, 40)


def test_the_stage_command_evaluates_then_trains_in_two_processes_and_records_each_step_once(writer: Path,
                                                                                          tmp_path: Path):
    """The stage command outside any worker: stage 0 evaluated by `python -m training.stage`, then stage 1 trained
    data-parallel as `accelerate launch` does it on GPUs, here with torchrun and gloo on the CPU; the advantages the
    bandit reads are gathered from both processes and written once."""
    url = f"sqlite:///{tmp_path / 'envlab.db'}"
    engine = make_engine(url)
    upgrade(engine)
    run_id = _run(engine, str(writer), validation_boards=2)
    stage = ["--run", str(run_id), "--db", url, "--stage"]
    two = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "training.stage", "--"]
    for command in ([sys.executable, "-m", "training.stage", *stage, "0"], [*two, *stage, "1"]):  # evaluate, train
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, env={**os.environ,
                              "OMP_NUM_THREADS": "1"}, cwd=Path(__file__).resolve().parents[2])
        assert done.returncode == 0, done.stderr[-3000:]
        if command[-1] == "0":
            assert f"'checkpoint': '{writer.resolve()}', 'episodes': 2" in done.stdout
            with session(engine) as s:
                stage0 = s.exec(select(Stage).where(Stage.run_id == run_id, Stage.index == 0)).one()
            assert (stage0.status, stage0.checkpoint) == ("done", str(writer.resolve()))
    with session(engine) as s:
        logs = s.exec(select(TrainingLog).where(TrainingLog.run_id == run_id)).all()
        episodes = s.exec(select(Episode).where(Episode.run_id == run_id, Episode.stage_index == 1)).all()
        stage = s.exec(select(Stage).where(Stage.run_id == run_id, Stage.index == 1)).one()
    assert sorted(log.step for log in logs) == [1, 2, 3]  # one row per step: only the main process writes
    # the bandit's evidence: each step's row holds TRL's advantages of both processes' answers (gathered), once
    assert [sum(r["groups"] for r in log.metrics[advantage.CELLS]) for log in sorted(logs, key=lambda g: g.step)] \
        == [4, 4, 4]  # 16 answers a step, 4 to a board
    cells = advantage.read([log.metrics for log in logs])
    assert set(cells) == {(2, 3)} and cells[(2, 3)].completions == 48 and cells[(2, 3)].groups == 12
    assert (stage.status, len(episodes)) == ("done", 2)
    # two processes of 8 completions each: 3 steps read 48 of the stage's 8 boards x 4 generations = 1.5 epochs
    summary = (_run_dir(engine, run_id) / "stage-1" / "trained.json").read_text()
    assert '"epoch": 1.5' in summary
    engine.dispose()


def test_a_stage_killed_mid_training_and_resumed_logs_each_step_once(empty_lab: Engine, writer: Path):
    run_id = _run(empty_lab, str(writer))
    args = StageArgs(run_id=run_id, stage_index=1, seed=stage_seed(7, 1), policy=str(writer), config=CONFIG,
                     run_dir=_run_dir(empty_lab, run_id), run_uuid="u", settings=SETTINGS)

    def killed_after_logging_step_3(step, total, line=None, result=None) -> bool:
        if line and line.startswith("step 3/3"):
            raise SystemExit("killed")  # as kill -9 would: nothing after this runs, checkpoint-2 is the last
        return False

    with pytest.raises(SystemExit):
        train(empty_lab, args, load_policy(str(writer)), killed_after_logging_step_3)
    with session(empty_lab) as s:
        assert sorted(s.exec(select(TrainingLog.step).where(TrainingLog.run_id == run_id)).all()) == [1, 2, 3]
    summary = train(empty_lab, args, load_policy(str(writer)), lambda *a, **k: False)
    assert summary["resumed_from"] == str(args.trainer_dir / "checkpoint-2")
    with session(empty_lab) as s:
        logs = s.exec(select(TrainingLog).where(TrainingLog.run_id == run_id).order_by(TrainingLog.step)).all()
    assert [log.step for log in logs] == [1, 2, 3]  # step 3 once: the new attempt's row


def test_a_trained_stage_marker_of_another_run_or_config_is_never_adopted(tmp_path: Path):
    mine = StageArgs(run_id=1, stage_index=1, seed=1, policy="x", config=CONFIG, run_dir=tmp_path, run_uuid="a")
    mine.stage_dir.mkdir(parents=True)
    other_run = StageArgs(run_id=1, stage_index=1, seed=1, policy="x", config=CONFIG, run_dir=tmp_path, run_uuid="b")
    other_config = StageArgs(run_id=1, stage_index=1, seed=1, policy="x", run_dir=tmp_path, run_uuid="a",
                             config=CONFIG.model_copy(update={"num_instances": 16}))
    for marker in (other_run.marker_key(), other_config.marker_key(), {"steps": 3}):
        mine.trained_marker.write_text(json.dumps({**marker, "steps": 3}))
        assert mine.adoptable_marker() is None
    mine.trained_marker.write_text(json.dumps({**mine.marker_key(), "steps": 3}))
    assert mine.adoptable_marker() == {"steps": 3}


def _stage_job(engine: Engine, run_id: int, k: int) -> int:
    with session(engine) as s:
        return queue.enqueue(s, "stage", {"run_id": run_id, "stage_index": k}, run_id=run_id, target=k).id


def test_workers_anywhere_find_a_runs_files_and_two_databases_in_one_folder_keep_their_own(
        writer: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    folder = tmp_path / "lab"
    engines = {name: make_engine(str(folder / f"{name}.db")) for name in ("a", "b")}
    for engine in engines.values():
        upgrade(engine)
    runs = {name: _run(engine, str(writer), stages=3, grpo=dict(GRPO, max_steps=2), validation_boards=2)
            for name, engine in engines.items()}
    assert runs == {"a": 1, "b": 1}  # ids restart in every database
    for where, engine in zip(("w1", "w2"), engines.values(), strict=True):
        (tmp_path / where).mkdir()
        monkeypatch.chdir(tmp_path / where)  # each lab's worker in a working directory of its own
        for k in (0, 1):
            _stage_job(engine, 1, k)
            assert run_worker(engine, {"stage": run_stage_job}, WorkerOptions(poll_s=0.01, once=True)) == 1
    # stage 2 of database a, by a worker process started in yet another folder
    job_id = _stage_job(engines["a"], 1, 2)
    (tmp_path / "w3").mkdir()
    done = subprocess.run([sys.executable, "-m", "lab.cli", "worker", "--db", str(folder / "a.db"), "--once",
                           "--poll", "0.01"], capture_output=True, text=True, timeout=300, cwd=tmp_path / "w3",
                          env={**os.environ, "OMP_NUM_THREADS": "1",
                               "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert done.returncode == 0, done.stderr[-3000:]
    dirs = {name: _run_dir(engine, 1) for name, engine in engines.items()}
    assert dirs["a"] != dirs["b"] and dirs["a"].parent == dirs["b"].parent == folder.resolve()
    with session(engines["a"]) as s:
        job = s.get(Job, job_id)
        stages = s.exec(select(Stage).where(Stage.run_id == 1).order_by(Stage.index)).all()
    assert job.status == "done" and job.result["train"]["steps"] == 2
    assert f"loading {dirs['a'] / 'stage-1' / 'policy'}" in job.log_tail  # stage 2 starts from a's stage 1
    assert [st.checkpoint for st in stages[1:]] == [f"{dirs['a'].name}/stage-{k}/policy" for k in (1, 2)]
    with session(engines["b"]) as s:
        b_jobs = s.exec(select(Job).order_by(Job.id)).all()
    assert [j.result["train"].get("steps") for j in b_jobs] == [None, 2]  # b trained its own stage 1
    assert "trained by an earlier attempt" not in b_jobs[1].log_tail
    for name, k in (("a", 1), ("a", 2), ("b", 1)):
        marker = json.loads((dirs[name] / f"stage-{k}" / "trained.json").read_text())
        assert (marker["run_uuid"], marker["stage_index"]) == (dirs[name].name, k)
    assert not any((tmp_path / w / "runs").exists() for w in ("w1", "w2", "w3"))
    for engine in engines.values():
        engine.dispose()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on a GPU machine)")
def test_the_tiny_policy_trains_a_stage_on_the_gpu(empty_lab: Engine):
    """On a GPU the tiny policy trains in float32 (no bf16 autocast, no activation checkpointing): under bf16
    its first stage died of a CUDA device-side assert at step 15 on an H200."""
    run_id = _run(empty_lab, "tiny", stages=2, grpo=dict(max_steps=24, save_steps=50), validation_boards=16)
    for k in (0, 1):
        with session(empty_lab) as s:
            queue.enqueue(s, "stage", {"run_id": run_id, "stage_index": k}, run_id=run_id, target=k)
        assert run_worker(empty_lab, {"stage": run_stage_job}, WorkerOptions(poll_s=0.01, once=True)) == 1
    with session(empty_lab) as s:
        jobs = s.exec(select(Job).order_by(Job.id)).all()
        logs = s.exec(select(TrainingLog).where(TrainingLog.run_id == run_id)).all()
    assert [(j.status, j.error) for j in jobs] == [("done", None), ("done", None)]
    assert "on cuda:0" in jobs[1].log_tail and jobs[1].result["train"]["steps"] == 24
    assert sorted(log.step for log in logs) == list(range(1, 25))
    assert all(math.isfinite(log.metrics["loss"]) for log in logs)


def test_a_default_the_installed_version_lacks_goes_by_its_older_name_or_is_left_out_when_off():
    older = {"gradient_checkpointing", "bf16", "seed"}  # transformers 5.17's names
    assert installed_fields({"activation_checkpointing": True, "bf16": False, "seed": 3}, older) == {
        "gradient_checkpointing": True, "bf16": False, "seed": 3}
    newer = older | {"activation_checkpointing"}
    assert installed_fields({"activation_checkpointing": False}, newer) == {"activation_checkpointing": False}
    assert installed_fields({"activation_checkpointing": False}, {"seed"}) == {}
    with pytest.raises(StageError, match="no 'activation_checkpointing'"):
        installed_fields({"activation_checkpointing": True}, {"seed"})


def test_the_worker_asks_the_stage_whether_it_needs_fsdp_from_its_model_config_alone(empty_lab: Engine, writer: Path):
    """`python -m training.stage --fsdp-on N` (the worker's question, `lab.jobs.worker.stage_needs_fsdp`): the
    starting policy's shape on the meta device, the stage's GRPOConfig, the chat budget and prompts of 512 tokens."""
    run_id = _run(empty_lab, str(writer))
    with session(empty_lab) as s:
        first = s.exec(select(Stage).where(Stage.run_id == run_id, Stage.index == 0)).one()
        first.checkpoint = str(writer)
        s.add(first)
        s.commit()
    assert needs_fsdp(empty_lab, run_id, 0, 8) == (False, f"stage 0 of run {run_id} evaluates only: no FSDP")
    fsdp, line = needs_fsdp(empty_lab, run_id, 1, 8, device_bytes=80 * 10**9)
    assert not fsdp and line.startswith("full fine-tune of 0.0B on 8 GPUs: ") and line.endswith(" each unsharded: DDP")
    fsdp, line = needs_fsdp(empty_lab, run_id, 1, 8, device_bytes=10**8)  # a GPU of 100 MB
    assert fsdp and line.endswith("with FSDP: using FSDP")
