import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from envsim.config import AGENT_RATIO, GLOBALS, KNOBS, NUM_AGENTS, ConfigError, EnvConfig, mix_text, project, read_mix


def test_default_config():
    c = EnvConfig.default()
    assert c.sizes == (3, 4, 5, 6, 7, 8, 9, 10)
    assert c.data_ratio[3] == 0.125 and c.hole_ratio[10] == 0.2 and c.wait_ratio[5] == 0.25
    assert (c.agent_ratio, c.agent_counts, c.most_agents, c.num_instances) == ({2: 1.0}, (2,), 2, 512)
    assert EnvConfig.model_validate_json(c.model_dump_json()) == c


def test_projection_clamps_renormalises_and_reports_each_change():
    raw = {"data_ratio": {"3": 2, "4": 1}, "hole_ratio": {"3": 0.9, "4": 0.1}, "wait_ratio": {"3": 0, "4": 1},
           "num_agents": 12}
    p = project(raw)
    assert p.config.data_ratio == {3: 0.5, 4: 0.5}
    assert p.config.hole_ratio == {3: 0.5, 4: 0.1}
    assert p.config.agent_ratio == {8: 1.0}
    assert [str(a) for a in p.adjustments] == [
        "data_ratio[3]: 2.0 -> 1.0 (clamped into 0..1)",
        "hole_ratio[3]: 0.9 -> 0.5 (clamped into 0..0.5)",
        "num_agents: 12 -> 8 (clamped into 1..8)",
        "data_ratio[3]: 1.0 -> 0.5 (renormalised (sum was 2))",
        "data_ratio[4]: 1.0 -> 0.5 (renormalised (sum was 2))",
    ]


def test_missing_sizes_keep_the_current_value_in_a_proposal_but_not_in_an_edit():
    base = EnvConfig.default(sizes=(3, 4))
    p = project({"hole_ratio": {"3": 0.3}}, base)
    assert p.config.hole_ratio == {3: 0.3, 4: 0.2}
    assert "hole_ratio[4]: None -> 0.2 (missing: kept the current value)" in [str(a) for a in p.adjustments]
    with pytest.raises(ConfigError, match=r"hole_ratio\[4\] is missing"):
        project({**base.model_dump(), "hole_ratio": {3: 0.3}}, base, strict=True)


@pytest.mark.parametrize(("raw", "message"), [
    ("[1, 2]", "a config must be a JSON object"),
    ({"hole_ratio": {"5": 0.7}}, r"hole_ratio\[5\] = 0.7 is outside 0..0.5"),
    ({"wait_ratio": {"5": float("nan")}}, r"wait_ratio\[5\] must be a finite number, got nan"),
    ({"wait_ratio": {"5": "high"}}, r"wait_ratio\[5\] must be a number, got 'high'"),
    ({"data_ratio": {"11": 0.1}}, r"data_ratio: size 11 is not one of the run's sizes \[3, 4, 5, 6, 7, 8, 9, 10\]"),
    ({"temperature": 1.0}, "unknown keys 'temperature'; allowed: data_ratio, hole_ratio, wait_ratio, agent_ratio, "
                           r"num_instances, random_share \(or num_agents: one agent count for every board\)"),
    ({"num_instances": 10**400}, "num_instances must be a finite number, got 1000000000"),
    ({"num_agents": 2.5}, "num_agents must be a whole number, got 2.5"),
    ({"num_instances": 0}, "num_instances = 0 is outside 1..100000"),
])
def test_a_strict_edit_is_refused_naming_field_and_range(raw, message):
    base = EnvConfig.default()
    edit = raw if isinstance(raw, str) else {**base.model_dump(), **{
        k: ({**base.model_dump()[k], **v} if isinstance(v, dict) else v) for k, v in raw.items()}}
    with pytest.raises(ConfigError, match=message):
        project(edit, base, strict=True)


def test_the_model_itself_refuses_illegal_values():
    with pytest.raises(ValueError, match="data_ratio sums to 0.5; it must sum to 1"):
        EnvConfig(data_ratio={3: 0.5}, hole_ratio={3: 0.1}, wait_ratio={3: 0.1})
    with pytest.raises(ValueError, match=r"hole_ratio\[3\] = 0.6 is outside 0..0.5"):
        EnvConfig(data_ratio={3: 1}, hole_ratio={3: 0.6}, wait_ratio={3: 0.1})



def test_the_json_schema_states_each_knobs_range_and_validation_keeps_its_own_message():
    properties = EnvConfig.model_json_schema()["properties"]
    assert {k: properties[k]["additionalProperties"] for k in KNOBS} == {
        "data_ratio": {"type": "number", "minimum": 0.0, "maximum": 1.0},
        "hole_ratio": {"type": "number", "minimum": 0.0, "maximum": 0.5},
        "wait_ratio": {"type": "number", "minimum": 0.0, "maximum": 1.0}}
    assert [(properties[k]["minimum"], properties[k]["maximum"]) for k in GLOBALS] == [(1, 100_000)]
    assert properties["agent_ratio"]["additionalProperties"] == {"type": "number", "minimum": 0.0, "maximum": 1.0}
    assert properties["agent_ratio"]["propertyNames"] == {"enum": ["1", "2", "3", "4", "5", "6", "7", "8"]}
    with pytest.raises(ValueError, match=r"hole_ratio\[3\] = 0.6 is outside 0..0.5") as err:
        EnvConfig(data_ratio={3: 1}, hole_ratio={3: 0.6}, wait_ratio={3: 0.1})
    assert "less than or equal" not in str(err.value)


def test_the_sized_schema_names_every_size_and_closes_every_object():
    schema = EnvConfig.sized_schema((3, 5))
    assert schema["required"] == ["data_ratio", "hole_ratio", "wait_ratio", "agent_ratio", "num_instances"]
    assert schema["additionalProperties"] is False
    hole = schema["properties"]["hole_ratio"]
    assert hole["properties"] == {"3": {"type": "number", "minimum": 0.0, "maximum": 0.5},
                                  "5": {"type": "number", "minimum": 0.0, "maximum": 0.5}}
    assert (hole["required"], hole["additionalProperties"]) == (["3", "5"], False)
    agents = schema["properties"]["agent_ratio"]
    assert (agents["required"], agents["additionalProperties"]) == (["1", "2", "3", "4", "5", "6", "7", "8"], False)
    assert agents["properties"]["5"] == {"type": "number", "minimum": 0.0, "maximum": 1.0}
    assert "default" not in agents and "propertyNames" not in agents
    assert "default" not in schema["properties"]["num_instances"]
    assert EnvConfig.model_json_schema()["properties"]["hole_ratio"]["additionalProperties"]  # the original is kept

numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**30, 10**30),
                    st.integers(10**300, 10**400))
junk = st.one_of(numbers, st.text(max_size=5), st.none(), st.booleans(), st.lists(numbers, max_size=2))
size_keys = st.one_of(st.integers(0, 40), st.sampled_from(["3", " 4", "x", "10.5"]))
raw_configs = st.dictionaries(
    st.sampled_from([*KNOBS, AGENT_RATIO, NUM_AGENTS, *GLOBALS, "extra"]),
    st.one_of(st.dictionaries(size_keys, st.one_of(numbers, junk), max_size=10), junk), max_size=6)


@given(raw_configs, st.booleans(), st.booleans())
def test_projection_yields_a_legal_config_or_a_clear_error(raw, strict, with_base):
    base = EnvConfig.default() if with_base else None
    try:
        p = project(raw, base, strict=strict)
    except ConfigError as err:
        assert err.problems and all(isinstance(m, str) and m for m in err.problems)
        return
    c = p.config
    assert abs(sum(c.data_ratio.values()) - 1) <= 1e-6
    for knob, (lo, hi) in KNOBS.items():
        assert set(getattr(c, knob)) == set(c.sizes)
        assert all(lo <= v <= hi and math.isfinite(v) for v in getattr(c, knob).values())
    assert abs(sum(c.agent_ratio.values()) - 1) <= 1e-6 and c.agent_counts
    assert all(1 <= k <= 8 and 0 <= v <= 1 for k, v in c.agent_ratio.items()) and 1 <= c.num_instances <= 100_000


@given(st.dictionaries(st.integers(2, 32), st.floats(0, 1e6), min_size=1, max_size=8))
def test_projection_of_any_nonnegative_shares_sums_to_one(shares):
    raw = {"data_ratio": shares, "hole_ratio": {s: 0.1 for s in shares}, "wait_ratio": {s: 0.5 for s in shares}}
    c = project(raw).config
    assert abs(sum(c.data_ratio.values()) - 1) <= 1e-9


def test_random_share_is_validated_read_from_answers_and_left_out_of_the_json_when_zero():
    base = EnvConfig.default((3, 4))
    broad = EnvConfig(**{**base.model_dump(), "random_share": 0.5})
    assert "random_share" not in base.model_dump() and "random_share" not in base.model_dump_json()
    assert broad.model_dump(mode="json")["random_share"] == 0.5
    assert EnvConfig.model_validate_json(broad.model_dump_json()) == broad
    assert EnvConfig.model_validate(broad.model_dump(mode="json")) == broad
    for bad in (-0.1, 1.5):
        with pytest.raises(ValidationError, match=f"random_share = {bad:g} is outside 0..1"):
            EnvConfig(**{**base.model_dump(), "random_share": bad})
    assert "random_share" not in EnvConfig.model_json_schema()["properties"]  # not shown to the llm engineer
    # an answer may leave it out (the base's stands), give it (clamped into range), or give it wrong (refused)
    assert project({"hole_ratio": {"3": 0.3}}, base=broad).config.random_share == 0.5
    assert project({"hole_ratio": {"3": 0.3}}, base=base).config.random_share == 0.0
    clamped = project({"random_share": 1.5}, base=base)
    assert clamped.config.random_share == 1.0
    assert str(clamped.adjustments[0]) == "random_share: 1.5 -> 1.0 (clamped into 0..1)"
    with pytest.raises(ConfigError, match="random_share = 1.5 is outside 0..1"):
        project({**base.model_dump(), "random_share": 1.5}, strict=True)
    with pytest.raises(ConfigError, match="random_share must be a number"):
        project({"random_share": "half"}, base=base)
    assert project(broad, base=base, strict=True).config == broad


# ---------------------------------------------------------------- agent_ratio: the mix of agent counts

SIZES = {"data_ratio": {3: 1.0}, "hole_ratio": {3: 0.2}, "wait_ratio": {3: 0.25}}


def test_agent_ratio_is_a_mix_of_counts_summing_to_one_within_the_rules_range():
    mix = EnvConfig(**SIZES, agent_ratio={2: 0.25, 3: 0.25, 4: 0.25, 5: 0.25, 7: 0.0})
    assert (mix.agent_counts, mix.most_agents) == ((2, 3, 4, 5), 5)  # a count with no share has no boards
    with pytest.raises(ValidationError, match="agent_ratio sums to 0.75; it must sum to 1"):
        EnvConfig(**SIZES, agent_ratio={2: 0.5, 3: 0.25})
    with pytest.raises(ValidationError, match=r"agent_ratio: agent count 9 is outside 1..8; "
                                              r"agent_ratio\[9\] = 1.5 is outside 0..1; agent_ratio sums to 2"):
        EnvConfig(**SIZES, agent_ratio={2: 0.5, 9: 1.5})
    with pytest.raises(ValidationError, match="agent_ratio sums to 0; it must sum to 1"):
        EnvConfig(**SIZES, agent_ratio={})


def test_an_old_num_agents_config_reads_as_one_count_and_dumps_as_agent_ratio():
    old = {"data_ratio": {"3": 1.0}, "hole_ratio": {"3": 0.2}, "wait_ratio": {"3": 0.25}, "num_agents": 3,
           "num_instances": 64}
    config = EnvConfig.model_validate(old)
    assert config.agent_ratio == {3: 1.0} and config == EnvConfig.default((3,), num_agents=3, num_instances=64)
    dumped = config.model_dump(mode="json")
    assert dumped == {"data_ratio": {"3": 1.0}, "hole_ratio": {"3": 0.2}, "wait_ratio": {"3": 0.25},
                      "agent_ratio": {"3": 1.0}, "num_instances": 64}
    assert EnvConfig.model_validate_json(config.model_dump_json()) == config
    assert EnvConfig.model_validate({**old, "agent_ratio": {"3": 1.0}}) == config  # both given, agreeing
    with pytest.raises(ValidationError, match=r"num_agents = 3 and agent_ratio = \{'2': 0.5, '3': 0.5\} disagree"):
        EnvConfig.model_validate({**old, "agent_ratio": {"2": 0.5, "3": 0.5}})
    assert project(old, strict=True).config == config


def test_the_projection_clamps_and_renormalises_the_mix_and_names_each_count():
    base = EnvConfig.default((3, 4))
    p = project({"agent_ratio": {"2": 3, "3": 1, "4": -1}}, base)
    assert p.config.agent_ratio == {2: 0.5, 3: 0.5, 4: 0.0}
    assert [str(a) for a in p.adjustments if a.field.startswith("agent_ratio")] == [
        "agent_ratio[2]: 3.0 -> 1.0 (clamped into 0..1)",
        "agent_ratio[4]: -1.0 -> 0.0 (clamped into 0..1)",
        "agent_ratio[2]: 1.0 -> 0.5 (renormalised (sum was 2))",
        "agent_ratio[3]: 1.0 -> 0.5 (renormalised (sum was 2))",
    ]
    assert project({"agent_ratio": {"2": 0, "5": 0}}, base).config.agent_ratio == {2: 0.5, 5: 0.5}  # all 0: uniform
    assert project({"hole_ratio": {"3": 0.3}}, EnvConfig(**{**base.model_dump(), "agent_ratio": {3: 1}})) \
        .config.agent_ratio == {3: 1.0}  # left out: the base's mix stands
    assert project({"num_agents": 4}, base).config.agent_ratio == {4: 1.0}


def test_a_strict_edit_of_the_mix_is_refused_naming_the_field_and_count():
    base = EnvConfig.default((3,))
    edit = base.model_dump(mode="json")

    def refused(**change) -> list[tuple]:
        with pytest.raises(ConfigError) as err:
            project({**edit, **change}, base, strict=True)
        return [(r.field, r.count, r.legal, r.message) for r in err.value.records]

    assert refused(agent_ratio={"2": 0.5, "9": 0.5}) == [
        ("agent_ratio", 9, (1, 8), "agent_ratio: agent count 9 is outside 1..8")]
    assert refused(agent_ratio={"2": 1.5}) == [("agent_ratio", 2, (0.0, 1.0), "agent_ratio[2] = 1.5 is outside 0..1")]
    assert refused(agent_ratio={"2": 0, "3": 0}) == [
        ("agent_ratio", None, None, "agent_ratio sums to 0; at least one agent count needs a positive share")]
    assert refused(agent_ratio={"two": 1}) == [
        ("agent_ratio", None, (1, 8), "agent_ratio has key 'two'; keys are agent counts 1..8")]
    assert refused(agent_ratio=[2, 3]) == [
        ("agent_ratio", None, None, "agent_ratio must be an object mapping agent count to a share, got list")]
    assert refused(num_agents=3, agent_ratio={"2": 1}) == [
        ("agent_ratio", None, None, "num_agents = 3 and agent_ratio = {'2': 1} disagree: num_agents k means "
                                    "agent_ratio {k: 1}; give agent_ratio alone")]
    # a strict edit renormalises the mix as it does data_ratio
    assert project({**edit, "agent_ratio": {"2": 0.125, "3": 0.375}}, base, strict=True).config.agent_ratio == {2: 0.25,
                                                                                                        3: 0.75}


def test_a_mix_reads_from_text_and_writes_back_as_the_same_text():
    assert read_mix("2=0.5, 3=0.5") == read_mix("2:0.5,3:0.5") == {"2": 0.5, "3": 0.5}
    assert read_mix(" 3 ") == {"3": 1.0}
    assert mix_text({3: 0.5, 2: 0.5}) == "2=0.5, 3=0.5" and mix_text({2: 1.0}) == "2=1"
    with pytest.raises(ConfigError, match=r"agent_ratio: '3=half' is not count=share \(e.g. 2=0.5, 3=0.5\)"):
        read_mix("2=0.5, 3=half")
    edit = {**EnvConfig.default((3,)).model_dump(), "agent_ratio": read_mix("2=0.125, 4=0.375")}
    config = project(edit, strict=True).config
    assert config.agent_ratio == {2: 0.25, 4: 0.75}


def test_a_runs_agent_counts_narrow_what_a_mix_may_name() -> None:
    base = EnvConfig.default((3, 4))
    with pytest.raises(ConfigError) as err:
        project({"agent_ratio": {"2": 0.5, "5": 0.5}, "num_instances": 64}, base, counts=(2, 3, 4))
    (problem,) = err.value.records
    assert (problem.field, problem.count) == ("agent_ratio", 5)
    assert problem.message == "agent_ratio: agent count 5 is not one of the run's agent counts [2, 3, 4]"
    with pytest.raises(ConfigError, match=r"agent count 6 is not one of the run's agent counts \[2, 3\]"):
        project({"num_agents": 6}, base, counts=(2, 3))
    assert project({"agent_ratio": {"3": 1}}, base, counts=(2, 3)).config.agent_ratio == {3: 1.0}
    assert project({"agent_ratio": {"5": 1}}, base).config.agent_ratio == {5: 1.0}  # no counts: the rules' range
    agents = EnvConfig.sized_schema((3,), (2, 4))["properties"]["agent_ratio"]
    assert (list(agents["properties"]), agents["required"]) == (["2", "4"], ["2", "4"])
