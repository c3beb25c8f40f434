"""The evidence engineer: scripted dev boards, and the exact config and rationale they lead to."""

from __future__ import annotations

from envsim.generator import Unfillable
from envsim.scoring import Tally
from lab.context import BoardOutcome, Evidence, StageResult
from lab.engineers import ENGINEERS, evidence_engineer, shares
from lab.engineers.evidence import FLOOR, read_size
from tests.engineers.scripts import CONFIG


def B(size: int, hole: float, wait: bool, failure: str | None = None) -> BoardOutcome:  # noqa: N802
    return BoardOutcome(size, hole, wait, failure is None, failure)


BOARDS = (
    # size 3: mixed outcomes at holes 0.1-0.2 (1 of 2 failed) and 0.2-0.3 (1 of 2); 2 of its 3 failures need a wait
    B(3, 0.0, False), B(3, 0.1111, True), B(3, 0.1111, True, "hole"), B(3, 0.2222, False),
    B(3, 0.2222, True, "vertex_conflict"), B(3, 0.4444, False, "hole"),
    # size 4: every board failed, 1 of 4 needs a wait
    B(4, 0.125, True, "hole"), B(4, 0.25, False, "hole"), B(4, 0.3125, False, "parse_error"), B(4, 0.5, False, "hole"),
    # size 5: every board valid
    B(5, 0.12, True), B(5, 0.2, False), B(5, 0.32, True), B(5, 0.48, False),
)
BY_SIZE = {3: Tally(6, 3, 3, {"hole": 2, "vertex_conflict": 1}), 4: Tally(4, 0, 0, {"hole": 3, "parse_error": 1}),
           5: Tally(4, 4, 4, {})}


def evidence(history: tuple[StageResult, ...] = ()) -> Evidence:
    return Evidence(StageResult(1, CONFIG, BY_SIZE, boards=BOARDS), history, round_index=2, rounds_left=2)


def test_it_reads_each_size_board_by_board() -> None:
    three = read_size([b for b in BOARDS if b.size == 3], 0.2)
    assert (three.boards, three.failed, three.wait_failed) == (6, 3, 2)
    assert three.types == {"hole": 2, "vertex_conflict": 1}
    assert three.bins == ((0.1, 0.2, 2, 1), (0.2, 0.3, 2, 1))
    assert three.hole_target == (0.5 * 0.1111 + 0.5 * 0.2222) / 1.0  # each mixed bin weighs 1 * 1 / 2
    four = read_size([b for b in BOARDS if b.size == 4], 0.2)
    assert four.bins == () and four.hole_target == 0.2 - 0.1  # all failed: fewer holes
    five = read_size([b for b in BOARDS if b.size == 5], 0.2)
    assert five.failed == 0 and five.hole_target == 0.2 + 0.1  # none failed: more holes
    assert read_size([], 0.2).hole_target is None
    apart = read_size([B(6, 0.1, False), B(6, 0.2, False), B(6, 0.4, False, "hole")], 0.3)  # no mixed bin
    assert apart.bins == () and apart.hole_target == (0.15 + 0.4) / 2  # the boundary between valid and failed
    edge = read_size([B(6, 0.5, False), B(6, 0.5, False, "hole")], 0.45)  # 0.5 falls in the last bin
    assert edge.bins == ((0.4, 0.5, 2, 1),) and edge.hole_target == 0.5


def test_it_moves_holes_and_waits_toward_the_failures_and_weights_the_data_by_them() -> None:
    assert (CONFIG.hole_ratio[3], CONFIG.wait_ratio[3]) == (0.2, 0.25)
    answer = evidence_engineer(evidence())
    config = answer.projection.config
    # size 3: hole 0.2 + 0.5 * (0.16665 - 0.2) = 0.183 -> 0.18; wait 0.25 + 0.5 * (2/3 - 0.25) = 0.458 -> 0.46
    # size 4: hole 0.2 -> 0.15 (toward 0.1); wait toward 1/4: stays 0.25. size 5: hole toward 0.3: 0.25, wait kept
    assert config.hole_ratio == {3: 0.18, 4: 0.15, 5: 0.25}
    assert config.wait_ratio == {3: 0.46, 4: 0.25, 5: 0.25}
    # failures 3, 4, 0 -> weights sqrt(3), 2, 0 -> shares 0.464, 0.536, 0 -> the floor 0.04 for size 5
    assert config.data_ratio == shares({3: 3 ** 0.5 / (3 ** 0.5 + 2), 4: 2 / (3 ** 0.5 + 2), 5: FLOOR})
    assert config.data_ratio == {3: 0.446, 4: 0.515, 5: 0.039}
    assert answer.rationale.splitlines() == [
        "size 3: 3 of 6 dev boards failed (hole 2, vertex_conflict 1); 2 of its 3 failures need a wait: wait_ratio "
        "0.25 -> 0.46 (toward 0.67); holes 0.1-0.2 fail 1 of 2, holes 0.2-0.3 fail 1 of 2: hole_ratio 0.2 -> 0.18 "
        "(toward 0.17)",
        "size 4: 4 of 4 dev boards failed (hole 3, parse_error 1); 1 of its 4 failures need a wait: wait_ratio "
        "0.25 -> 0.25 (toward 0.25); every board failed: hole_ratio 0.2 -> 0.15 (toward 0.10)",
        "size 5: 0 of 4 dev boards failed; no board failed: hole_ratio 0.2 -> 0.25 (toward 0.30)",
        "data_ratio by failures ** (1/2), floor 0.04 (7 failures): 3: 0.333 -> 0.446, 4: 0.333 -> 0.515, "
        "5: 0.333 -> 0.039",
    ]
    assert answer.compute is None  # no probe


def test_a_size_whose_config_works_is_kept() -> None:
    before = StageResult(0, CONFIG, {3: Tally(6, 2, 2, {"hole": 4}), 4: Tally(4, 0, 0, {"hole": 4}),
                                     5: Tally(4, 4, 4, {})})
    answer = evidence_engineer(evidence((before,)))
    config = answer.projection.config
    # size 3 rose from 33% to 50% valid (>= 0.1): kept; size 4 stayed at 0% and size 5 at 100%: moved as before
    assert (config.hole_ratio, config.wait_ratio) == ({3: 0.2, 4: 0.15, 5: 0.25}, {3: 0.25, 4: 0.25, 5: 0.25})
    assert config.data_ratio == {3: 0.446, 4: 0.515, 5: 0.039}  # the data still follows the failures
    assert answer.rationale.splitlines()[0] == ("size 3: 3 of 6 dev boards failed (hole 2, vertex_conflict 1); valid "
                                                "33% -> 50% since stage 0: the config works, hole 0.2 and wait 0.25 "
                                                "kept")


def test_a_size_the_stage_cannot_fill_goes_back_and_no_boards_keep_everything() -> None:
    def cannot_fill(config):
        return Unfillable(3, "size 3: too many waits") if config.wait_ratio[3] != 0.25 else None

    answer = evidence_engineer(evidence(), cannot_fill=cannot_fill)
    config = answer.projection.config
    assert (config.hole_ratio[3], config.wait_ratio[3]) == (0.2, 0.25)
    assert (config.hole_ratio[4], config.hole_ratio[5]) == (0.15, 0.25)
    assert answer.rationale.splitlines()[-1] == ("size 3: back to hole 0.2, wait 0.25: the generator could not fill "
                                                 "the config (size 3: too many waits)")
    empty = ENGINEERS["evidence"].propose(Evidence(StageResult(1, CONFIG, {})), seed=0)
    assert empty.projection.config == CONFIG
    assert empty.rationale.splitlines()[-1] == "no dev boards to read: data_ratio kept"
