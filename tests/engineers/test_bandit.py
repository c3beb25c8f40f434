"""The `bandit` engineer (SEC) and the per-cell advantages it reads: exact numbers for scripted rewards, Q values,
shares and configs."""

from __future__ import annotations

import math

import pytest

from envsim.config import EnvConfig
from envsim.generator import Unfillable
from lab.context import Evidence, StageResult
from lab.engineers import ENGINEERS
from lab.engineers.bandit import ALPHA, PRIOR, TEMPERATURE, bandit, boltzmann, marginals, values
from training.advantage import CELLS, CellSignal, read, records, tally


def trl_advantages(rewards: list[float], group: int) -> list[float]:
    """TRL's advantage with the tiny policy's `scale_rewards="none"`: a reward minus its group's mean."""
    out = []
    for start in range(0, len(rewards), group):
        answers = rewards[start:start + group]
        out += [r - sum(answers) / group for r in answers]
    return out


def test_a_batch_of_groups_gives_each_cell_its_groups_and_mean_absolute_advantage() -> None:
    rewards = [1.0, 0.0, 0.0, 0.0,  # one valid answer of four: advantages 0.75, -0.25 x 3
               1.25, 1.25, 1.25, 1.25,  # every answer alike: advantage 0, nothing to learn
               2.0, 0.0, 2.0, 0.0,  # half and half: |advantage| 1 each
               0.5, 0.5, 0.5, 0.5]
    cells = [(2, 3)] * 8 + [(3, 4)] * 4 + [(2, 3)] * 4
    batch = tally(cells, trl_advantages(rewards, 4), 4)
    assert batch == {(2, 3): CellSignal(groups=3, completions=12, abs_advantage=1.5),
                     (3, 4): CellSignal(groups=1, completions=4, abs_advantage=4.0)}
    assert batch[(2, 3)].mean == 0.125 and batch[(3, 4)].mean == 1.0
    assert tally([(2, 3)] * 4, trl_advantages([1.25] * 4, 4), 4)[(2, 3)].mean == 0.0
    with pytest.raises(ValueError, match="not whole groups of 4"):
        tally([(2, 3)] * 6, [0.0] * 6, 4)


def test_a_stage_reads_the_sum_of_its_log_rows_and_none_without_a_record() -> None:
    first = {(2, 3): CellSignal(3, 12, 1.5)}
    second = {(2, 3): CellSignal(1, 4, 0.5), (3, 4): CellSignal(1, 4, 4.0)}
    rows = [{"reward": 1.0, CELLS: records(first)}, {"reward": 0.5, CELLS: records(second)}, {CELLS: []}]
    assert records(second) == [
        {"agents": 2, "size": 3, "groups": 1, "completions": 4, "abs_advantage": 0.5},
        {"agents": 3, "size": 4, "groups": 1, "completions": 4, "abs_advantage": 4.0}]
    assert read(rows) == {(2, 3): CellSignal(4, 16, 2.0), (3, 4): CellSignal(1, 4, 4.0)}
    assert read([{"reward": 1.0}]) is None and read([]) is None  # stage 0, or trained before the record
    assert read([{CELLS: []}]) == {}


CONFIG = EnvConfig(data_ratio={3: 0.5, 4: 0.5}, hole_ratio={3: 0.2, 4: 0.3}, wait_ratio={3: 0.25, 4: 0.5},
                   agent_ratio={2: 1.0}, num_instances=64)
STAGE_1 = {(2, 3): CellSignal(4, 16, 4.0), (2, 4): CellSignal(4, 16, 8.0)}  # mean |advantage| 0.25 and 0.5
STAGE_2 = {(2, 3): CellSignal(2, 8, 6.0), (3, 3): CellSignal(2, 8, 2.0)}  # 0.75 and 0.25
ARMS = [(2, 3), (2, 4), (3, 3), (3, 4)]


def test_q_after_two_stages_is_td0_from_the_optimistic_prior() -> None:
    assert (ALPHA, PRIOR, TEMPERATURE) == (0.5, 1.0, 0.25)
    q = values([STAGE_1, STAGE_2], ARMS)
    assert q == {(2, 3): 0.6875,  # 0.5 * 0.25 + 0.5 * 1 = 0.625, then 0.5 * 0.75 + 0.5 * 0.625
                 (2, 4): 0.75,  # 0.5 * 0.5 + 0.5 * 1, not trained in stage 2: kept
                 (3, 3): 0.625,  # first trained in stage 2: 0.5 * 0.25 + 0.5 * 1
                 (3, 4): 1.0}  # never trained: the prior
    assert values([], ARMS) == dict.fromkeys(ARMS, 1.0)
    assert values([{(5, 9): CellSignal(1, 4, 4.0)}], ARMS) == dict.fromkeys(ARMS, 1.0)  # not an arm


def test_the_shares_are_boltzmann_over_q_and_the_config_takes_their_marginals() -> None:
    q = values([STAGE_1, STAGE_2], ARMS)
    weights = {(2, 3): math.exp(2.75), (2, 4): math.exp(3.0), (3, 3): math.exp(2.5), (3, 4): math.exp(4.0)}
    total = sum(weights.values())
    joint = boltzmann(q)
    for cell in ARMS:
        assert joint[cell] == pytest.approx(weights[cell] / total, abs=1e-9)
    by_size, by_count = marginals(joint)
    assert by_size[3] == pytest.approx((weights[(2, 3)] + weights[(3, 3)]) / total, abs=1e-9)  # 0.2714
    assert by_size[4] == pytest.approx((weights[(2, 4)] + weights[(3, 4)]) / total, abs=1e-9)
    assert by_count[2] == pytest.approx((weights[(2, 3)] + weights[(2, 4)]) / total, abs=1e-9)  # 0.3485
    assert by_count[3] == pytest.approx((weights[(3, 3)] + weights[(3, 4)]) / total, abs=1e-9)

    answer = bandit(_evidence(STAGE_1, STAGE_2), seed=0)
    assert answer.error is None
    config = answer.projection.config
    assert config.data_ratio == {3: 0.271, 4: 0.729} and config.agent_ratio == {2: 0.349, 3: 0.651}
    assert (config.hole_ratio, config.wait_ratio, config.num_instances) == \
        (CONFIG.hole_ratio, CONFIG.wait_ratio, CONFIG.num_instances)
    assert answer.rationale.splitlines()[1:] == [
        "2 agents, size 3: stage 1: r 0.250 (4 groups), stage 2: r 0.750 (2 groups); Q 0.688, share 0.153",
        "2 agents, size 4: stage 1: r 0.500 (4 groups); Q 0.750, share 0.196",
        "3 agents, size 3: stage 2: r 0.250 (2 groups); Q 0.625, share 0.119",
        "3 agents, size 4: never trained; Q 1.000 (prior), share 0.533",
        "data_ratio (each size's cells summed): 3: 0.5 -> 0.271, 4: 0.5 -> 0.729",
        "agent_ratio (each count's cells summed): 2=1 -> 2=0.349, 3=0.651"]
    assert ENGINEERS["bandit"].same_when_asked_again
    assert bandit(_evidence(STAGE_1, STAGE_2), seed=9) == answer  # the logs alone decide


def test_after_stage_0_every_cell_has_the_prior_and_the_shares_are_uniform() -> None:
    answer = bandit(Evidence(StageResult(0, CONFIG, {}), agent_counts=(2, 3)), seed=0)
    assert answer.projection.config.data_ratio == {3: 0.5, 4: 0.5}
    assert answer.projection.config.agent_ratio == {2: 0.5, 3: 0.5}
    assert "no stage has trained yet" in answer.rationale


def test_without_the_runs_agent_counts_the_mix_stays_and_the_sizes_follow_the_configs_count() -> None:
    evidence = Evidence(StageResult(1, CONFIG, {}, cells=STAGE_1), (StageResult(0, CONFIG, {}),))
    config = bandit(evidence, seed=0).projection.config
    w3, w4 = math.exp(4 * 0.625), math.exp(4 * 0.75)
    assert config.agent_ratio == {2: 1.0}
    assert config.data_ratio == {3: round(w3 / (w3 + w4), 3), 4: round(w4 / (w3 + w4), 3)} == {3: 0.378, 4: 0.622}


@pytest.mark.parametrize("missing", ["current", "history"])
def test_a_trained_stage_without_per_cell_advantages_fails_the_proposal_loudly(missing: str) -> None:
    evidence = _evidence(None, STAGE_2) if missing == "history" else _evidence(STAGE_1, None)
    answer = bandit(evidence, seed=0)
    stage = 1 if missing == "history" else 2
    assert answer.projection is None and answer.proposed is None
    assert answer.error == (
        f"the bandit reads each trained stage's GRPO advantages per cell (agent count, map size) from its training "
        f"logs, and stage {stage} recorded none (trained before the record existed?): its Q values would rest on "
        f"part of the run, so it proposes nothing")


def test_a_mix_the_next_stage_cannot_fill_goes_back_to_the_current_one() -> None:
    def cannot_fill(config: EnvConfig) -> Unfillable | None:
        return Unfillable(None, "3 agents: cannot") if 3 in config.agent_counts else None

    answer = bandit(_evidence(STAGE_1, STAGE_2), seed=0, cannot_fill=cannot_fill)
    assert answer.projection.config.agent_ratio == {2: 1.0}
    assert answer.projection.config.data_ratio == {3: 0.271, 4: 0.729}
    assert answer.rationale.endswith("agent_ratio: back to 2=1: the generator could not fill the config "
                                     "(3 agents: cannot)")


def _evidence(first: dict | None, second: dict | None) -> Evidence:
    return Evidence(StageResult(2, CONFIG, {}, cells=second),
                    (StageResult(0, CONFIG, {}), StageResult(1, CONFIG, {}, cells=first)), round_index=3,
                    agent_counts=(2, 3))
