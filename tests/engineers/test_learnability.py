"""The learnability engineer: candidates, the kept pair, data weights and the compute of its probes."""

from __future__ import annotations

from envsim.config import EnvConfig
from envsim.generator import Unfillable
from lab.engineers import (
    LEARN_FLOOR,
    candidates,
    learnability,
    shares,
)
from tests.engineers.scripts import CONFIG, ScriptedProbe, evidence

# ---------------------------------------------------------------- sampling for learnability


def test_the_candidates_are_the_current_pair_then_fewer_and_more_holes_then_another_wait() -> None:
    assert candidates(CONFIG, 3) == [(0.2, 0.25), (0.1, 0.25), (0.3, 0.25), (0.2, 0.5)]
    edge = CONFIG.model_copy(update={"hole_ratio": {3: 0.0, 4: 0.5, 5: 0.2}, "wait_ratio": {3: 0.9, 4: 0.5, 5: 0.25}})
    assert candidates(edge, 3) == [(0.0, 0.9), (0.1, 0.9), (0.0, 0.65)]  # no hole ratio below 0: once
    assert candidates(edge, 4) == [(0.5, 0.5), (0.4, 0.5), (0.5, 0.75)]


def test_learnability_keeps_the_most_learnable_candidate_and_weights_the_sizes_by_it() -> None:
    probe = ScriptedProbe({(3, 0.3, 0.25): 0.2, (3, 0.2, 0.25): 0.15, (4, 0.2, 0.5): 0.1, (4, 0.1, 0.25): 0.1,
                           (4, 0.2, 0.25): 0.1, (4, 0.3, 0.25): 0.1, (5, 0.1, 0.25): 0.0, (5, 0.2, 0.25): 0.0,
                           (5, 0.3, 0.25): 0.0, (5, 0.2, 0.5): 0.0},
                          unmakeable=((5, 0.2, 0.5),))
    answer = learnability(evidence(), seed=0, probe_fn=probe)
    config = answer.projection.config
    assert len(probe.calls) == 12  # 4 candidates x 3 sizes, one unmakeable
    assert config.hole_ratio == {3: 0.3, 4: 0.2, 5: 0.2}  # size 4: a four-way tie keeps the current pair
    assert config.wait_ratio == {3: 0.25, 4: 0.25, 5: 0.25}
    assert config.data_ratio == shares({3: 0.2, 4: 0.1, 5: LEARN_FLOOR}) == {3: 0.625, 4: 0.312, 5: 0.063}
    lines = answer.rationale.splitlines()
    assert lines[0] == ("size 3: hole 0.3, wait 0.25 kept (p 50%, learnability 0.200); next best hole 0.2, wait 0.25 "
                        "(p 50%, learnability 0.150); data_ratio 0.333 -> 0.625")
    assert lines[2].startswith("size 5: hole 0.2, wait 0.25 kept (p 50%, learnability 0.000); next best hole 0.1")
    assert answer.compute == {"completions": 11 * 32, "seconds": 22.0, "probes": 11, "cached": 0}
    assert lines[-1] == "probe compute: 352 sampled answers, 22.0 s (11 probes, 0 cached)"


def test_learnability_counts_no_compute_for_cached_probes_and_reverts_what_the_stage_cannot_fill() -> None:
    probe = ScriptedProbe({(3, 0.2, 0.5): 0.2, (4, 0.3, 0.25): 0.2}, cached=True)
    refused = []

    def cannot_fill(config: EnvConfig) -> Unfillable | None:
        refused.append(dict(config.wait_ratio))
        return Unfillable(3, "size 3: too many waits") if config.wait_ratio[3] == 0.5 else None

    answer = learnability(evidence(), seed=0, probe_fn=probe, cannot_fill=cannot_fill)
    config = answer.projection.config
    assert (config.hole_ratio, config.wait_ratio) == ({3: 0.2, 4: 0.3, 5: 0.2}, {3: 0.25, 4: 0.25, 5: 0.25})
    assert len(refused) == 2  # refused, naming size 3: size 3 reverted (size 4 keeps its choice)
    assert answer.rationale.splitlines()[-2] == ("size 3: back to hole 0.2, wait 0.25: the generator could not "
                                                 "fill the config (size 3: too many waits)")
    assert answer.compute == {"completions": 0, "seconds": 0.0, "probes": 12, "cached": 12}


def test_learnability_without_a_probe_fails_saying_why() -> None:
    answer = learnability(evidence(), seed=0)
    assert answer.projection is None and "needs a probe" in answer.error
