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


SMALL = EnvConfig.default((3, 4), num_instances=16)  # room for round(0.5 x 16) = 8 boards in the buffer
BOARDS = {  # each board's valid answers of 8: p_b(1 - p_b) is 16/64 for 4, 15/64 for 3 or 5, 12/64 for 2 or 6, ...
    (3, 0.25, 0.75): [4, 0, 8, 3, 5] + [0] * 11,
    (3, 0.08, 0.25): [2, 6] + [8] * 14,
    (4, 0.08, 0.25): [4, 4, 1, 7] + [0] * 12,
}


def drawn(size: int, hole: float, wait: float, config: EnvConfig = SMALL) -> list:
    """The boards the probe of one cell drew (seed 0, as `BoardProbe`'s results say)."""
    from training.probe import probe_boards

    one = EnvConfig(data_ratio={size: 1.0}, hole_ratio={size: hole}, wait_ratio={size: wait},
                    agent_ratio=config.agent_ratio, num_instances=config.num_instances)
    return probe_boards(one, size, LEARN_BOARDS, 0)


def test_the_buffer_keeps_the_most_learnable_boards_in_rank_order_ties_by_size_cell_and_board() -> None:
    answer = learnability(evidence(config=SMALL), seed=0, probe_fn=BoardProbe(BOARDS))
    a, b, c = drawn(3, 0.25, 0.75), drawn(3, 0.08, 0.25), drawn(4, 0.08, 0.25)
    # 1/4: size 3's board 0, then (a tie: the larger size after) size 4's boards 0 and 1; 15/64: size 3's boards 3
    # and 4; 3/16: boards 0 and 1 of size 3's cell (0.08, 0.25); 7/64: size 4's boards 2 and 3 tie for the last
    # place, and the earlier board takes it
    assert [x.id for x in answer.replay] == [x.id for x in (a[0], c[0], c[1], a[3], a[4], b[0], b[1], c[2])]
    assert all(x.opt_soc is not None and x.reference_plan is not None for x in answer.replay)  # labelled
    assert answer.rationale.splitlines()[-2] == (
        "buffer: 8 of the stage's 16 boards replayed (room for 8, 0.5 of them), the most learnable of 192 boards "
        "probed (9 with learnability above 0); sizes 3: 5, 4: 3; the other 8 drawn fresh from the config")


def test_boards_always_or_never_solved_never_enter_the_buffer_and_held_out_boards_are_passed_over() -> None:
    few = {(3, 0.25, 0.75): [4, 0, 8, 3] + [8] * 12}  # 2 boards with answers that disagree, 14 without
    answer = learnability(evidence(config=SMALL), seed=0, probe_fn=BoardProbe(few))
    a = drawn(3, 0.25, 0.75)
    assert [x.id for x in answer.replay] == [a[0].id, a[3].id]
    assert answer.rationale.splitlines()[-2].endswith("sizes 3: 2; the other 14 drawn fresh from the config")
    held = learnability(evidence(config=SMALL), seed=0, probe_fn=BoardProbe(few), held_out=frozenset({a[0].id}))
    assert [x.id for x in held.replay] == [a[3].id]
    assert "; 1 held-out boards passed over;" in held.rationale.splitlines()[-2]


def test_the_buffer_draws_again_the_boards_the_probe_answered() -> None:
    """`probe_boards` is the probe's own draw: the boards a probe answers are the ones the buffer replays."""
    from envsim.generator import generate
    from training.probe import probe_boards

    one = EnvConfig(data_ratio={3: 1.0}, hole_ratio={3: 0.25}, wait_ratio={3: 0.75}, num_instances=16)
    assert probe_boards(one, 3, 16, 7) == generate(one.one_size(3), 16, seed=7)
