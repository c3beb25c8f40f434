import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envsim.config import EnvConfig
from envsim.generator import (
    GenerationError,
    _components,
    _largest_remainder,
    cell_counts,
    generate,
    ice_cells,
    placement,
    room,
    round_half_up,
    size_counts,
)
from envsim.scoring import score

SMALL = EnvConfig(data_ratio={3: 0.25, 4: 0.25, 5: 0.5}, hole_ratio={3: 0.2, 4: 0.3, 5: 0.5},
                  wait_ratio={3: 0.5, 4: 0.25, 5: 0.0}, num_agents=2, num_instances=20)


def test_size_counts_follow_the_data_ratio_by_largest_remainder():
    assert size_counts(SMALL, 20) == {3: 5, 4: 5, 5: 10}
    assert size_counts(SMALL, 7) == {3: 2, 4: 2, 5: 3}  # 1.75, 1.75, 3.5: the two .75 remainders win
    assert sum(size_counts(EnvConfig.default(), 101).values()) == 101


def test_every_board_meets_its_size_knobs_exactly():
    boards = generate(SMALL, seed=3)
    assert [b.size for b in boards] == [3] * 5 + [4] * 5 + [5] * 10
    for size, wait_count in ((3, 3), (4, 1), (5, 0)):  # round_half_up(0.5 * 5) = 3, (0.25 * 5) = 1
        group = [b for b in boards if b.size == size]
        assert sum(b.needs_wait for b in group) == wait_count
        assert all(len(b.holes) == round_half_up(SMALL.hole_ratio[size] * size * size) for b in group)
    for b in boards:
        assert b.num_agents == 2 and b.labelled
        comps = _components(b.size, b.hole_set)
        home = next(c for c in comps if b.starts[0] in c)
        assert all(cell in home for cell in b.starts + b.goals)


def test_same_seed_same_bytes_other_seed_other_boards():
    def digest(boards):
        return hashlib.sha256("\n".join(b.to_json() for b in boards).encode()).hexdigest()

    assert digest(generate(SMALL, seed=7)) == digest(generate(SMALL, seed=7))
    assert digest(generate(SMALL, seed=7)) != digest(generate(SMALL, seed=8))


def test_changing_one_size_leaves_the_other_sizes_boards_alone():
    a = generate(SMALL, seed=1)
    b = generate(SMALL.model_copy(update={"hole_ratio": {**SMALL.hole_ratio, 3: 0.0}}), seed=1)
    assert [x for x in a if x.size != 3] == [x for x in b if x.size != 3]
    assert [x for x in a if x.size == 3] != [x for x in b if x.size == 3]


def test_impossible_configs_fail_naming_the_size_and_knob():
    crowded = EnvConfig(data_ratio={3: 1.0}, hole_ratio={3: 0.5}, wait_ratio={3: 0.0}, num_agents=5)
    with pytest.raises(GenerationError, match="size 3: hole_ratio 0.5 leaves 4 ice cells, too few for 5 agents"):
        generate(crowded, 4)
    lone = EnvConfig(data_ratio={4: 1.0}, hole_ratio={4: 0.0}, wait_ratio={4: 0.5}, num_agents=1)
    with pytest.raises(GenerationError, match="size 4: wait_ratio 0.5 asks for boards that need a wait, and a lone"):
        generate(lone, 4)
    # On an open 2x2 board two agents always pass without waiting: the wait stratum runs dry.
    never_waits = EnvConfig(data_ratio={2: 1.0}, hole_ratio={2: 0.0}, wait_ratio={2: 1.0}, num_agents=2)
    with pytest.raises(GenerationError, match=r"size 2 \(hole_ratio 0, wait_ratio 1, 2 agents\): found only 0 of 3 "
                                              r"boards after 2000 tries \(still short of 3 needing a wait"):
        generate(never_waits, 3)


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10**6), st.integers(2, 4))
def test_reference_plans_score_valid_and_optimal(seed, agents):
    config = EnvConfig(data_ratio={4: 0.5, 6: 0.5}, hole_ratio={4: 0.25, 6: 0.3}, wait_ratio={4: 0.5, 6: 0.5},
                       num_agents=agents, num_instances=4)
    for board in generate(config, seed=seed):
        outcome = score(board, board.reference_plan)
        assert outcome.valid and outcome.soc_optimal and outcome.soc == board.opt_soc
        assert outcome.makespan >= board.opt_makespan
        assert outcome.optimal == (outcome.makespan == board.opt_makespan)


# ---------------------------------------------------------------- random_share: boards drawn broadly

# Digests of boards made by the generator before `random_share` existed: with it at 0 they stay byte for byte.
BEFORE = {"default-64-3": "8116d78ee586b33cfc2e692b242e49ee52a5c736223a2c20f93e45a344be36e3",
          "small-7": "5a9df58d9b0e549eef5b767085bc4120e22206564e1090129ee28616f51f608f",
          "three-agents-40-11": "af3fba620762a8963e62c205b39b399f64615a6caa03703a4e7f7323a1728a0f"}


def _digest(boards):
    return hashlib.sha256("\n".join(b.to_json() for b in boards).encode()).hexdigest()


def test_with_no_random_share_the_boards_are_those_made_before_it_existed():
    assert _digest(generate(EnvConfig.default(), 64, seed=3)) == BEFORE["default-64-3"]
    assert _digest(generate(SMALL, seed=7)) == BEFORE["small-7"]
    assert _digest(generate(EnvConfig.default(num_agents=3), 40, seed=11)) == BEFORE["three-agents-40-11"]
    zero = EnvConfig(**{**SMALL.model_dump(), "random_share": 0.0})
    assert _digest(generate(zero, seed=7)) == BEFORE["small-7"]


def test_a_random_share_draws_that_share_of_each_sizes_boards_broadly_and_reproducibly():
    config = EnvConfig(**{**EnvConfig.default((4, 6)).model_dump(), "random_share": 0.5})
    boards = generate(config, 40, seed=5)
    assert _digest(boards) == _digest(generate(config, 40, seed=5)) != _digest(generate(config, 40, seed=6))
    for size in (4, 6):
        group = [b for b in boards if b.size == size]
        own, broad = group[:10], group[10:]  # 20 a size: round_half_up(0.5 * 20) = 10 drawn broadly, after
        own_holes = round_half_up(0.2 * size * size)
        assert [len(b.holes) for b in own] == [own_holes] * 10
        assert sum(b.needs_wait for b in own) == round_half_up(0.25 * 10)  # the size's own wait ratio, on its 10
        assert sum(len(b.holes) != own_holes for b in broad) >= 7  # hole ratios drawn over 0..0.5
        assert len({len(b.holes) for b in broad}) >= 4
        assert all(len(b.holes) <= round_half_up(0.5 * size * size) for b in broad)
        assert len({b.id for b in group}) == 20 and all(b.labelled for b in group)


def test_a_whole_random_share_ignores_the_sizes_own_knobs_and_a_lone_agent_never_waits():
    crowded = EnvConfig(data_ratio={4: 1.0}, hole_ratio={4: 0.5}, wait_ratio={4: 1.0}, num_agents=1,
                        random_share=1.0)
    boards = generate(crowded, 12, seed=0)  # the own knobs (a lone agent asked to wait) are never used
    assert len(boards) == 12 and not any(b.needs_wait for b in boards)
    assert len({len(b.holes) for b in boards}) >= 3


# ---------------------------------------------------------------- agent_ratio: a mix of agent counts

MIX = EnvConfig(data_ratio={3: 0.5, 4: 0.5}, hole_ratio={3: 0.2, 4: 0.25}, wait_ratio={3: 0.5, 4: 0.25},
                agent_ratio={2: 0.5, 3: 0.5}, num_instances=22)


def test_cell_counts_split_the_boards_over_counts_exactly_as_the_ratio_says():
    # 11 boards a size; 11 of each count over the stage, dealt 2, 3, 2, 3, ... board by board across the sizes
    assert cell_counts(MIX, 22) == {3: {2: 6, 3: 5}, 4: {2: 5, 3: 6}}
    assert cell_counts(SMALL, 20) == {3: {2: 5}, 4: {2: 5}, 5: {2: 10}}  # one count: one cell a size
    quarters = EnvConfig(**{**EnvConfig.default().model_dump(), "agent_ratio": {2: 0.25, 3: 0.25, 4: 0.25, 5: 0.25}})
    cells = cell_counts(quarters, 100)  # 12.5 boards a size: per-size rounding alone would favour 2 and 3 agents
    assert {k: sum(c[k] for c in cells.values()) for k in (2, 3, 4, 5)} == {2: 25, 3: 25, 4: 25, 5: 25}
    assert {s: sum(c.values()) for s, c in cells.items()} == size_counts(quarters, 100)
    assert cell_counts(EnvConfig(**{**SMALL.model_dump(), "agent_ratio": {2: 1.0, 4: 0.0}}), 20) == \
        cell_counts(SMALL, 20)  # a count with no share has no cell


def test_a_mix_of_agent_counts_draws_each_cell_exactly_and_reproducibly():
    boards = generate(MIX, seed=4)
    assert [(b.size, b.num_agents) for b in boards] == [(3, 2)] * 6 + [(3, 3)] * 5 + [(4, 2)] * 5 + [(4, 3)] * 6
    for (size, k), wait_count in {(3, 2): 3, (3, 3): 3, (4, 2): 1, (4, 3): 2}.items():  # round_half_up(w * cell)
        cell = [b for b in boards if (b.size, b.num_agents) == (size, k)]
        assert sum(b.needs_wait for b in cell) == wait_count
        assert all(len(b.holes) == round_half_up(MIX.hole_ratio[size] * size * size) for b in cell)
    assert _digest(boards) == _digest(generate(MIX, seed=4)) != _digest(generate(MIX, seed=5))


def test_a_config_of_one_count_draws_the_boards_it_drew_before_the_mix_existed():
    three = EnvConfig(**{**EnvConfig.default().model_dump(), "agent_ratio": {3: 1.0, 5: 0.0}})
    assert _digest(generate(three, 40, seed=11)) == BEFORE["three-agents-40-11"]
    old = {**SMALL.model_dump(mode="json"), "num_agents": 2}
    del old["agent_ratio"]
    assert _digest(generate(EnvConfig.model_validate(old), seed=7)) == BEFORE["small-7"]


def test_a_mix_fails_naming_the_size_and_the_count_it_cannot_fill():
    crowded = EnvConfig(data_ratio={3: 1.0}, hole_ratio={3: 0.5}, wait_ratio={3: 0.0}, agent_ratio={2: 0.5, 3: 0.5})
    with pytest.raises(GenerationError, match="size 3: hole_ratio 0.5 leaves 4 ice cells, too few for 3 agents"):
        generate(crowded, 4)


# ---------------------------------------------------------------- each agent count only on the sizes that hold it

QUARTERS = EnvConfig(**{**EnvConfig.default().model_dump(), "agent_ratio": {2: 0.25, 3: 0.25, 4: 0.25, 5: 0.25}})


def test_a_count_goes_only_to_the_sizes_that_hold_its_starts_and_goals():
    # a 3x3 board with hole_ratio 0.2 has 2 holes: 7 ice cells hold 3 agents' starts and goals, not 4 (8 cells)
    assert (ice_cells(QUARTERS, 3), room(QUARTERS, 3), room(QUARTERS, 4)) == (7, 3, 6)
    placed = placement(QUARTERS, 512)
    assert placed.cells[3] == {2: 32, 3: 32, 4: 0, 5: 0}  # was 16 of each count: 4 and 5 agents cannot be drawn
    assert {k: sum(c[k] for c in placed.cells.values()) for k in (2, 3, 4, 5)} == {2: 128, 3: 128, 4: 128, 5: 128}
    assert {s: sum(c.values()) for s, c in placed.cells.items()} == size_counts(QUARTERS, 512)  # no board moved
    assert (placed.moved, placed.narrowed) == ({}, {3: 3})
    assert placed.notes(QUARTERS) == ["size 3: hole_ratio 0.2 leaves 7 ice cells, room for 3 agents' starts and "
                                      "goals: its boards have 2 or 3 agents; the boards of more agents go to the "
                                      "sizes that hold them"]
    boards = generate(QUARTERS, 64, seed=3)
    assert sorted({(b.size, b.num_agents) for b in boards if b.size == 3}) == [(3, 2), (3, 3)]
    assert [b.num_agents for b in boards].count(5) == 16


def test_boards_move_to_the_sizes_that_hold_their_agents_where_too_few_do():
    big = EnvConfig(**{**QUARTERS.model_dump(), "agent_ratio": {4: 0.5, 5: 0.5}})
    placed = placement(big, 512)
    assert placed.cells[3] == {4: 0, 5: 0}
    # size 3's 64 boards go to sizes 4..10 by their data_ratio (equal: 9 each, the one left to the smallest size)
    assert placed.moved == {3: -64, 4: 10, 5: 9, 6: 9, 7: 9, 8: 9, 9: 9, 10: 9}
    assert {k: sum(c[k] for c in placed.cells.values()) for k in (4, 5)} == {4: 256, 5: 256}
    assert placed.notes(big) == [
        "size 3: 64 boards fewer than its data_ratio gives, moved to sizes that hold their agents",
        "size 4: 10 boards more than its data_ratio gives, moved from sizes too small for their agents",
        *(f"size {s}: 9 boards more than its data_ratio gives, moved from sizes too small for their agents"
          for s in range(5, 11))]


def test_a_count_that_no_size_holds_fails_naming_the_size_with_the_most_room():
    config = EnvConfig(data_ratio={3: 0.5, 4: 0.5}, hole_ratio={3: 0.2, 4: 0.5}, wait_ratio={3: 0.25, 4: 0.25},
                       agent_ratio={2: 0.5, 5: 0.5})
    with pytest.raises(GenerationError, match=r"^size 4: hole_ratio 0.5 leaves 8 ice cells, too few for 5 agents' "
                                              r"starts and goals \(10 cells\), and no other map size of the config "
                                              r"holds them$") as err:
        cell_counts(config, 16)
    assert err.value.size == 4


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(2, 8), st.integers(0, 4), st.integers(0, 10)), min_size=1, max_size=5,
                unique_by=lambda t: t[0]),
       st.dictionaries(st.integers(1, 8), st.integers(1, 4), min_size=1, max_size=4), st.integers(1, 300))
def test_every_board_is_dealt_to_a_size_that_holds_it_and_the_counts_are_exact(sizes, mix, n):
    config = EnvConfig(data_ratio={s: w / sum(t[2] for t in sizes) if sum(t[2] for t in sizes) else 1 / len(sizes)
                                   for s, _, w in sizes},
                       hole_ratio={s: h / 8 for s, h, _ in sizes}, wait_ratio={s: 0.0 for s, _, _ in sizes},
                       agent_ratio={k: w / sum(mix.values()) for k, w in mix.items()})
    try:
        placed = placement(config, n)
    except GenerationError:  # only where no size of the config holds a count that has boards
        assert any(all(room(config, s) < k for s in config.sizes) for k in mix)
        return
    cells = placed.cells
    assert all(room(config, s) >= k for s, c in cells.items() for k, boards in c.items() if boards)
    totals = {k: sum(c[k] for c in cells.values()) for k in mix}
    assert totals == {k: c for k, c in _largest_remainder(config.agent_ratio, n).items()}
    sizes_now = {s: sum(c.values()) for s, c in cells.items()}
    assert {s: sizes_now[s] - b for s, b in size_counts(config, n).items() if sizes_now[s] != b} == placed.moved
    if all(room(config, s) >= max(mix) for s, b in size_counts(config, n).items() if b):
        assert placed.moved == {}  # where every size with boards holds every count, nothing moves
