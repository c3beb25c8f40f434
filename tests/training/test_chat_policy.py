"""A chat policy trained right: its run's thinking mode reaches the rendered prompt, its completion length bounds
every answer, each GRPO step logs the truncated share and the mean answer length (drawn on the pages), and a full
fine-tune keeps float32 master weights under bf16 autocast.

The chat policy is the tiny model's shape over envlab's own word-level tokenizer with the generation-prompt tail
of Qwen3's chat template (the part that reads `enable_thinking`): nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from sqlalchemy import Engine
from sqlmodel import select

from envsim.config import EnvConfig
from envsim.generator import generate
from lab.loop import create_run
from lab.pages import figures
from lab.pages.train import train_view
from storage.db import session
from storage.models import Run, TrainingLog
from storage.settings import RunSettings, SettingsError
from training.evaluate import CHAT_BUDGET, answer_budget, evaluate
from training.policy import Policy, build_tiny, load_policy
from training.stage import StageArgs, dataset, stage_args, start_policy, trainer_for

# Qwen3's chat template, its message loop and generation-prompt tail as Qwen/Qwen3-0.6B ships them (the tail is
# verbatim: with enable_thinking false it writes an empty thinking block, so the model answers at once).
QWEN3_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)
EMPTY_THINKING = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
CONFIG = EnvConfig.default(sizes=(3,), num_instances=4)
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=2, head_dim=32)


def chat_policy() -> Policy:
    """A small random model that reads chat prompts through a Qwen3 chat template."""
    policy = build_tiny(0, **SMALL)
    policy.tokenizer.chat_template = QWEN3_TEMPLATE
    policy.prompt_style = "chat"
    return policy


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_the_runs_thinking_mode_reaches_the_prompt_trl_and_validation_read():
    board = generate(CONFIG, 1, seed=0)[0]
    policy = chat_policy()
    off = policy.configured(None).prompt(board)  # off by default
    assert off.endswith(EMPTY_THINKING)
    assert dataset(policy, [board])["prompt"] == [off]  # what GRPOTrainer is given: the rendered text
    on = policy.configured(RunSettings(stages=1, thinking="on")).prompt(board)
    assert on.endswith("<|im_start|>assistant\n") and "<think>" not in on
    assert on == off.removesuffix("<think>\n\n</think>\n\n")


def test_the_completion_length_bounds_every_answer_and_defaults_by_prompt_style():
    board = generate(CONFIG, 1, seed=0)[0]
    chat = chat_policy()
    assert answer_budget(chat.configured(None), board) == CHAT_BUDGET == 512
    assert answer_budget(chat.configured(RunSettings(stages=1, completion_length=40)), board) == 40
    compact = build_tiny(0, **SMALL)
    assert answer_budget(compact.configured(None), board) == 2 * (6 + 6 * 3)
    assert answer_budget(compact.configured(RunSettings(stages=1, completion_length=9)), board) == 9


def test_validation_decodes_greedily_or_samples_with_the_models_own_generation_config():
    boards = generate(CONFIG, 4, seed=1)
    policy = build_tiny(0, **SMALL).configured(RunSettings(stages=1, completion_length=6))
    greedy = [r.completion for r in evaluate(policy, boards)]
    assert greedy == [r.completion for r in evaluate(policy, boards)]  # greedy: the same answers every time
    policy.model.generation_config.temperature = 50.0  # the model's own sampling settings: near uniform
    policy.model.generation_config.top_k = None
    sampled = [r.completion for r in evaluate(policy, boards, decoding="sampled", seed=3)]
    assert sampled == [r.completion for r in evaluate(policy, boards, decoding="sampled", seed=3)]  # seeded
    assert sampled != greedy
    with pytest.raises(ValueError, match="decoding 'beam': one of greedy, sampled"):
        evaluate(policy, boards, decoding="beam")


def test_a_runs_decoding_settings_are_stored_checked_and_reach_the_stage(empty_lab: Engine):
    with session(empty_lab) as s:
        run = create_run(s, name="chat", config=CONFIG, settings=RunSettings(
            stages=2, thinking="on", completion_length=48, validation_decoding="sampled"))
        assert {k: getattr(run.settings, k) for k in ("thinking", "completion_length", "validation_decoding")} == \
            {"thinking": "on", "completion_length": 48, "validation_decoding": "sampled"}
        with pytest.raises(SettingsError, match="thinking"):
            RunSettings.checked(stages=1, thinking="maybe")
        with pytest.raises(SettingsError, match="completion_length"):
            RunSettings.checked(stages=1, completion_length=0)
        assert [r.name for r in s.exec(select(Run))] == ["chat"]  # nothing stored for the refused ones
    args = stage_args(empty_lab, run.id, 0)
    assert args.decoding == "sampled"
    policy = start_policy(args, "cpu")
    assert (policy.thinking, policy.completion_length) == (True, 48)


def test_a_grpo_step_logs_the_truncated_share_and_the_pages_draw_it(empty_lab: Engine, tmp_path: Path):
    with session(empty_lab) as s:
        run = create_run(s, name="chat", config=CONFIG, settings=RunSettings(stages=2, completion_length=4))
    # every answer runs to the cap (min_new_tokens = the cap), so each is truncated and 4 tokens long; a field no run
    # may set (`GRPO_FIELDS`), put in the stage's settings past their check
    grpo = dict(max_steps=1, num_generations=2, per_device_train_batch_size=4, save_strategy="no",
                generation_kwargs={"min_new_tokens": 4})
    args = StageArgs(run_id=run.id, stage_index=1, seed=1, policy="", config=CONFIG, run_dir=tmp_path / "run",
                     run_uuid=run.uuid, settings=run.settings.model_copy(update={"grpo": grpo}))
    policy = chat_policy().configured(run.settings)
    trainer, _, _ = trainer_for(empty_lab, args, policy, lambda *a, **k: False)
    assert trainer.args.max_completion_length == 4
    trainer.train()
    with session(empty_lab) as s:
        (row,) = s.exec(select(TrainingLog).where(TrainingLog.run_id == run.id)).all()
    assert row.metrics["completions/clipped_ratio"] == 1.0 and row.metrics["completions/mean_length"] == 4.0
    logs = [(row.step, row.metrics)]
    drawn = {t.name: t.y for t in figures.training_figure(logs).data}
    assert drawn["completions/clipped_ratio"] == (1.0,) and drawn["completions/mean_length"] == (4.0,)
    train = train_view(empty_lab, run.id)["training"]  # the Train tab draws the stage training now
    assert train.layout.title.text.startswith("stage 1")
    assert {t.name: t.y for t in train.data}["completions/clipped_ratio"] == (1.0,)


def test_a_full_fine_tune_keeps_float32_master_weights_under_bf16_autocast(empty_lab: Engine, tmp_path: Path):
    # a checkpoint stored in bf16 (as a hub's chat model is) starts a stage's full fine-tune in float32
    saved = chat_policy()
    saved.model.to(torch.bfloat16)
    folder = saved.save(tmp_path / "bf16-policy")
    with session(empty_lab) as s:
        run = create_run(s, name="chat", config=CONFIG, settings=RunSettings(stages=2, completion_length=4))
    grpo = dict(max_steps=1, num_generations=2, per_device_train_batch_size=4, save_strategy="no", bf16=True,
                learning_rate=1e-6)
    args = StageArgs(run_id=run.id, stage_index=1, seed=1, policy=str(folder), config=CONFIG, run_dir=tmp_path / "run",
                     run_uuid=run.uuid, settings=run.settings.model_copy(update={"grpo": grpo}))
    policy = start_policy(args, "cpu")
    assert {p.dtype for p in policy.model.parameters()} == {torch.float32}
    assert load_policy(str(folder), dtype=torch.bfloat16).model.dtype == torch.bfloat16  # as asked, otherwise
    trainer, _, _ = trainer_for(empty_lab, args, policy, lambda *a, **k: False)
    trainer.train()
    assert trainer.accelerator.mixed_precision == "bf16"  # the maths under bf16 autocast
    params = [p for group in trainer.optimizer.param_groups for p in group["params"]]
    assert params and {p.dtype for p in params} == {torch.float32}  # the optimizer updates float32 masters
    assert all(trainer.optimizer.state[p]["exp_avg"].dtype == torch.float32 for p in params)


def test_on_a_gpu_a_full_fine_tune_loads_float32_and_lora_or_evaluation_bf16(monkeypatch, tmp_path: Path):
    folder = chat_policy().save(tmp_path / "policy")
    # a GPU's choice for a chat model (`training.policy._dtype` picks bf16 on CUDA), made here on the CPU
    monkeypatch.setattr("training.policy._dtype", lambda device, style: torch.bfloat16)

    def dtype(stage: int, lora: int) -> torch.dtype:
        args = StageArgs(run_id=1, stage_index=stage, seed=1, policy=str(folder), config=CONFIG,
                         run_dir=tmp_path / "run", run_uuid="u", settings=RunSettings(stages=1, lora=lora))
        return start_policy(args, "cpu").model.dtype

    assert dtype(1, 0) == torch.float32  # the full fine-tune's master weights
    assert dtype(1, 8) == torch.bfloat16  # LoRA: the run's policy as its frozen base, in bf16
    assert dtype(2, 8) == torch.float32  # from stage 2, a trained stage's float32 checkpoint, exactly as it trained
    assert dtype(0, 0) == torch.bfloat16  # stage 0 only evaluates
