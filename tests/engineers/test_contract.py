"""The contract every engineer keeps: a legal config on the run's sizes, the same answer for the same seed."""

from __future__ import annotations

import json

import pytest

from envsim.config import EnvConfig, project
from lab.context import Evidence
from lab.engineers import (
    ENGINEERS,
    LEARN_ANSWERS,
    LEARN_BOARDS,
    EngineerAnswer,
    Needs,
    needs_of,
)
from storage.settings import Held, HeldConfigs, RunSettings
from tests.engineers.scripts import CONFIG, GOOD, Script, ScriptedProbe, evidence

HELD = HeldConfigs(kind=Held.SCHEDULE, source="held.json", configs=(CONFIG,))  # what a held engineer's run stores

# ---------------------------------------------------------------- the contract, for every engineer


def _run(name: str, ev: Evidence, seed: int = 0) -> EngineerAnswer:
    return ENGINEERS[name].propose(ev, seed=seed, complete_fn=Script(GOOD), backend="openai:unused", unused_option=1,
                           probe_fn=ScriptedProbe({}), held=HELD)


@pytest.mark.parametrize("name", sorted(ENGINEERS))
def test_every_engineer_returns_a_legal_config_on_the_runs_sizes(name: str) -> None:
    ev = evidence()
    answer = _run(name, ev, seed=3)
    assert answer.error is None and answer.projection is not None
    config = answer.projection.config
    assert EnvConfig.model_validate(config.model_dump()) == config
    assert config.sizes == CONFIG.sizes
    assert (config.agent_ratio, config.num_instances) == (CONFIG.agent_ratio, CONFIG.num_instances)
    assert answer.proposed is not None and answer.raw and answer.rationale
    assert project(answer.proposed, base=CONFIG).config == config  # what was proposed projects to what is kept
    json.dumps(answer.proposed, allow_nan=False)  # storable as strict JSON


@pytest.mark.parametrize("name", sorted(ENGINEERS))
def test_every_engineer_is_deterministic_for_a_seed(name: str) -> None:
    assert _run(name, evidence(), seed=5) == _run(name, evidence(), seed=5)


def test_fixed_keeps_the_current_config() -> None:
    answer = ENGINEERS["fixed"].propose(evidence(), seed=1)
    assert answer.projection.config == CONFIG and answer.projection.adjustments == ()
    assert answer.rationale == "fixed environment: keeps the current config"


def test_each_engineer_declares_what_its_propose_job_gives_it() -> None:
    size = {"boards": 8, "answers": 2}  # the run's probe size
    plain = RunSettings(stages=1, probe_boards=8, probe_answers=2)
    assert {name: needs_of(name, plain) for name in sorted(ENGINEERS)} == {
        "bandit": Needs(),
        "climb": Needs(),
        "evidence": Needs(reads_episodes=True),
        "fixed": Needs(),
        "heuristic": Needs(),
        "learnability": Needs(probe={"boards": LEARN_BOARDS, "answers": LEARN_ANSWERS}, held_out=True),
        "levels": Needs(),
        "llm": Needs(language_model=True, policy_path=True),
        "random": Needs(),
        "schedule": Needs(held_configs=True),
        "static": Needs(held_configs=True),
    }
    assert needs_of("llm", plain.model_copy(update={"context": {"measured": True, "failure_cases": True}})) == \
        Needs(language_model=True, policy_path=True, probe=size, reads_episodes=True)
    assert needs_of("llm", plain.model_copy(update={"remeasure": True})).probe == size
    assert needs_of("learnability", plain.model_copy(update={"remeasure": True})).probe == {"boards": 16, "answers": 8}
