"""The engineers that keep what works, on scripted evidence: `climb` (steps one knob from its best stage's config by
its own dev gains: it finds "fewer holes" by itself) and `levels` (a SEC bandit over difficulty levels)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from envsim.config import EnvConfig
from envsim.scoring import Tally
from lab.context import Evidence, StageResult
from lab.engineers import ENGINEERS
from lab.engineers.climb import climb, gains, last_move
from lab.engineers.levels import KNOBS, levels, mix_of, values
from training.advantage import CellSignal

BASE = EnvConfig(data_ratio={5: 0.5, 6: 0.5}, hole_ratio={5: 0.2, 6: 0.2}, wait_ratio={5: 0.5, 6: 0.5},
                 agent_ratio={2: 0.5, 3: 0.5}, num_instances=64)


def with_(holes: float = 0.2, waits: float = 0.5, mix: dict[int, float] | None = None) -> EnvConfig:
    return BASE.model_copy(update={"hole_ratio": {5: holes, 6: holes}, "wait_ratio": {5: waits, 6: waits},
                                   "agent_ratio": mix or {2: 0.5, 3: 0.5}})


def stage(k: int, config: EnvConfig, valid: int, cells=None) -> StageResult:
    return StageResult(k, config, {5: Tally(50, valid // 2, 0, {}), 6: Tally(50, valid - valid // 2, 0, {})},
                       cells=cells)


def test_climb_steps_its_first_knob_the_way_the_seed_draws():
    for seed in (0, 1, 2, 3):
        ev = Evidence(stage(0, BASE, 30), round_index=1, rounds_left=3, agent_counts=(2, 3))
        answer = ENGINEERS["climb"].propose(ev, seed=seed)
        way = int(np.random.default_rng([seed, 1]).choice([-1, 1]))
        assert answer.projection.config == with_(holes=round(0.2 + 0.05 * way, 4))
        assert answer.rationale.splitlines() == [
            "dev gains of the trained stages: none yet", "from the config in force (no stage has gained yet)",
            f"holes {'up' if way > 0 else 'down'}: the way the seed drew (this knob has not moved yet): hole_ratio "
            f"0.2 -> {0.2 + 0.05 * way:g} (mean over sizes)"]


def test_climb_finds_fewer_holes_from_its_own_gains():
    """Holes went up 0.2 -> 0.25 and the stage gained less: from the best stage's config, holes go down."""
    stages = (stage(0, BASE, 30), stage(1, with_(0.2), 32), stage(2, with_(0.25), 33))
    ev = Evidence(stage(3, with_(0.25, 0.6), 33), stages, round_index=4, rounds_left=2, agent_counts=(2, 3))
    assert gains((*stages, ev.current)) == pytest.approx({1: 0.02, 2: 0.01, 3: 0.0})
    assert last_move((*stages, ev.current), "holes") == -1
    answer = climb(ev, seed=5)
    assert answer.projection.config == with_(0.15)  # stage 1's config, holes stepped down
    assert answer.rationale.splitlines()[1:] == [
        "from the config of stage 1 (its gain was the largest)",
        "holes down: back: the last move this way gained less: hole_ratio 0.2 -> 0.15 (mean over sizes)"]


def test_climb_keeps_a_direction_that_gained_and_moves_the_mix_toward_more_agents():
    stages = (stage(0, BASE, 30), stage(1, with_(), 31), stage(2, with_(mix={2: 0.4, 3: 0.6}), 34))
    ev = Evidence(stage(3, with_(mix={2: 0.4, 3: 0.6}, waits=0.6), 34), stages, round_index=6, rounds_left=1,
                  agent_counts=(2, 3))
    assert last_move((*stages, ev.current), "agents") == 1  # more agents gained more (+3 against +1)
    answer = climb(ev, seed=0)
    assert answer.projection.config == with_(mix={2: 0.3, 3: 0.7})  # from stage 2 (gain +3), 0.1 more to 3 agents


def test_climb_turns_at_a_range_s_end():
    ev = Evidence(stage(0, with_(holes=0.0), 30), round_index=1, rounds_left=1)
    seed = next(s for s in range(20) if np.random.default_rng([s, 1]).choice([-1, 1]) < 0)  # drawn: down
    answer = climb(ev, seed=seed)
    assert answer.projection.config == with_(holes=0.05)
    assert "at the end of its range, so the other way" in answer.rationale


def signal(mean: float) -> dict:
    return {(2, 5): CellSignal(4, 32, mean * 32), (3, 6): CellSignal(4, 32, mean * 32)}


def test_levels_credits_each_knob_s_level_and_draws_from_its_boltzmann_shares():
    most = mix_of("most", (2, 3))
    assert (most, mix_of("fewest", (2, 3, 4, 5))) == ({2: 0.333, 3: 0.667}, {2: 0.4, 3: 0.3, 4: 0.2, 5: 0.1})
    s1 = stage(1, with_(0.05, 0.9, most), 40, cells=signal(0.2))
    s2 = stage(2, with_(0.05, 0.5, most), 41, cells=signal(0.6))
    trained = [s1, s2]
    q_holes = values(trained, "holes", (2, 3))
    assert q_holes == pytest.approx({"0.05": 0.5 * 0.6 + 0.5 * (0.5 * 0.2 + 0.5 * 1.0), "0.15": 1.0, "0.3": 1.0})
    assert values(trained, "waits", (2, 3)) == pytest.approx({"0.5": 0.8, "0.75": 1.0, "0.9": 0.6})
    assert values([stage(1, BASE, 40, cells=signal(0.2))], "holes", (2, 3)) == {"0.05": 1, "0.15": 1, "0.3": 1}
    ev = Evidence(s2, (stage(0, BASE, 30), s1), round_index=3, rounds_left=1, agent_counts=(2, 3))
    for seed in (0, 7):
        rng = np.random.default_rng([seed, 3])
        drawn = []
        for knob in KNOBS:
            q = values(trained, knob, (2, 3))
            weights = [math.exp((v - max(q.values())) / 0.25) for v in q.values()]
            drawn.append(list(q)[int(rng.choice(len(q), p=np.array(weights) / sum(weights)))])
        answer = ENGINEERS["levels"].propose(ev, seed=seed)
        assert answer.projection.config == with_(float(drawn[0]), float(drawn[1]), mix_of(drawn[2], (2, 3)))


def test_levels_refuses_a_trained_stage_without_its_advantages():
    ev = Evidence(stage(1, BASE, 40), (stage(0, BASE, 30),), round_index=2, rounds_left=1)
    answer = levels(ev, seed=0)
    assert answer.projection is None and "stage(s) 1 recorded none" in answer.error
