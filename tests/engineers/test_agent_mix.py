"""The agent mix over a run's agent counts (`Evidence.agent_counts`): each engineer's exact mix for scripted dev
boards of agent counts 2, 3 and 4; with none given (an engineer outside a run) or one count, the mix as before."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from envsim.config import EnvConfig
from envsim.generator import GenerationError, Unfillable
from lab.context import BoardOutcome, Evidence
from lab.engineers import (
    ENGINEERS,
    LEARN_FLOOR,
    answer_schema,
    engineer_prompt,
    evidence_engineer,
    heuristic,
    learnability,
    llm,
    random_config,
    shares,
)
from lab.engineers.answer import revert_unfillable
from tests.engineers.scripts import CONFIG, GOOD, Script, evidence
from training.probe import ProbeResult, SizeProbe

COUNTS = (2, 3, 4)


def B(size: int, agents: int, failure: str | None = None) -> BoardOutcome:  # noqa: N802
    return BoardOutcome(size, 0.2, False, failure is None, failure, agents, failure is None)


# Count 2: 2 of 4 boards valid (p(1-p) 0.25); count 3: 1 of 4 (0.1875); count 4: none (0, below every floor).
BOARDS = (B(3, 2), B(4, 2), B(3, 2, "hole"), B(5, 2, "vertex_conflict"),
          B(3, 3), B(4, 3, "hole"), B(5, 3, "edge_conflict"), B(5, 3, "hole"),
          B(3, 4, "vertex_conflict"), B(4, 4, "hole"), B(5, 4, "hole"), B(5, 4, "goal_not_reached"))


def mixed(counts: tuple[int, ...] | None = COUNTS) -> Evidence:
    """The shared scripted evidence (tests.engineers.scripts) with these dev boards and the run's agent counts."""
    scripted = evidence()
    return replace(scripted, current=replace(scripted.current, boards=BOARDS), agent_counts=counts)


def test_the_stage_result_counts_its_dev_boards_per_agent_count() -> None:
    by_agents = mixed().current.by_agents
    assert {k: (t.episodes, t.valid, t.optimal) for k, t in by_agents.items()} == {2: (4, 2, 2), 3: (4, 1, 1),
                                                                                   4: (4, 0, 0)}
    assert by_agents[4].failures == {"goal_not_reached": 1, "hole": 2, "vertex_conflict": 1}


def test_heuristic_weights_the_counts_by_learnability() -> None:
    answer = heuristic(mixed(), seed=0)
    # weights 0.25, 0.1875 and the floor 0.05 for count 4 (p(1-p) = 0)
    assert answer.projection.config.agent_ratio == shares({2: 0.25, 3: 0.1875, 4: 0.05}) == {2: 0.513, 3: 0.385,
                                                                                            4: 0.102}
    assert answer.rationale.splitlines()[-1] == (
        "agent_ratio 2=1 -> 2=0.513, 3=0.385, 4=0.102 (agent counts [2, 3, 4] by learnability p(1-p), floor 0.05: "
        "2: valid 50% of 4, p(1-p) 0.25; 3: valid 25% of 4, p(1-p) 0.19; 4: valid 0% of 4, p(1-p) 0.00)")
    # the per-size decisions are those made without a mix
    without = heuristic(mixed(None), seed=0)
    assert answer.projection.config.model_copy(update={"agent_ratio": {2: 1.0}}) == without.projection.config
    assert answer.rationale.splitlines()[:-1] == without.rationale.splitlines()


def test_a_count_without_dev_boards_gets_the_floor() -> None:
    answer = heuristic(mixed((2, 5)), seed=0)
    assert answer.projection.config.agent_ratio == shares({2: 0.25, 5: 0.05}) == {2: 0.833, 5: 0.167}
    assert answer.rationale.splitlines()[-1].endswith("2: valid 50% of 4, p(1-p) 0.25; 5: no dev boards)")


def test_evidence_moves_the_mix_half_the_way_toward_the_learnable_counts() -> None:
    answer = evidence_engineer(mixed())
    # target shares({2: 0.25, 3: 0.1875, 4: 0.04}) = 0.523, 0.393, 0.084; half the way from 1, 0, 0
    assert answer.projection.config.agent_ratio == {2: 0.762, 3: 0.196, 4: 0.042}
    assert answer.rationale.splitlines()[-1] == (
        "agent_ratio 2=1 -> 2=0.762, 3=0.196, 4=0.042 moved 0.5 of the way toward 2=0.523, 3=0.393, 4=0.084 "
        "(agent counts [2, 3, 4] by learnability p(1-p), floor 0.04: 2: valid 50% of 4, p(1-p) 0.25; 3: valid 25% "
        "of 4, p(1-p) 0.19; 4: valid 0% of 4, p(1-p) 0.00)")


def test_random_draws_a_flat_dirichlet_over_the_counts_after_the_sizes() -> None:
    answer = random_config(mixed(), seed=7)
    config = answer.projection.config
    assert config.agent_ratio == {2: 0.813, 3: 0.06, 4: 0.127}
    rng = np.random.default_rng([7, 2])  # seed 7, round 2: the sizes' shares, holes, waits, then the counts'
    rng.dirichlet(np.ones(3)), rng.uniform(size=6)
    assert config.agent_ratio == shares(dict(zip(COUNTS, rng.dirichlet(np.ones(3)).tolist(), strict=True)))
    # drawn last: the per-size knobs are those of a draw without a mix, and one count draws nothing
    alone = random_config(mixed(None), seed=7).projection.config
    assert config.model_copy(update={"agent_ratio": {2: 1.0}}) == alone
    assert random_config(mixed((2,)), seed=7).projection.config == alone
    assert random_config(mixed((3,)), seed=7).projection.config.agent_ratio == {3: 1.0}


@pytest.mark.parametrize("name", ["fixed", "random", "heuristic", "evidence", "llm", "bandit"])
def test_no_engineer_puts_a_board_outside_the_runs_counts(name: str) -> None:
    ev = mixed((3, 4))
    answer = ENGINEERS[name].propose(ev, seed=1, complete_fn=Script(GOOD.replace('"wait_ratio"', '"agent_ratio": '
                                                                           '{"3": 0.25, "4": 0.75}, "wait_ratio"')))
    counts = answer.projection.config.agent_counts
    assert counts == ((2,) if name == "fixed" else (3, 4))  # `fixed` keeps the config as it is


class MixProbe:
    """A probe of one size's cell (learnability 0.05 for each) or of a whole config at one agent count: per size,
    the learnability in `by_count` (a count in `unmakeable` raises as the generator does)."""

    def __init__(self, by_count: dict[int, dict[int, float]], unmakeable: tuple[int, ...] = ()):
        self.by_count, self.unmakeable, self.calls = by_count, unmakeable, []

    def __call__(self, config: EnvConfig) -> ProbeResult:
        assert config.random_share == 0
        self.calls.append((config.sizes, config.agent_counts))
        if len(config.sizes) == 1:
            (size,) = config.sizes
            return ProbeResult({size: SizeProbe(size, 16, 4, 32, 0, 0.05, 0.0, 0.0)}, {size: 1.0}, 64, 1.0)
        (count,) = config.agent_counts
        if count in self.unmakeable:
            raise GenerationError(f"{count} agents: cannot", None)
        per_size = {s: SizeProbe(s, 16, 4, 32, 0, self.by_count[count][s], 0.0, 0.0) for s in config.sizes}
        return ProbeResult(per_size, dict(config.data_ratio), 64 * len(per_size), 3.0)


def test_learnability_probes_each_count_on_the_kept_cells() -> None:
    probe = MixProbe({2: {3: 0.2, 4: 0.2, 5: 0.2}, 3: {3: 0.1, 4: 0.0, 5: 0.2}}, unmakeable=(4,))
    answer = learnability(mixed(), seed=0, probe_fn=probe)
    config = answer.projection.config
    assert probe.calls[18:] == [((3, 4, 5), (2,)), ((3, 4, 5), (3,)), ((3, 4, 5), (4,))]  # after the 18 cells
    # every size's data share is 1/3 (every cell measured alike): count 3's learnability is (0.1 + 0 + 0.2) / 3
    assert config.data_ratio == {3: 0.334, 4: 0.333, 5: 0.333}
    assert config.agent_ratio == {2: 0.625, 3: 0.312, 4: 0.063}  # 0.2, 0.1 and the floor 0.02 as shares
    three = (0.334 * 0.1 + 0.333 * 0.0 + 0.333 * 0.2) / (0.334 + 0.333 + 0.333)  # 0.1 less a rounding error
    assert config.agent_ratio == shares({2: 0.2, 3: three, 4: LEARN_FLOOR})
    assert answer.rationale.splitlines()[4] == (
        "agent_ratio 2=1 -> 2=0.625, 3=0.312, 4=0.063 (each agent count probed on the kept cells, floor 0.02: 2: "
        "learnability 0.200; 3: learnability 0.100; 4: cannot be generated)")
    assert answer.compute == {"completions": 18 * 64 + 2 * 192, "seconds": 24.0, "probes": 20, "cached": 0}


def test_learnability_with_one_count_probes_no_mix() -> None:
    probe = MixProbe({})
    assert learnability(mixed((2,)), seed=0, probe_fn=probe).projection.config.agent_ratio == {2: 1.0}
    assert len(probe.calls) == 18
    answer = learnability(mixed((3,)), seed=0, probe_fn=probe)
    assert answer.projection.config.agent_ratio == {3: 1.0}
    assert "agent_ratio 2=1 -> 3=1: the run's one agent count" in answer.rationale.splitlines()


def test_a_mix_the_stage_cannot_fill_goes_back_after_the_sizes() -> None:
    base = CONFIG
    proposed = base.model_copy(update={"agent_ratio": {2: 0.5, 4: 0.5}, "hole_ratio": {3: 0.3, 4: 0.2, 5: 0.2}})
    checked = []

    def check(config: EnvConfig) -> Unfillable | None:
        checked.append(config)
        return Unfillable(3, "size 3: no room") if 4 in config.agent_counts else None

    config, lines = revert_unfillable(proposed, base, check)
    assert config == base and len(checked) == 2
    assert lines == ["size 3: back to hole 0.2, wait 0.25: the generator could not fill the config (size 3: no room)",
                     "agent_ratio: back to 2=1: the generator could not fill the config (size 3: no room)"]


# ---------------------------------------------------------------- the llm engineer


def test_the_answer_schema_names_only_the_runs_counts() -> None:
    agents = answer_schema((3, 4), COUNTS)["properties"]["agent_ratio"]
    assert list(agents["properties"]) == agents["required"] == ["2", "3", "4"]
    assert agents["additionalProperties"] is False
    assert agents["properties"]["3"] == {"type": "number", "minimum": 0.0, "maximum": 1.0, "multipleOf": 0.001}
    assert answer_schema((3, 4))["properties"]["agent_ratio"]["required"] == [str(k) for k in range(1, 9)]


def test_the_prompt_tells_the_mix_and_its_schema_names_only_the_runs_counts() -> None:
    prompt = engineer_prompt(mixed())
    assert ("You also choose the stage's agent mix, agent_ratio: the share of the stage's training instances with "
            "each agent count (the keys), summing to 1. This run may use the agent counts 2, 3, 4 only.") in prompt
    assert '"agent_ratio":{"additionalProperties":{"maximum":1.0,"minimum":0.0,"type":"number"},' \
           '"propertyNames":{"enum":["2","3","4"]}' in prompt
    assert "the run's agent counts 2, 3, 4 only, each share 0 to 1" in prompt  # the guideline
    alone = engineer_prompt(mixed((2,)))
    assert "You also choose the stage's agent mix" not in alone and '"propertyNames":{"enum":["2"]}' in alone
    outside = engineer_prompt(mixed(None))  # outside a run: every count of the rules, no word of a mix
    assert "You also choose the stage's agent mix" not in outside
    assert '"propertyNames":{"enum":["1","2","3","4","5","6","7","8"]}' in outside


def test_an_answer_with_a_count_outside_the_runs_counts_is_refused_naming_both() -> None:
    outside = GOOD.replace('"wait_ratio"', '"agent_ratio": {"2": 0.5, "5": 0.5}, "wait_ratio"')
    inside = GOOD.replace('"wait_ratio"', '"agent_ratio": {"2": 0.5, "3": 0.5}, "wait_ratio"')
    script = Script(outside, inside)
    answer = llm(mixed(), seed=0, complete_fn=script)
    assert answer.attempts == 2 and answer.projection.config.agent_ratio == {2: 0.5, 3: 0.5}
    retry = script.calls[1][-1]["content"]
    assert retry.startswith("Your answer could not be used: the config is not legal: agent_ratio: agent count 5 "
                            "is not one of the run's agent counts [2, 3, 4]\n")
    # outside a run every count of the rules stands, as before
    assert llm(mixed(None), seed=0, complete_fn=Script(outside)).projection.config.agent_ratio == {2: 0.5, 5: 0.5}
