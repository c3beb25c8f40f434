"""The policy as its own engineer (`hf:policy`): the run's checkpoint is read as the lab reads a policy (a spec
such as `gemma3-270m` or `tiny` at stage 0, a stage's folder after), on this process's device and in its dtype,
never asked of a model hub; and the proposal names the checkpoint that wrote it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from envsim.config import EnvConfig
from envsim.generator import Unfillable
from lab.llm import _load, complete
from lab.loop import engineer_name
from storage.models import Run, Stage
from storage.settings import RunSettings
from tests.servers import CHAT_TEMPLATE, MESSAGES, build_tiny_model, evidence


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a hub lookup fails at once instead of retrying for a minute
    _load.cache_clear()
    yield
    _load.cache_clear()


def test_hf_policy_reads_the_gemma_spec_as_the_lab_does_not_as_a_hub_name(tmp_path: Path, monkeypatch):
    folder = build_tiny_model(tmp_path / "converted")  # stands in for the Gemma folder training.gemma converts
    asked: list[str] = []
    monkeypatch.setattr("training.gemma.gemma_checkpoint", lambda: asked.append("gemma") or folder)
    answer = complete("hf:policy", MESSAGES, max_tokens=6, temperature=0.0, seed=0, policy_path="gemma3-270m")
    assert asked == ["gemma"]
    assert answer == complete(f"hf:{folder}", MESSAGES, max_tokens=6, temperature=0.0, seed=0)


def test_hf_policy_loads_on_the_workers_device_in_the_policys_dtype(tmp_path: Path, monkeypatch):
    folder = build_tiny_model(tmp_path / "stage-1")
    model, _ = _load(str(folder))
    assert model.device.type == "cpu" and model.dtype == torch.float32 and not model.training
    _load.cache_clear()
    # a GPU worker's choice (training.policy._dtype picks bf16 for a chat model on CUDA), made here on the CPU
    monkeypatch.setattr("training.policy._dtype", lambda device, style: torch.bfloat16)
    model, _ = _load(str(folder))
    assert model.dtype == torch.bfloat16
    assert isinstance(complete("hf:policy", MESSAGES, max_tokens=4, temperature=0.0, seed=0,
                               policy_path=str(folder)), str)


# A template that reads `enable_thinking` as Qwen3's does (off: an empty thinking block, so the model answers at
# once), and fails where it is not told: the run's policy is always prompted with the run's thinking setting.
EMPTY_THINKING = "{% if add_generation_prompt %}<think>\n\n</think>\n\n{% endif %}"
THINKING_TEMPLATE = ("{% if enable_thinking is not defined %}{{ raise_exception('enable_thinking not given') }}"
                     "{% endif %}" + CHAT_TEMPLATE
                     + "{% if enable_thinking is false %}" + EMPTY_THINKING + "{% endif %}")


def test_the_policy_as_engineer_is_prompted_with_the_runs_thinking_setting(tmp_path: Path):
    """The run's policy writes the engineer's answer through its chat template with the run's `thinking` (off by
    default), as it is prompted in training: a Qwen3 policy trained with thinking off answers at once, instead of
    thinking through its 1024-token budget. Each model below has the same weights; only its template differs."""
    from lab.engineers.language_model import llm

    policy = build_tiny_model(tmp_path / "policy", chat_template=THINKING_TEMPLATE)
    at_once = build_tiny_model(tmp_path / "at-once", chat_template=CHAT_TEMPLATE + EMPTY_THINKING)
    thinks = build_tiny_model(tmp_path / "thinks", chat_template=CHAT_TEMPLATE)
    ask = dict(max_tokens=8, temperature=0.0, seed=0)
    off = complete("hf:policy", MESSAGES, policy_path=str(policy), **ask)  # the run's default: thinking off
    assert off == complete(f"hf:{at_once}", MESSAGES, **ask)
    on = complete("hf:policy", MESSAGES, policy_path=str(policy), thinking=True, **ask)
    assert on == complete(f"hf:{thinks}", MESSAGES, **ask) != off
    # through the engineer, as the propose job asks it (`lab.loop.run_propose_job`: the run's `thinking`)
    answers = [llm(evidence(), seed=0, backend=f"hf:{folder}" if folder != policy else "hf:policy",
                   policy_path=str(policy), thinking=thinking, structured=False, max_attempts=1, max_tokens=8,
                   temperature=0.0).raw for folder, thinking in ((policy, False), (at_once, False))]
    assert answers[0] == answers[1]


def test_a_proposal_names_its_engineer_and_the_policy_checkpoint_that_wrote_it():
    def run(engineer: str, backend: str = "") -> Run:
        return Run(name="r", policy="gemma3-270m", engineer=engineer, engineer_backend=backend, seed=0,
                   settings=RunSettings(stages=1))

    stage0, stage1 = Stage(run_id=1, index=0, config=EnvConfig.default(), checkpoint="gemma3-270m"), \
        Stage(run_id=1, index=1, config=EnvConfig.default(), checkpoint="abc/stage-1/policy")
    assert engineer_name(run("heuristic"), stage1) == "heuristic"
    assert engineer_name(run("llm", "openai:qwen3"), stage1) == "llm (openai:qwen3)"
    assert engineer_name(run("llm", "hf:policy"), stage0) == "llm (hf:policy: gemma3-270m)"
    assert engineer_name(run("llm", "hf:policy"), stage1) == "llm (hf:policy: abc/stage-1/policy)"


def test_the_llm_engineer_asks_again_when_the_generator_cannot_fill_its_config():
    from lab.engineers import llm
    from tests.servers import evidence

    answers = iter(['{"num_agents": 8, "num_instances": 2}', '{"num_agents": 2, "num_instances": 2}'])
    seen: list[list[dict]] = []

    def scripted(messages):
        seen.append(messages)
        return next(answers)

    def cannot_fill(config):
        return Unfillable(None, "too few ice cells for 8 agents") if config.most_agents == 8 else None

    answer = llm(evidence(), seed=0, complete_fn=scripted, max_attempts=3, cannot_fill=cannot_fill)
    assert answer.error is None and answer.attempts == 2 and answer.projection.config.agent_ratio == {2: 1.0}
    assert "the generator cannot fill this config: too few ice cells for 8 agents" in seen[1][-1]["content"]
