"""EnvConfig: the environment configuration an engineer proposes, and its projection onto the legal space.

`EnvConfig` is the one definition: the database stores its JSON, the web page builds its form from
`KNOBS`, the engineer's prompt shows its JSON schema. Every untrusted config (an LLM's answer, a
person's edit, a file) goes through `project`, which names the field and the legal range of every
problem it finds.

The stage's agent counts are a mixture, `agent_ratio` (shares per agent count, as `data_ratio` is per map size).
A config written before it existed names one count, `num_agents: k`: it reads as `agent_ratio {k: 1}`, and every
config dumps as `agent_ratio` (storage/migrations/versions/0012_agent_ratio.py rewrote the stored ones).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
    model_validator,
)

from envsim.rules import MAX_AGENTS, MAX_SIZE, MIN_AGENTS, MIN_SIZE

# Per-size knobs and their legal ranges.
KNOBS: dict[str, tuple[float, float]] = {
    "data_ratio": (0.0, 1.0),
    "hole_ratio": (0.0, 0.5),
    "wait_ratio": (0.0, 1.0),
}
# The share of the stage's boards at each agent count (keys: agent counts MIN_AGENTS..MAX_AGENTS), and its range.
AGENT_RATIO = "agent_ratio"
AGENT_RATIO_RANGE: tuple[float, float] = (0.0, 1.0)
AGENT_COUNTS: tuple[int, int] = (MIN_AGENTS, MAX_AGENTS)
DEFAULT_AGENTS = 2
# The one agent count of a config written before `agent_ratio` (`num_agents: k` means `{k: 1}`): read, never dumped.
NUM_AGENTS = "num_agents"
# Global knobs and their legal ranges.
GLOBALS: dict[str, tuple[int, int]] = {
    "num_instances": (1, 100_000),
}
# The share of each size's boards drawn broadly at random (`envsim.generator.boards`), and its legal range.
RANDOM_SHARE = "random_share"
RANDOM_SHARE_RANGE: tuple[float, float] = (0.0, 1.0)
KNOB_HELP: dict[str, str] = {
    "data_ratio": "share of the stage's training instances drawn at this map size (the shares sum to 1)",
    "hole_ratio": "share of the board's cells that are holes",
    "wait_ratio": "share of this size's instances whose optimal plans need a WAIT",
    AGENT_RATIO: "share of the stage's training instances with this many agents (the keys are agent counts; the "
                 "shares sum to 1)",
    "num_instances": "training instances in the stage",
    RANDOM_SHARE: "share of each size's boards whose hole and wait ratios are drawn uniformly over their ranges, "
                  "board by board, instead of the size's own",
}
DEFAULT_SIZES = tuple(range(3, 11))
SUM_TOLERANCE = 1e-6

Finite = Annotated[float, Field(allow_inf_nan=False)]


@dataclass(frozen=True)
class ConfigProblem:
    """One thing wrong with a config, as data for whoever shows it (the page marks the cell it names).

    `field`: the knob or global it is about, "size" when a map size itself is wrong (then `knob` is the knob
    whose key it was), "" for the config as a whole; `size`: the map size, where one is named; `legal`: the
    legal range (lo, hi), where there is one; `message`: what a person reads; `count`: the agent count of an
    `agent_ratio` problem, where one is named (`legal` is then the range of the count where the count itself is
    wrong, else of its share)."""

    field: str
    message: str
    size: int | None = None
    legal: tuple[float, float] | None = None
    knob: str | None = None
    count: int | None = None

    def __str__(self) -> str:
        return f"{self.knob}: {self.message}" if self.knob else self.message


class ConfigError(ValueError):
    """An unreadable or illegal config: `records` holds each problem as data (`ConfigProblem`), `problems` the
    same as lines naming the field and its legal range."""

    def __init__(self, problems: list[str | ConfigProblem]):
        self.records = [p if isinstance(p, ConfigProblem) else ConfigProblem("", p) for p in problems]
        self.problems = [str(p) for p in self.records]
        super().__init__("; ".join(self.problems))


def count_keys(counts: tuple[int, ...] | None = None) -> list[str]:
    """The keys `agent_ratio` may have in a schema: a run's agent counts (`RunSettings.agent_counts`), else every
    count the rules allow."""
    return [str(k) for k in (counts or range(AGENT_COUNTS[0], AGENT_COUNTS[1] + 1))]


def narrow_counts(schema: dict[str, Any], counts: tuple[int, ...] | None) -> dict[str, Any]:
    """`schema` (`EnvConfig.model_json_schema()`) with `agent_ratio`'s keys narrowed to `counts` (None: unchanged)."""
    if counts is not None:
        schema["properties"][AGENT_RATIO]["propertyNames"] = {"enum": count_keys(counts)}
    return schema


def _schema_ranges(schema: dict[str, Any]) -> None:
    """Write each knob's legal range into the JSON schema (`minimum`/`maximum`), from `KNOBS` and `GLOBALS`.

    Only the schema says them: validation keeps its own messages (`_range_problems`), and a schema-guided
    generator (a server's structured output, constrained decoding) cannot write a number out of range.
    `agent_ratio`'s keys are named too (`propertyNames`). `random_share` is left out: the `llm` engineer is shown the
    per-size knobs, the agent mix and the instance count."""
    properties = schema["properties"]
    properties.pop(RANDOM_SHARE, None)
    if RANDOM_SHARE in schema.get("required", []):
        schema["required"].remove(RANDOM_SHARE)
    for knob, (lo, hi) in KNOBS.items():
        properties[knob]["additionalProperties"].update(minimum=lo, maximum=hi)
    lo, hi = AGENT_RATIO_RANGE
    properties[AGENT_RATIO]["additionalProperties"].update(minimum=lo, maximum=hi)
    properties[AGENT_RATIO]["propertyNames"] = {"enum": count_keys()}
    for name, (lo, hi) in GLOBALS.items():
        properties[name].update(minimum=lo, maximum=hi)


class EnvConfig(BaseModel):
    """Per map size: data, hole and wait ratios; globally: the mix of agent counts and the instance count."""

    model_config = ConfigDict(frozen=True, extra="forbid", json_schema_extra=_schema_ranges)

    data_ratio: dict[int, Finite]
    hole_ratio: dict[int, Finite]
    wait_ratio: dict[int, Finite]
    agent_ratio: dict[int, Finite] = Field(default_factory=lambda: {DEFAULT_AGENTS: 1.0})
    num_instances: int = 512
    # The share of each size's boards drawn broadly at random (KNOB_HELP). Left out of the config's JSON when 0,
    # so a config stored before it existed reads, dumps and hashes (probe keys) exactly as it did; and out of the
    # JSON schema (the docstring above is its description: the `llm` engineer's prompt is unchanged by it).
    random_share: Finite = 0.0

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        if self.random_share == 0:
            data.pop(RANDOM_SHARE, None)
        return data

    @model_validator(mode="before")
    @classmethod
    def _one_count(cls, data: Any) -> Any:
        """`num_agents: k` (a config written before `agent_ratio`) reads as `agent_ratio {k: 1}`; given beside an
        `agent_ratio`, the two must agree."""
        if not isinstance(data, Mapping) or NUM_AGENTS not in data:
            return data
        data = dict(data)
        count = data.pop(NUM_AGENTS)
        if AGENT_RATIO not in data:
            data[AGENT_RATIO] = {count: 1.0}
        elif not _agrees(count, data[AGENT_RATIO]):
            raise ValueError(_disagreement(count, data[AGENT_RATIO]))
        return data

    @model_validator(mode="after")
    def _legal(self) -> EnvConfig:
        problems = _range_problems(self.model_dump())
        for name, shares in (("data_ratio", self.data_ratio), (AGENT_RATIO, self.agent_ratio)):
            total = sum(shares.values())
            if abs(total - 1.0) > SUM_TOLERANCE:
                problems.append(f"{name} sums to {total:.6g}; it must sum to 1")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(sorted(self.data_ratio))

    @property
    def agent_counts(self) -> tuple[int, ...]:
        """The agent counts the stage's boards have: those with a positive share, fewest first."""
        return tuple(sorted(k for k, share in self.agent_ratio.items() if share > 0))

    def one_size(self, size: int, hole_ratio: float | None = None, wait_ratio: float | None = None) -> EnvConfig:
        """The config's boards of one map size: that size's hole and wait ratios (or those given) and the config's
        agent mix and random share, all of the data."""
        return EnvConfig(data_ratio={size: 1.0},
                         hole_ratio={size: self.hole_ratio[size] if hole_ratio is None else hole_ratio},
                         wait_ratio={size: self.wait_ratio[size] if wait_ratio is None else wait_ratio},
                         agent_ratio=self.agent_ratio, num_instances=self.num_instances,
                         random_share=self.random_share)

    @property
    def most_agents(self) -> int:
        """The most agents on any of the stage's boards: what a board must have room for."""
        return self.agent_counts[-1]

    @classmethod
    def default(cls, sizes: tuple[int, ...] = DEFAULT_SIZES, *, hole_ratio: float = 0.2, wait_ratio: float = 0.25,
                num_agents: int = DEFAULT_AGENTS, num_instances: int = 512) -> EnvConfig:
        """The round-0 config: uniform over sizes, the same hole and wait ratio everywhere, every board with
        `num_agents` agents."""
        return cls(data_ratio={s: 1 / len(sizes) for s in sizes}, hole_ratio={s: hole_ratio for s in sizes},
                   wait_ratio={s: wait_ratio for s in sizes}, agent_ratio={num_agents: 1.0},
                   num_instances=num_instances)

    @classmethod
    def sized_schema(cls, sizes: tuple[int, ...], counts: tuple[int, ...] | None = None) -> dict[str, Any]:
        """The JSON schema of a config for these map sizes: `model_json_schema()` with each per-size knob an
        object whose keys are exactly the sizes, `agent_ratio` one whose keys are exactly `counts` (a run's agent
        counts; None: every legal agent count), every property required and no other allowed (the form a server's
        strict structured output accepts: closed objects, no defaults)."""
        schema = cls.model_json_schema()
        properties = schema["properties"]
        properties[AGENT_RATIO].pop("propertyNames")
        for knob, keys in [*((k, map(str, sizes)) for k in KNOBS), (AGENT_RATIO, count_keys(counts))]:
            keys = list(keys)
            item = properties[knob].pop("additionalProperties")
            properties[knob].update(properties={s: dict(item) for s in keys}, required=keys,
                                    additionalProperties=False)
        for name in GLOBALS:
            properties[name].pop("default", None)
        schema["required"] = list(properties)
        return schema

    def knob_rows(self) -> list[dict[str, float]]:
        """One row per size: `{"size": s, "data_ratio": ..., "hole_ratio": ..., "wait_ratio": ...}`."""
        return [{"size": s, **{k: getattr(self, k)[s] for k in KNOBS}} for s in self.sizes]


def mix_text(agent_ratio: Mapping[int, float]) -> str:
    """An agent mix as a person writes it, e.g. `2=0.5, 3=0.5` (`read_mix` reads it back): the counts with a share,
    each share to 4 significant digits; `2=1`: every board 2 agents."""
    return ", ".join(f"{k}={share:.4g}" for k, share in sorted(agent_ratio.items()) if share > 0)


def read_mix(text: str) -> dict[str, float]:
    """`2=0.5, 3=0.5` (or `2:0.5,3:0.5`, or a lone count `3`: every board 3 agents) as the raw `agent_ratio`
    mapping `project` reads, which checks the counts and shares; ConfigError where the text is not of that form."""
    if text.strip().isdigit():
        return {text.strip(): 1.0}
    mix: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        count, sep, share = item.replace(":", "=").partition("=")
        try:
            mix[count.strip()] = float(share)
        except ValueError:
            sep = ""
        if not sep or not count.strip():
            raise ConfigError([ConfigProblem(AGENT_RATIO, f"{AGENT_RATIO}: {item!r:.40} is not count=share "
                                                          f"(e.g. 2=0.5, 3=0.5)")])
    return mix


def _agrees(count: Any, agent_ratio: Any) -> bool:
    """Whether `num_agents: count` says what `agent_ratio` says: every board at that count."""
    try:
        return {int(k) for k, share in agent_ratio.items() if share > 0} == {int(count)}
    except (AttributeError, TypeError, ValueError):
        return False


def _disagreement(count: Any, agent_ratio: Any) -> str:
    return (f"{NUM_AGENTS} = {count!r:.20} and {AGENT_RATIO} = {agent_ratio!r:.80} disagree: {NUM_AGENTS} k means "
            f"{AGENT_RATIO} {{k: 1}}; give {AGENT_RATIO} alone")


def _range_problems(d: Mapping[str, Any]) -> list[str]:
    problems = []
    sizes = set(d["data_ratio"])
    for knob, (lo, hi) in KNOBS.items():
        if set(d[knob]) != sizes:
            problems.append(f"{knob} covers sizes {sorted(d[knob])} but data_ratio covers {sorted(sizes)}")
        for s, v in d[knob].items():
            if not MIN_SIZE <= s <= MAX_SIZE:
                problems.append(f"{knob}: size {s} is outside {MIN_SIZE}..{MAX_SIZE}")
            if not lo <= v <= hi:
                problems.append(f"{knob}[{s}] = {v:g} is outside {lo:g}..{hi:g}")
    (least, most), (lo, hi) = AGENT_COUNTS, AGENT_RATIO_RANGE
    for k, v in d[AGENT_RATIO].items():
        if not least <= k <= most:
            problems.append(f"{AGENT_RATIO}: agent count {k} is outside {least}..{most}")
        if not lo <= v <= hi:
            problems.append(f"{AGENT_RATIO}[{k}] = {v:g} is outside {lo:g}..{hi:g}")
    for name, (lo, hi) in GLOBALS.items():
        if not lo <= d[name] <= hi:
            problems.append(f"{name} = {d[name]} is outside {lo}..{hi}")
    lo, hi = RANDOM_SHARE_RANGE
    if not lo <= d.get(RANDOM_SHARE, 0.0) <= hi:
        problems.append(f"{RANDOM_SHARE} = {d[RANDOM_SHARE]:g} is outside {lo:g}..{hi:g}")
    if not sizes:
        problems.append("no map sizes: data_ratio is empty")
    return problems


@dataclass(frozen=True)
class Adjustment:
    """One change the projection made: `field` is e.g. `hole_ratio[5]` or `num_agents`."""

    field: str
    old: Any
    new: Any
    reason: str

    def __str__(self) -> str:
        return f"{self.field}: {self.old!r} -> {self.new!r} ({self.reason})"


@dataclass(frozen=True)
class Projection:
    config: EnvConfig
    adjustments: tuple[Adjustment, ...]


def _number(value: Any, field: str, problems: list[ConfigProblem], size: int | None = None,
            count: int | None = None) -> float | None:
    """`value` as a finite number, else a problem naming it (`size`: the map size of a per-size knob; `count`: the
    agent count of an `agent_ratio` share) and None."""
    key = size if size is not None else count
    name = field if key is None else f"{field}[{key}]"
    if isinstance(value, bool) or not isinstance(value, int | float):
        problems.append(ConfigProblem(field, f"{name} must be a number, got {value!r:.40}", size, count=count))
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer too large for a float
        number = math.inf
    if not math.isfinite(number):
        problems.append(ConfigProblem(field, f"{name} must be a finite number, got {str(value)[:40]}", size,
                                      count=count))
        return None
    return number


def _count_key(key: Any, problems: list[ConfigProblem]) -> int | None:
    """An `agent_ratio` key as an agent count within the rules' range (a problem naming it, and None, else)."""
    least, most = AGENT_COUNTS
    try:
        count = int(str(key).strip())
    except ValueError:
        problems.append(ConfigProblem(AGENT_RATIO, f"{AGENT_RATIO} has key {key!r:.40}; keys are agent counts "
                                                   f"{least}..{most}", legal=AGENT_COUNTS))
        return None
    if not least <= count <= most:
        problems.append(ConfigProblem(AGENT_RATIO, f"{AGENT_RATIO}: agent count {count} is outside {least}..{most}",
                                      legal=AGENT_COUNTS, count=count))
        return None
    return count


def _size_key(key: Any, knob: str, problems: list[ConfigProblem]) -> int | None:
    try:
        size = int(str(key).strip())
    except ValueError:
        problems.append(ConfigProblem("size", f"{knob} has key {key!r:.40}; keys are map sizes {MIN_SIZE}..{MAX_SIZE}",
                                      legal=(MIN_SIZE, MAX_SIZE)))
        return None
    if not MIN_SIZE <= size <= MAX_SIZE:
        problems.append(ConfigProblem("size", f"size {size} is outside {MIN_SIZE}..{MAX_SIZE}", size,
                                      (MIN_SIZE, MAX_SIZE), knob))
        return None
    return size


def _clamp_or_refuse(name: str, value: float, lo: float, hi: float, strict: bool, problems: list[ConfigProblem],
                     adjustments: list[Adjustment], size: int | None = None, whole: bool = False,
                     count: int | None = None) -> float | None:
    """A value outside lo..hi: refused (strict: a person's edit; a problem, and None) or clamped into it (an
    engineer's proposal: an `Adjustment`). `size`: the map size of a per-size knob; `count`: the agent count of
    an `agent_ratio` share; `whole`: a count."""
    if lo <= value <= hi:
        return value
    key = size if size is not None else count
    field = name if key is None else f"{name}[{key}]"
    shown = (lambda v: f"{int(v)}" if abs(v) < 1e18 else f"{v:g}") if whole else (lambda v: f"{v:g}")
    if strict:
        problems.append(ConfigProblem(name, f"{field} = {shown(value)} is outside {shown(lo)}..{shown(hi)}", size,
                                      (lo, hi), count=count))
        return None
    clamped = min(max(value, lo), hi)
    said = int(value) if whole and abs(value) < 1e18 else value
    adjustments.append(Adjustment(field, said, int(clamped) if whole else clamped,
                                  f"clamped into {shown(lo)}..{shown(hi)}"))
    return clamped


def project(raw: Any, base: EnvConfig | None = None, *, strict: bool = False,
            counts: tuple[int, ...] | None = None) -> Projection:
    """Read an untrusted config into a legal `EnvConfig`, reporting each adjustment.

    Non-strict (an engineer's proposal): out-of-range values are clamped, sizes the answer left out
    keep `base`'s value, and `data_ratio` and `agent_ratio` are renormalised; each change is an `Adjustment`.
    Strict (a person's edit): an out-of-range or missing value is refused; only the renormalisation
    of `data_ratio` and `agent_ratio` is applied. Structural problems (not a mapping, unknown keys, non-numbers,
    NaN, sizes outside the run's set, agent counts outside the rules' range, a `num_agents` that disagrees with
    the `agent_ratio` beside it) raise `ConfigError` in both modes. An `agent_ratio` given is the whole mix (a
    count it leaves out has no boards); left out, the base's mix stands (a lone `num_agents: k` is `{k: 1}`).
    `counts` (a run's `agent_counts`, which an engineer's proposal must keep to): an agent count given outside
    them is refused too, the problem naming the count and the run's counts.
    """
    if isinstance(raw, BaseModel):
        raw = raw.model_dump()
    if not isinstance(raw, Mapping):
        raise ConfigError([f"a config must be a JSON object with keys {list(KNOBS) + [AGENT_RATIO, *GLOBALS]}, "
                           f"got {type(raw).__name__}"])
    problems: list[ConfigProblem] = []
    adjustments: list[Adjustment] = []
    unknown = [k for k in raw if k not in KNOBS and k not in GLOBALS and k not in (AGENT_RATIO, NUM_AGENTS,
                                                                                   RANDOM_SHARE)]
    if unknown:
        named = ", ".join(repr(str(k)[:30]) for k in unknown[:5]) + (", ..." if len(unknown) > 5 else "")
        allowed = ", ".join([*KNOBS, AGENT_RATIO, *GLOBALS, RANDOM_SHARE])
        problems.append(ConfigProblem("", f"unknown keys {named}; allowed: {allowed} (or {NUM_AGENTS}: one agent "
                                          f"count for every board)"))
    read = _Reading(base, strict, problems, adjustments, counts)
    values: dict[str, Any] = {knob: per_size for knob in KNOBS
                              if (per_size := read.per_size(knob, raw.get(knob))) is not None}
    if (mix := read.mix(raw.get(AGENT_RATIO), raw.get(NUM_AGENTS))) is not None:
        values[AGENT_RATIO] = mix
    for name in GLOBALS:
        if (v := read.whole(name, raw.get(name))) is not None:
            values[name] = v
    if (v := read.share(raw.get(RANDOM_SHARE))) is not None:
        values[RANDOM_SHARE] = v
    if problems:
        raise ConfigError(problems)

    sizes = list(base.sizes) if base is not None else sorted(set().union(*(values[k] for k in KNOBS)))
    if not sizes:
        raise ConfigError(["no map sizes given: data_ratio, hole_ratio and wait_ratio map sizes to numbers"])
    for knob in KNOBS:
        read.fill_missing(knob, values[knob], sizes)
    if problems:
        raise ConfigError(problems)
    values["data_ratio"] = {s: values["data_ratio"][s] for s in sizes}
    read.renormalise("data_ratio", values["data_ratio"], "size")
    read.renormalise(AGENT_RATIO, values[AGENT_RATIO], "agent count")
    ordered = {k: {s: values[k][s] for s in sizes} for k in KNOBS}
    try:
        config = EnvConfig(**ordered, agent_ratio=values[AGENT_RATIO], num_instances=values["num_instances"],
                           random_share=values[RANDOM_SHARE])
    except ValidationError as err:  # unreachable if the checks above are complete; kept as a clear message
        raise ConfigError([f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors()]) from err
    return Projection(config, tuple(adjustments))


@dataclass
class _Reading:
    """One reading of an untrusted config by `project`: each knob read against `base` in `strict` mode or not,
    into the problems (refused) and adjustments (made) it collects."""

    base: EnvConfig | None
    strict: bool
    problems: list[ConfigProblem]
    adjustments: list[Adjustment]
    counts: tuple[int, ...] | None = None  # the agent counts a mix may name (None: any the rules allow)

    def clamp(self, name: str, v: float, lo: float, hi: float, size: int | None = None,
              whole: bool = False, count: int | None = None) -> float | None:
        return _clamp_or_refuse(name, v, lo, hi, self.strict, self.problems, self.adjustments, size, whole=whole,
                                count=count)

    def per_size(self, knob: str, given: Any) -> dict[int, float] | None:
        """A per-size knob: {size: value} of the sizes given (None when it is not a mapping)."""
        lo, hi = KNOBS[knob]
        given = {} if given is None else given
        if not isinstance(given, Mapping):
            self.problems.append(ConfigProblem(knob, f"{knob} must be an object mapping map size to a number, got "
                                                     f"{type(given).__name__}"))
            return None
        per_size: dict[int, float] = {}
        for key, value in given.items():
            size = _size_key(key, knob, self.problems)
            v = _number(value, knob, self.problems, size) if size is not None else \
                _number(value, f"{knob}[{key}]", self.problems)
            if size is None or v is None:
                continue
            if self.base is not None and size not in self.base.data_ratio:
                self.problems.append(ConfigProblem("size", f"size {size} is not one of the run's sizes "
                                                           f"{list(self.base.sizes)}", size, knob=knob))
                continue
            v = self.clamp(knob, v, lo, hi, size)
            if v is not None:
                per_size[size] = v
        return per_size

    def mix(self, given: Any, one_count: Any) -> dict[int, float] | None:
        """`agent_ratio`: {agent count: share} as given (a mapping, or a person's text `2=0.5, 3=0.5`: `read_mix`;
        None when it is neither), else `num_agents: k` as `{k: 1}`, else the base's mix (else every board at
        `DEFAULT_AGENTS`). Given both, they must agree."""
        count = None if one_count is None else self.allowed(self.whole(NUM_AGENTS, one_count, AGENT_COUNTS))
        if isinstance(given, str):
            try:
                given = read_mix(given)
            except ConfigError as err:
                self.problems.extend(err.records)
                return None
        if given is None:
            if one_count is not None:
                return None if count is None else {count: 1.0}
            return dict(self.base.agent_ratio) if self.base is not None else {DEFAULT_AGENTS: 1.0}
        if not isinstance(given, Mapping):
            self.problems.append(ConfigProblem(AGENT_RATIO, f"{AGENT_RATIO} must be an object mapping agent count to "
                                                            f"a share, got {type(given).__name__}"))
            return None
        mix: dict[int, float] = {}
        for key, value in given.items():
            k = self.allowed(_count_key(key, self.problems))
            v = _number(value, AGENT_RATIO, self.problems, count=k)
            if k is not None and v is not None and (v := self.clamp(AGENT_RATIO, v, *AGENT_RATIO_RANGE,
                                                                    count=k)) is not None:
                mix[k] = v
        if one_count is not None and count is not None and not _agrees(count, mix):
            self.problems.append(ConfigProblem(AGENT_RATIO, _disagreement(one_count, dict(given))))
        return dict(sorted(mix.items()))

    def allowed(self, count: int | None) -> int | None:
        """An agent count the mix may name: one of `counts` where they are given (a problem naming it and them, and
        None, else)."""
        if count is None or self.counts is None or count in self.counts:
            return count
        self.problems.append(ConfigProblem(AGENT_RATIO, f"{AGENT_RATIO}: agent count {count} is not one of the run's "
                                                        f"agent counts {list(self.counts)}", count=count))
        return None

    def whole(self, name: str, given: Any, legal: tuple[int, int] | None = None) -> int | None:
        """A global whole number (num_instances; `num_agents`, read into `agent_ratio`, with its `legal` range);
        left out: the base's, else the default."""
        lo, hi = GLOBALS[name] if legal is None else legal
        if given is None:
            return getattr(self.base, name) if self.base is not None else EnvConfig.model_fields[name].default
        v = _number(given, name, self.problems)
        if v is None:
            return None
        if v != int(v):
            self.problems.append(ConfigProblem(name, f"{name} must be a whole number, got {given!r}", legal=(lo, hi)))
            return None
        v = self.clamp(name, v, lo, hi, whole=True)
        return None if v is None else int(v)

    def share(self, given: Any) -> float | None:
        """`random_share`; an answer may leave it out: the base's share stands."""
        if given is None:
            return self.base.random_share if self.base is not None else 0.0
        v = _number(given, RANDOM_SHARE, self.problems)
        return None if v is None else self.clamp(RANDOM_SHARE, v, *RANDOM_SHARE_RANGE)

    def fill_missing(self, knob: str, per_size: dict[int, float], sizes: list[int]) -> None:
        """A size the config left out: refused (strict, or no base), else the base's value kept."""
        for s in sizes:
            if s in per_size:
                continue
            if self.strict or self.base is None:
                self.problems.append(ConfigProblem(knob, f"{knob}[{s}] is missing", s, KNOBS[knob]))
            else:
                per_size[s] = getattr(self.base, knob)[s]
                self.adjustments.append(Adjustment(f"{knob}[{s}]", None, per_size[s],
                                                   "missing: kept the current value"))

    def renormalise(self, name: str, shares: dict[int, float], key: str) -> None:
        """Shares (`data_ratio` over sizes, `agent_ratio` over agent counts: `key` names which) made to sum to 1
        (all zero: refused when strict or when there are no keys, else uniform)."""
        total = sum(shares.values())
        if total <= 0:
            if self.strict or not shares:
                raise ConfigError([ConfigProblem(name, f"{name} sums to 0; at least one {key} needs a positive "
                                                       f"share")])
            for k in shares:
                self.adjustments.append(Adjustment(f"{name}[{k}]", shares[k], 1 / len(shares),
                                                   "all shares were 0: uniform"))
                shares[k] = 1 / len(shares)
        elif abs(total - 1.0) > 1e-12:
            for k in shares:
                new = shares[k] / total
                if abs(new - shares[k]) > 1e-12:
                    self.adjustments.append(Adjustment(f"{name}[{k}]", shares[k], new,
                                                       f"renormalised (sum was {total:.6g})"))
                shares[k] = new
