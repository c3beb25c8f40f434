"""What a trained stage hands its validation: the GPU free of the trainer, no process group, one BOS, the run's
answer budget.

After a stage trains, its main process evaluates the policy on the validation set, on vLLM where it is installed
(a second engine, 0.3 of the GPU). Tested here with the real stage on the CPU: the trainer, its optimizer and TRL's
colocated vLLM engine are gone before validation's engine starts, the process leaves torch.distributed (a real
one-process gloo group), training and validation read a chat template's BOS once, and validation answers within
the run's completion length. vLLM needs a GPU, so its two engines are stand-ins (`FakeLLM`); the trainer is TRL's.
"""

from __future__ import annotations

import gc
import sys
import weakref
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from sqlalchemy import Engine
from sqlmodel import select
from tokenizers.processors import TemplateProcessing

from envsim.config import EnvConfig
from envsim.generator import generate
from storage.db import session
from storage.models import Episode, Run, Stage
from storage.settings import RunSettings
from tests.servers import free_port
from training.policy import Policy, build_tiny
from training.stage import StageArgs, Trainer, dataset, run_stage, train

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=2, head_dim=32)
CONFIG = EnvConfig.default(sizes=(3,), num_instances=4)
GRPO = dict(max_steps=1, num_generations=2, per_device_train_batch_size=4, save_strategy="no")
# ChatML turns with the generation prompt, as Qwen3's template writes them; GEMMA_STYLE opens with `bos_token` as
# Gemma IT's and Llama 3's templates do.
CHAT_TEMPLATE = ("{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + "
                 "'<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}"
                 "{{- '<|im_start|>assistant\\n' }}{%- endif %}")
GEMMA_STYLE = "{{ bos_token }}" + CHAT_TEMPLATE

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def chat_policy() -> Policy:
    """A small random model that reads chat prompts through a chat template (envlab's word-level tokenizer)."""
    policy = build_tiny(0, **SMALL)
    policy.tokenizer.chat_template = CHAT_TEMPLATE
    policy.prompt_style = "chat"
    return policy


def bos_policy() -> Policy:
    """A chat policy whose tokenizer adds a BOS to every text it encodes and whose chat template writes one too,
    as Gemma IT's and Llama 3's do (the tokenizer only: nothing here runs the model)."""
    policy = chat_policy()
    tok = policy.tokenizer
    tok.add_special_tokens({"bos_token": "<bos>"})
    tok.backend_tokenizer.post_processor = TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                              special_tokens=[("<bos>", tok.bos_token_id)])
    tok.chat_template = GEMMA_STYLE
    return policy


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One runs root for the module: the validation boards are built once, into it."""
    return tmp_path_factory.mktemp("runs")


def _stage(engine: Engine, tmp_path: Path, runs: Path, settings: dict) -> StageArgs:
    """Stage 1 of a run of the chat policy, its rows stored, 2 validation boards."""
    folder = chat_policy().save(tmp_path / "chat")
    with session(engine) as s:
        run = Run(name="t", policy=str(folder), engineer="fixed", engineer_backend="", seed=7,
                  settings=RunSettings(stages=1, **settings))
        s.add(run)
        s.commit()
        for k in (0, 1):
            s.add(Stage(run_id=run.id, index=k, config=CONFIG.model_dump(mode="json"), status="queued"))
        s.commit()
        run_id, uuid, run_settings = run.id, run.uuid, run.settings.model_copy(update={"validation_boards": 2})
    return StageArgs(run_id=run_id, stage_index=1, seed=1, policy=str(folder), config=CONFIG,
                     run_dir=runs / uuid, run_uuid=uuid, settings=run_settings)


class FakeLLM:
    """A stand-in for an in-process `vllm.LLM`: its engine core says when it is shut down, and it holds a reference
    cycle, as vLLM's engine does, so only a garbage collection frees it."""

    def __init__(self, events: list[str], name: str):
        self.llm_engine = SimpleNamespace(engine_core=SimpleNamespace(shutdown=lambda: events.append(f"{name} shut")))
        self.cycle = self


@pytest.fixture
def fake_vllm(monkeypatch) -> list[str]:
    """vLLM's teardown (`cleanup_dist_env_and_memory`) as a stand-in that records its calls in the list returned."""
    events: list[str] = []
    state = ModuleType("vllm.distributed.parallel_state")
    state.cleanup_dist_env_and_memory = lambda: events.append("vllm groups destroyed")
    monkeypatch.setitem(sys.modules, "vllm.distributed.parallel_state", state)
    return events


def test_the_trainer_its_optimizer_and_trls_engine_are_gone_before_validation_starts_its_engine(
        empty_lab: Engine, tmp_path: Path, runs: Path, monkeypatch, fake_vllm: list[str]):
    args = _stage(empty_lab, tmp_path, runs, {"grpo": GRPO, "completion_length": 3})
    held: dict[str, weakref.ref] = {}

    class Colocated(Trainer):  # the stage's trainer (TRL's), with a colocated engine as `vllm_mode="colocate"` gives it
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.vllm_generation = SimpleNamespace(llm=FakeLLM(fake_vllm, "TRL's engine"))
            held["trainer"], held["TRL's engine"] = weakref.ref(self), weakref.ref(self.vllm_generation.llm)

        def create_optimizer(self, *a, **k):
            optimizer = super().create_optimizer(*a, **k)
            held["optimizer"] = weakref.ref(optimizer)
            return optimizer

    at_validation: dict[str, bool] = {}
    budgets: list[int] = []

    def validation_engine(folder: str, **_) -> FakeLLM:
        at_validation.update({name: ref() is not None for name, ref in held.items()})
        fake_vllm.append("validation engine started")
        return FakeLLM(fake_vllm, "validation engine")

    def answers(engine, prompts, max_tokens, **_) -> list[str]:
        budgets.append(max_tokens)
        return ["Agent 0 : (0,0)"] * len(prompts)

    monkeypatch.setattr("training.stage.Trainer", Colocated)
    monkeypatch.setattr("training.vllm.available", lambda: True)
    monkeypatch.setattr("training.vllm.vllm_engine", validation_engine)
    monkeypatch.setattr("training.vllm.generate_texts", answers)
    result = run_stage(empty_lab, args, lambda *a, **k: False)
    assert result["train"]["steps"] == 1 and result["episodes"] == 2
    assert at_validation == {"trainer": False, "optimizer": False, "TRL's engine": False}
    assert fake_vllm == ["TRL's engine shut", "vllm groups destroyed", "validation engine started",
                         "validation engine shut", "vllm groups destroyed"]
    assert budgets == [3]  # the run's completion length, not the chat default of 512


def test_a_stage_answers_validation_within_the_runs_completion_length_on_transformers(empty_lab: Engine,
                                                                                      tmp_path: Path, runs: Path):
    args = _stage(empty_lab, tmp_path, runs, {"grpo": GRPO, "completion_length": 2})
    run_stage(empty_lab, args, lambda *a, **k: False)
    tok = chat_policy().tokenizer
    with session(empty_lab) as s:
        completions = s.exec(select(Episode.completion).where(Episode.run_id == args.run_id,
                                                              Episode.stage_index == 1)).all()
    assert len(completions) == 2
    assert all(len(tok(c, add_special_tokens=False)["input_ids"]) <= 2 for c in completions)


def test_training_and_validation_read_a_chat_templates_bos_once():
    board = generate(CONFIG, 1, seed=0)[0]
    policy = bos_policy()
    tok, bos = policy.tokenizer, policy.tokenizer.bos_token_id
    assert policy.prompt(board).startswith("<bos><|im_start|>user")  # the template wrote it
    # what GRPOTrainer tokenizes a text prompt with (`processing_class(text=prompts)`, `_tokenize_prompts`)
    trained = tok(text=list(dataset(policy, [board])["prompt"]))["input_ids"][0]
    validated = policy.token_ids(policy.prompt(board))  # what validation and vLLM read
    assert trained[0] == bos and trained.count(bos) == 1
    assert validated == trained
    plain = chat_policy()  # a template without BOS (Qwen3's): the prompt TRL gets is the rendered text as it is
    assert list(dataset(plain, [board])["prompt"]) == [plain.prompt(board)]


def test_every_process_that_trains_leaves_its_process_group(empty_lab: Engine, tmp_path: Path, runs: Path):
    """`train` is all a rank other than the main one runs of a stage (`lab.jobs.child`), so it leaves the group."""
    args = _stage(empty_lab, tmp_path, runs, {"grpo": GRPO})
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{free_port()}")
    try:
        train(empty_lab, args, chat_policy(), lambda *a, **k: False)
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert (args.policy_dir / "config.json").is_file()  # and it trained and saved as before


def test_memory_goes_back_to_the_device_where_there_is_cuda(monkeypatch):
    """A vLLM engine sizes itself by the memory the device reports free: PyTorch's cached blocks count as taken."""
    from training import vllm

    calls = []
    monkeypatch.setattr(gc, "collect", lambda *a: calls.append("gc.collect") or 0)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    for cuda in (False, True):
        monkeypatch.setattr(torch.cuda, "is_available", lambda cuda=cuda: cuda)
        vllm.free_memory()
    assert calls == ["gc.collect", "gc.collect", "empty_cache"]
