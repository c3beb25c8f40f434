"""The learnability engineer (sampling for learnability): its grid, the kept cell, data weights, the random share
and the compute of its probes."""

from __future__ import annotations

from envsim.config import EnvConfig
from envsim.generator import GenerationError, Unfillable
from lab.engineers import (
    LEARN_ANSWERS,
    LEARN_BOARDS,
    LEARN_FLOOR,
    SFL_RANDOM_SHARE,
    grid,
    learnability,
    shares,
)
from tests.engineers.scripts import CONFIG, evidence
from training.probe import ProbeResult, SizeProbe


class BoardProbe:
    """A probe from a table: (size, hole, wait) -> each of the `LEARN_BOARDS` boards' valid answers out of
    `LEARN_ANSWERS`; a cell not in the table has no valid answer. Its numbers are the real `SizeProbe.of` of those
    answers; each probe costs 1.5 s. A cell in `unmakeable` raises as the generator does."""

    def __init__(self, table: dict[tuple[int, float, float], list[int]], unmakeable: tuple = (), cached: bool = False):
        self.table, self.unmakeable, self.cached, self.calls = table, unmakeable, cached, []

    def __call__(self, config: EnvConfig) -> ProbeResult:
        (size,) = config.sizes
        cell = (size, config.hole_ratio[size], config.wait_ratio[size])
        assert config.random_share == 0  # a cell is measured alone
        self.calls.append(cell)
        if cell in self.unmakeable:
            raise GenerationError(f"size {size}: cannot", size)
        valid = self.table.get(cell, [0] * LEARN_BOARDS)
        groups = [[a < v for a in range(LEARN_ANSWERS)] for v in valid]
        probe = SizeProbe.of(size, groups, groups)
        return ProbeResult({size: probe}, {size: 1.0}, LEARN_BOARDS * LEARN_ANSWERS, 1.5, cached=self.cached)


TABLE = {
    (3, 0.25, 0.75): [4] * 16,  # every board half valid: learnability 0.25, the most there is
    (3, 0.08, 0.25): [6] * 12 + [8] * 4,  # p 81%, learnability 12 x 0.1875 / 16 = 0.141
    (4, 0.08, 0.75): [2] * 16,  # a tie at 0.1875: the earlier cell of the grid is kept
    (4, 0.42, 0.25): [2] * 16,
}


def test_the_grid_spans_the_legal_ranges_in_six_cells() -> None:
    assert grid(2) == [(0.08, 0.25), (0.08, 0.75), (0.25, 0.25), (0.25, 0.75), (0.42, 0.25), (0.42, 0.75)]
    assert grid(4) == grid(2)
    assert grid(1) == [(0.08, 0.0), (0.25, 0.0), (0.42, 0.0)]  # a lone agent never waits


def test_each_size_keeps_its_most_learnable_cell_and_half_the_boards_are_drawn_broadly() -> None:
    probe = BoardProbe(TABLE, unmakeable=((5, 0.42, 0.75),))
    answer = learnability(evidence(), seed=0, probe_fn=probe)
    config = answer.projection.config
    assert probe.calls == [(s, h, w) for s in (3, 4, 5) for h, w in grid(2)]  # 18 probes, one unmakeable
    assert config.hole_ratio == {3: 0.25, 4: 0.08, 5: 0.08}  # size 5: nothing learnable, the first cell
    assert config.wait_ratio == {3: 0.75, 4: 0.75, 5: 0.25}
    assert config.data_ratio == shares({3: 0.25, 4: 0.1875, 5: LEARN_FLOOR}) == {3: 0.546, 4: 0.41, 5: 0.044}
    assert config.random_share == SFL_RANDOM_SHARE == 0.5
    assert (config.agent_ratio, config.num_instances) == (CONFIG.agent_ratio, CONFIG.num_instances)
    lines = answer.rationale.splitlines()
    assert lines[0] == ("size 3: hole 0.25, wait 0.75 (p 50%, learnability 0.250) kept, of 6 cells; runner-up hole "
                        "0.08, wait 0.25 (p 81%, learnability 0.141); data_ratio 0.333 -> 0.546")
    assert lines[1] == ("size 4: hole 0.08, wait 0.75 (p 25%, learnability 0.188) kept, of 6 cells; runner-up hole "
                        "0.42, wait 0.25 (p 25%, learnability 0.188); data_ratio 0.333 -> 0.41")
    assert lines[2] == ("size 5: hole 0.08, wait 0.25 (p 0%, learnability 0.000) kept, of 5 cells; runner-up hole "
                        "0.08, wait 0.75 (p 0%, learnability 0.000); data_ratio 0.333 -> 0.044")
    assert lines[3].startswith("random_share 0 -> 0.5: that share of each size's boards has its hole and wait")
    assert answer.compute == {"completions": 17 * 128, "seconds": 25.5, "probes": 17, "cached": 0}
    assert lines[-1] == "probe compute: 2176 sampled answers, 25.5 s (17 probes, 0 cached)"
    # every board of the 4 cells in the table with answers that disagree (16 + 12 + 16 + 16) fits the buffer's 256
    assert lines[-2] == ("buffer: 60 of the stage's 512 boards replayed (room for 256, 0.5 of them), the most "
                         "learnable of 272 boards probed (60 with learnability above 0); sizes 3: 28, 4: 32; the other "
                         "452 drawn fresh from the config")
    assert len(answer.replay) == 60 and len({b.id for b in answer.replay}) == 60
    assert answer.projection.adjustments == ()


def test_cached_cells_cost_nothing_and_a_kept_cell_the_stage_cannot_fill_goes_back() -> None:
    probe = BoardProbe(TABLE, cached=True)
    refused = []

    def cannot_fill(config: EnvConfig) -> Unfillable | None:
        refused.append(dict(config.wait_ratio))
        return Unfillable(3, "size 3: too many waits") if config.wait_ratio[3] == 0.75 else None

    answer = learnability(evidence(), seed=0, probe_fn=probe, cannot_fill=cannot_fill)
    config = answer.projection.config
    assert (config.hole_ratio, config.wait_ratio) == ({3: 0.2, 4: 0.08, 5: 0.08}, {3: 0.25, 4: 0.75, 5: 0.25})
    assert config.random_share == 0.5 and config.data_ratio == {3: 0.546, 4: 0.41, 5: 0.044}
    assert len(refused) == 2  # refused naming size 3: size 3 went back, size 4 keeps its cell
    assert answer.rationale.splitlines()[-3] == ("size 3: back to hole 0.2, wait 0.25: the generator could not "
                                                 "fill the config (size 3: too many waits)")
    assert answer.compute == {"completions": 0, "seconds": 0.0, "probes": 18, "cached": 18}


def test_a_size_with_no_makeable_cell_keeps_its_ratios_at_the_floor() -> None:
    probe = BoardProbe(TABLE, unmakeable=tuple((5, h, w) for h, w in grid(2)))
    answer = learnability(evidence(), seed=0, probe_fn=probe)
    config = answer.projection.config
    assert (config.hole_ratio[5], config.wait_ratio[5]) == (CONFIG.hole_ratio[5], CONFIG.wait_ratio[5])
    assert config.data_ratio == shares({3: 0.25, 4: 0.1875, 5: LEARN_FLOOR})
    assert answer.rationale.splitlines()[2] == ("size 5: no cell of the grid could be generated; kept hole 0.2, wait "
                                                "0.25; data_ratio 0.333 -> 0.044")


def test_learnability_without_a_probe_fails_saying_why() -> None:
    answer = learnability(evidence(), seed=0)
    assert answer.projection is None and "needs a probe" in answer.error


def test_the_planned_probe_answers_are_what_a_proposal_samples_when_every_cell_is_made() -> None:
    """What `--match-compute` plans (`planned_answers`) against what a proposal's probes sampled (`compute`): 3
    sizes x 6 cells x 16 boards x 8 answers; one cell fewer where the generator cannot make it."""
    from lab.engineers.learnability import planned_answers

    answer = learnability(evidence(), seed=0, probe_fn=BoardProbe(TABLE))
    assert planned_answers(CONFIG) == answer.compute["completions"] == 3 * 6 * 128 == 2304
    assert learnability(evidence(), seed=0, probe_fn=BoardProbe(TABLE, unmakeable=((5, 0.42, 0.75),))
                        ).compute["completions"] == 2304 - 128
    assert planned_answers(CONFIG, (2, 3, 4)) == 3 * (6 + 3) * 128  # a probe of every size per agent count
