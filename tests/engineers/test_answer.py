"""What the engineers share: sizes put back where the next stage's generator cannot fill a config, read from the
generator's failure as data (its size), never from its message."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from envsim.config import EnvConfig
from envsim.generator import GenerationError, Unfillable, cannot_fill, generate
from lab.engineers.answer import revert_unfillable, with_changes
from tests.engineers.scripts import CONFIG

MOVED = CONFIG.model_copy(update={"hole_ratio": {3: 0.3, 4: 0.1, 5: 0.4}, "wait_ratio": {3: 0.5, 4: 0.25, 5: 0.75}})


def test_the_generator_names_the_size_it_cannot_fill_as_data() -> None:
    # No size holds 5 agents' starts and goals (a size that did would take every board: the generator deals a count
    # only to the sizes that hold it); the size named is the one with the most ice cells.
    crowded = EnvConfig(data_ratio={3: 0.5, 4: 0.5}, hole_ratio={3: 0.5, 4: 0.5}, wait_ratio={3: 0.0, 4: 0.0},
                        num_agents=5)
    with pytest.raises(GenerationError) as err:
        generate(crowded, 4)
    assert err.value.size == 4
    why = cannot_fill(crowded, n=4)
    assert why == Unfillable(4, "size 4: hole_ratio 0.5 leaves 8 ice cells, too few for 5 agents' starts and goals "
                                "(10 cells), and no other map size of the config holds them")
    assert str(why) == why.message
    never_waits = EnvConfig(data_ratio={2: 1.0}, hole_ratio={2: 0.0}, wait_ratio={2: 1.0})
    assert cannot_fill(never_waits, n=3).size == 2  # a stratum that runs dry names its size too
    assert cannot_fill(CONFIG, n=6) is None


def test_the_named_size_goes_back_first_then_the_last_changed_until_the_config_fills() -> None:
    asked = []

    def check(config: EnvConfig) -> Unfillable | None:
        asked.append((config.wait_ratio[3], config.wait_ratio[5]))
        if config.wait_ratio[3] == 0.5:
            return Unfillable(3, "size 3: short of waits")
        if config.wait_ratio[5] == 0.75:
            return Unfillable(None, "no size named")
        return None

    config, lines = revert_unfillable(MOVED, CONFIG, check)
    assert asked == [(0.5, 0.75), (0.25, 0.75), (0.25, 0.25)]
    assert (config.hole_ratio, config.wait_ratio) == ({3: 0.2, 4: 0.1, 5: 0.2}, {3: 0.25, 4: 0.25, 5: 0.25})
    assert config.data_ratio == MOVED.data_ratio
    assert lines == ["size 3: back to hole 0.2, wait 0.25: the generator could not fill the config (size 3: short "
                     "of waits)",
                     "size 5: back to hole 0.2, wait 0.25: the generator could not fill the config (no size named)"]


def test_a_size_named_that_did_not_change_puts_back_the_last_changed_and_it_stops_when_none_is_left() -> None:
    three_and_five = MOVED.model_copy(update={"hole_ratio": {**MOVED.hole_ratio, 4: 0.2}})
    config, lines = revert_unfillable(three_and_five, CONFIG, lambda _c: Unfillable(4, "size 4: never"))
    assert config.hole_ratio == CONFIG.hole_ratio and config.wait_ratio == CONFIG.wait_ratio
    assert [line.split(":")[0] for line in lines] == ["size 5", "size 3"]
    assert revert_unfillable(MOVED, CONFIG, None) == (MOVED, [])
    assert revert_unfillable(CONFIG, CONFIG, lambda _c: Unfillable(3, "x")) == (CONFIG, [])


def test_a_config_an_engineer_builds_from_the_current_one_is_checked_as_a_new_one() -> None:
    assert with_changes(CONFIG, random_share=0.5) == CONFIG.model_copy(update={"random_share": 0.5})
    with pytest.raises(ValidationError, match=r"hole_ratio\[3\] = 0.9 is outside 0..0.5"):
        with_changes(CONFIG, hole_ratio={3: 0.9, 4: 0.2, 5: 0.2})
    with pytest.raises(ValidationError, match="data_ratio sums to 1.5; it must sum to 1"):
        with_changes(CONFIG, data_ratio={3: 0.5, 4: 0.5, 5: 0.5})
