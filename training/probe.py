"""The probe: how much GRPO signal a config's boards carry for a checkpoint, size by size, measured by sampling.

GRPO learns only from a group whose answers disagree: a board the policy always solves, or never solves, gives
every answer the same advantage, zero. So a config is judged before it trains by drawing `boards` boards per map
size from it (seeded), answering each `answers` times exactly as a stage samples (the stage's temperature and
answer budget, `training.stage.sampling_temperature`, `training.evaluate.answer_budget`), scoring every answer,
and keeping per size: p, the valid share; the optimal share; the learnability, the mean over boards of
p_b(1 - p_b) with p_b a board's valid share over its answers (the variance of its group's valid reward); and the
shares of boards with no valid answer and with every answer valid, and each board's count of valid answers
(`board_valid`, in the order the boards are drawn: `probe_boards` draws them again, the same ones, from the config
and the result's `seed`). Weighted by the config's data ratios, the share of boards that carry signal says how much
of a stage's data can move the policy.

A probe is a pure function of (config, policy, seed, boards, answers, temperature) and of how the policy answers
(the run's `thinking` and `completion_length`, `Policy.configured`): the same arguments give the same numbers.
`measure` keeps each in the `probes` table under a key of those arguments (the checkpoint by the name a stage row
gives it), so asking twice costs nothing. A size's numbers depend only on that size's knobs (hole and wait ratio,
the mix of agent counts), so a size whose knobs equal one measured already, in any stored config on the same
checkpoint, seed, probe size and answering settings, is reused rather than sampled again. Torch loads only when
a probe samples, so the lab reads stored probes (and their defaults) without it.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import select

from envsim.config import EnvConfig
from envsim.generator import generate
from envsim.instance import Instance
from envsim.parser import parse
from envsim.scoring import score
from storage.db import session
from storage.models import Job, Probe, Run
from storage.payloads import ProbePayload
from storage.settings import GrpoOverrides, RunSettings
from training.progress import Cancelled, Progress

if TYPE_CHECKING:  # torch loads only where a probe samples: the lab reads probes without it
    from training.policy import Policy

PROBE_BOARDS = 8  # per map size (benchmarks/bench_probe.py: the 8 sizes in about 9 s on one CPU thread)
PROBE_ANSWERS = 8  # per board: a GRPO group of the tiny policy's default size
MOSTLY = 0.5  # a size is too hard (too easy) when more than this share of its boards has no (only) valid answers


class Band(StrEnum):
    """Where a size stands for GRPO: most boards all wrong, most all right, or enough that disagree."""

    TOO_HARD = "too hard"
    LEARNABLE = "learnable"
    TOO_EASY = "too easy"


@dataclass(frozen=True)
class SizeProbe:
    """One map size of a probe: `boards` boards answered `answers` times each."""

    size: int
    boards: int
    answers: int
    valid: int  # valid answers, over boards * answers
    optimal: int
    learnability: float  # mean over boards of p_b (1 - p_b)
    none_valid: float  # share of boards with no valid answer
    all_valid: float  # share of boards whose every answer is valid
    # each board's valid answers, in drawing order (`probe_boards`); empty in a probe stored before they were kept
    board_valid: tuple[int, ...] = ()

    @property
    def p(self) -> float:
        return self.valid / (self.boards * self.answers)

    @property
    def optimal_rate(self) -> float:
        return self.optimal / (self.boards * self.answers)

    @property
    def signal(self) -> float:
        """The share of boards whose answers disagree: the ones that give GRPO an advantage."""
        return 1 - self.none_valid - self.all_valid

    @property
    def band(self) -> Band:
        if self.none_valid > MOSTLY:
            return Band.TOO_HARD
        if self.all_valid > MOSTLY:
            return Band.TOO_EASY
        return Band.LEARNABLE

    @classmethod
    def of(cls, size: int, valid: Sequence[Sequence[bool]], optimal: Sequence[Sequence[bool]]) -> SizeProbe:
        """From each board's answers scored valid / optimal (one list per board, `answers` long)."""
        shares = [sum(group) / len(group) for group in valid]
        return cls(size=size, boards=len(valid), answers=len(valid[0]), valid=sum(map(sum, valid)),
                   optimal=sum(map(sum, optimal)), learnability=sum(p * (1 - p) for p in shares) / len(shares),
                   none_valid=sum(p == 0 for p in shares) / len(shares),
                   all_valid=sum(p == 1 for p in shares) / len(shares), board_valid=tuple(map(sum, valid)))

    @classmethod
    def from_json(cls, stored: dict[str, Any]) -> SizeProbe:
        """A size as the `probes` table stores it (`ProbeResult.to_json`)."""
        return cls(**{**stored, "board_valid": tuple(stored.get("board_valid", ()))})


@dataclass(frozen=True)
class ProbeResult:
    """A config measured size by size, with what it cost. `key` is its cache key (empty when not stored)."""

    sizes: dict[int, SizeProbe]
    data_ratio: dict[int, float]
    completions: int
    seconds: float
    key: str = ""
    cached: bool = False
    reused: int = 0  # sizes taken from other stored probes (same knobs, checkpoint, seed and probe size)
    seed: int = 0  # the seed the boards were drawn with (`probe_boards`)

    @property
    def signal_share(self) -> float:
        """The data-ratio-weighted share of the config's boards that carry signal (sizes with data only)."""
        weight = sum(self.data_ratio.get(s, 0.0) for s in self.sizes)
        if weight == 0:
            return sum(p.signal for p in self.sizes.values()) / len(self.sizes)
        return sum(self.data_ratio.get(s, 0.0) * p.signal for s, p in self.sizes.items()) / weight

    def to_json(self) -> dict[str, Any]:
        return {str(s): asdict(p) for s, p in self.sizes.items()}


def sampling_temperature(grpo: dict[str, Any] | None = None) -> float:
    """The temperature a stage samples at: the run's `settings.grpo["temperature"]`, else TRL's default."""
    from trl import GRPOConfig  # TRL loads only for the one number

    chosen = GrpoOverrides.model_validate(grpo or {}).temperature
    return GRPOConfig.__dataclass_fields__["temperature"].default if chosen is None else chosen


def probe_boards(config: EnvConfig, size: int, boards: int, seed: int) -> list[Instance]:
    """The `boards` boards a probe of `config` answers at `size` with `seed`, in its order: a pure function, so the
    boards of a stored probe are drawn again exactly (`SizeProbe.board_valid` follows this order)."""
    return generate(config.one_size(size), boards, seed=seed)


def probe_config(policy: Policy, config: EnvConfig, *, seed: int = 0, boards: int = PROBE_BOARDS,
                 answers: int = PROBE_ANSWERS, temperature: float = 1.0, sizes: Sequence[int] | None = None,
                 progress: Callable[[int, int], object] | None = None) -> ProbeResult:
    """Measure `config` for `policy`: per size (`sizes`, default every size of the config), `boards` boards drawn
    from that size's ratios with `seed`, each answered `answers` times by sampling as a stage does.

    The answer budget is the stage's: the largest `answer_budget` over the boards drawn. Each size samples from
    its own seed (`seed * 1000 + size`), so a size's numbers do not depend on which other sizes are probed.
    `progress(done, total)` hears each size as it ends (sizes done of all). Raises what the generator raises
    when a size's boards cannot be made. The answer budget is the size's own (its boards' largest), so a size's
    numbers do not depend on the other sizes of the config.
    """
    from training.evaluate import answer_budget

    if boards < 1 or answers < 1:
        raise ValueError(f"boards = {boards}, answers = {answers}: a probe answers at least 1 board at least once")
    chosen = list(sizes if sizes is not None else config.sizes)
    t0 = time.perf_counter()
    drawn = {s: probe_boards(config, s, boards, seed) for s in chosen}
    measured: dict[int, SizeProbe] = {}
    for done, (size, instances) in enumerate(drawn.items(), start=1):
        budget = max(answer_budget(policy, b) for b in instances)
        prompts = [policy.prompt(b) for b in instances for _ in range(answers)]
        texts = policy.generate(prompts, max_new_tokens=budget, do_sample=True, temperature=temperature,
                                seed=seed * 1000 + size)
        outcomes = [score(b, parse(texts[i * answers + a], b.num_agents))
                    for i, b in enumerate(instances) for a in range(answers)]
        groups = [outcomes[i * answers:(i + 1) * answers] for i in range(len(instances))]
        measured[size] = SizeProbe.of(size, [[o.valid for o in g] for g in groups],
                                      [[o.optimal for o in g] for g in groups])
        if progress is not None:
            progress(done, len(drawn))
    return ProbeResult(measured, {s: config.data_ratio.get(s, 0.0) for s in chosen}, len(chosen) * boards * answers,
                       time.perf_counter() - t0, seed=seed)


def probe_size(settings: RunSettings) -> dict[str, int]:
    """B boards per size and K answers each for a run's probes: its settings, else `PROBE_BOARDS` and
    `PROBE_ANSWERS`."""
    return {"boards": settings.probe_boards or PROBE_BOARDS, "answers": settings.probe_answers or PROBE_ANSWERS}


def answering(settings: RunSettings | None) -> dict[str, Any]:
    """How a run's policy answers a probe, as `Policy.configured` reads its settings: the chat template's thinking
    flag and the answer budget (None: `training.evaluate.answer_budget`'s)."""
    if settings is None:
        return {"thinking": False, "completion_length": None}
    return {"thinking": settings.thinking == "on", "completion_length": settings.completion_length}


def probe_key(config: EnvConfig, checkpoint: str, seed: int, boards: int, answers: int, temperature: float,
              thinking: bool = False, completion_length: int | None = None) -> str:
    """The cache key: a hash of the canonical JSON of everything the numbers depend on. `thinking` and
    `completion_length` enter it only where they are not the defaults, so a probe stored before they did keeps
    its key; so does a config of one agent count, hashed as it was written before `agent_ratio` (`num_agents`)."""
    fields = {"config": _keyed(config), "checkpoint": checkpoint, "seed": seed, "boards": boards,
              "answers": answers, "temperature": temperature}
    if thinking:
        fields["thinking"] = True
    if completion_length is not None:
        fields["completion_length"] = completion_length
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:32]


def _keyed(config: EnvConfig) -> dict[str, Any]:
    """The config's JSON as a key hashes it: a lone agent count as `num_agents`, the form before the mix existed."""
    dumped = config.model_dump(mode="json")
    if len(config.agent_ratio) == 1:
        (count,) = config.agent_ratio
        del dumped["agent_ratio"]
        dumped["num_agents"] = count
    return dumped


def size_knobs(config: EnvConfig, size: int) -> tuple[float, float, tuple[tuple[int, float], ...], float]:
    """What one size's probe depends on in a config: its hole and wait ratio, the mix of agent counts (those with a
    share) and the share of boards drawn broadly."""
    mix = tuple((k, config.agent_ratio[k]) for k in config.agent_counts)
    return config.hole_ratio[size], config.wait_ratio[size], mix, config.random_share


def measured_sizes(engine: Engine, config: EnvConfig, checkpoint: str, seed: int, boards: int, answers: int,
                   temperature: float, settings: RunSettings | None = None) -> dict[int, SizeProbe]:
    """The sizes of `config` measured already in any stored probe on the same checkpoint, seed, probe size,
    temperature and answering settings (`answering(settings)`), whose knobs for that size equal `config`'s."""
    with session(engine) as s:
        rows = s.exec(select(Probe).where(Probe.checkpoint == checkpoint, Probe.seed == seed, Probe.boards == boards,
                                          Probe.answers == answers, Probe.temperature == temperature)).all()
    found: dict[int, SizeProbe] = {}
    for row in rows:
        other = EnvConfig.model_validate(row.config)
        # a row's key names how its policy answered: one keyed otherwise thought, or had another budget
        if row.key != probe_key(other, checkpoint, seed, boards, answers, temperature, **answering(settings)):
            continue
        for size, measured in row.sizes.items():
            size = int(size)
            if size not in found and size in config.sizes and size in other.sizes \
                    and size_knobs(other, size) == size_knobs(config, size):
                found[size] = SizeProbe.from_json(measured)
    return found


def result_of(row: Probe, cached: bool = True) -> ProbeResult:
    """A stored probe as a result."""
    sizes = {int(s): SizeProbe.from_json(p) for s, p in row.sizes.items()}
    ratios = EnvConfig.model_validate(row.config).data_ratio
    return ProbeResult(sizes, {s: ratios.get(s, 0.0) for s in sizes}, row.completions, row.seconds, row.key, cached,
                       seed=row.seed)


def stored_probe(engine: Engine, key: str) -> ProbeResult | None:
    with session(engine) as s:
        row = s.exec(select(Probe).where(Probe.key == key)).first()
    return None if row is None else result_of(row)


def measure(engine: Engine, config: EnvConfig, checkpoint: str, *,
            policy: Policy | Callable[[], Policy] | None = None, policy_path: str | None = None,
            settings: RunSettings | None = None, seed: int = 0, boards: int = PROBE_BOARDS,
            answers: int = PROBE_ANSWERS, temperature: float = 1.0,
            progress: Callable[[int, int], object] | None = None) -> ProbeResult:
    """The probe of `config` on `checkpoint` (as a stage row names it), from the `probes` table when it is
    there (`cached`, no sampling), else measured and stored: only the sizes no stored probe has measured with
    the same knobs are sampled (`reused` counts the others; `completions` and `seconds` are what this cost).

    `settings` are the run's: how its policy answers (`answering`) is part of the key. `policy` is the loaded
    policy, or a function that loads it (called only on a miss), configured with those settings; without it the
    policy is loaded from `policy_path` (default `checkpoint`) and configured here.
    """
    key = probe_key(config, checkpoint, seed, boards, answers, temperature, **answering(settings))
    if (found := stored_probe(engine, key)) is not None:
        return found
    known = measured_sizes(engine, config, checkpoint, seed, boards, answers, temperature, settings)
    missing = [size for size in config.sizes if size not in known]
    if progress is not None and known:
        progress(len(known), len(config.sizes))
    sized = ProbeResult({}, {}, 0, 0.0)
    if missing:
        if policy is None:
            from training.policy import load_policy, local_device

            policy = load_policy(policy_path or checkpoint, device=local_device()).configured(settings)
        elif callable(policy):  # a loader: a Policy itself is not callable
            policy = policy()
        step = None if progress is None else (lambda done, _n: progress(len(known) + done, len(config.sizes)))
        sized = probe_config(policy, config, seed=seed, boards=boards, answers=answers, temperature=temperature,
                             sizes=missing, progress=step)
    everything = {size: known.get(size) or sized.sizes[size] for size in config.sizes}
    result = ProbeResult(everything, {s: config.data_ratio.get(s, 0.0) for s in config.sizes}, sized.completions,
                         sized.seconds, key, cached=False, reused=len(known), seed=seed)
    with session(engine) as s:
        s.add(Probe(key=key, config=config.model_dump(mode="json"), checkpoint=checkpoint, seed=seed, boards=boards,
                    answers=answers, temperature=temperature, sizes=result.to_json(),
                    completions=result.completions, seconds=result.seconds))
        try:
            s.commit()
        except IntegrityError:  # another process measured the same just now: its row stands, equal to ours
            s.rollback()
    return result


def run_probe_job(engine: Engine, job: Job, progress: Progress) -> dict[str, Any]:
    """The `probe` job (the Measure panel, docs/loop.md): payload a `ProbePayload`; measures each config (cached
    ones cost nothing) and returns `{"probes": {label: key}}`. Progress counts sizes over every config."""
    from training.policy import load_policy, local_device

    p = ProbePayload.of(job)
    configs = p.configs
    total = sum(len(c.sizes) for c in configs.values())
    with session(engine) as s:  # the run's settings say how its policy answers (thinking, length)
        run = s.get(Run, p.run_id) if p.run_id is not None else None
    settings = run.settings if run else None
    loaded: list[Policy] = []

    def load() -> Policy:
        if not loaded:
            progress(0, total, f"loading {p.policy_path}")
            loaded.append(load_policy(p.policy_path, device=local_device()).configured(settings))
        return loaded[0]

    keys, done = {}, 0
    where = {label: "waiting" for label in configs}  # each config's progress, shown per config by the panel

    def said(label: str, text: str) -> dict[str, Any]:
        where[label] = text
        return {"progress": dict(where)}

    for label, config in configs.items():
        n = len(config.sizes)

        def step(k: int, _n: int, base: int = done, label: str = label, n: int = n) -> None:
            if progress(base + k, total, f"{label}: {base + k} of {total} sizes measured",
                        result=said(label, f"{k} of {n} sizes measured")):
                raise Cancelled(f"cancelled after {base + k} of {total} sizes")

        result = measure(engine, config, p.checkpoint, policy=load, settings=settings, seed=p.seed, boards=p.boards,
                         answers=p.answers, temperature=p.temperature, progress=step)
        done += n
        keys[label] = result.key
        text = "found in the cache" if result.cached else f"{result.completions} answers in {result.seconds:.1f} s"
        if result.reused:
            text += f" ({result.reused} of {n} sizes reused from an equal config measured before)"
        progress(done, total, f"{label}: {text}", result=said(label, f"done, {text}"))
    return {"probes": keys}
