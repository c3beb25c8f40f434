"""Environment engineers: from the evidence of a run, the config of its next stage.

Each engineer is a function `engineer(evidence, *, seed, **options) -> EngineerAnswer`, chosen by name
from `ENGINEERS`. Options an engineer does not use are ignored, so a caller passes the same ones to all.

- `fixed` keeps the current config (the paper's fixed-environment baseline).
- `random` draws a legal config from the seed and the round (the paper's random baseline).
- `heuristic` is a transparent curriculum rule; its rationale has one line per change it makes.
- `learnability` samples candidate hole and wait ratios per size, measures each on the policy (`training.probe`),
  keeps the most learnable and weights the sizes by learnability (sampling for learnability, as in unsupervised
  environment design).
- `llm` asks a language model (the policy itself, Gemma, or any OpenAI-compatible server) and reads its
  JSON back through `envsim.config.project`, retrying with the error shown when the answer is unusable.
  By default the answer is held to `answer_schema` (structured output from a server, constrained decoding
  in process), so it is one JSON object of the config with its rationale as a field.

An answer whose `projection` is None has failed: `error` says why, and the caller keeps the previous
config. No engineer raises on anything a model writes.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from envsim.config import GLOBALS, KNOBS, EnvConfig, Projection, project
from envsim.scoring import Tally
from lab.context import ContextModules, Evidence, build_context, knob_text, measured_table
from lab.llm import LLMError, Messages, complete
from training.probe import ProbeResult  # the probe's numbers; torch loads only where a probe samples

Complete = Callable[[Messages], str]
ProbeFn = Callable[[EnvConfig], "ProbeResult"]  # measures a config on the run's checkpoint (the propose job's)


@dataclass(frozen=True)
class EngineerAnswer:
    """What an engineer returned. `proposed` is the config as the answer gave it (None when unreadable),
    `projection` the legal config made of it (None when the proposal failed, and `error` says why)."""

    prompt: str
    raw: str
    proposed: dict[str, Any] | None
    projection: Projection | None
    rationale: str
    error: str | None = None
    attempts: int = 1
    compute: dict[str, Any] | None = None  # what measuring cost: {"completions", "seconds", "probes", "cached"}


def _answer(config: EnvConfig, base: EnvConfig, rationale: str) -> EngineerAnswer:
    """The answer of an engineer that builds its config itself (it is legal by construction)."""
    proposed = config.model_dump(mode="json")
    return EngineerAnswer(prompt="", raw=json.dumps(proposed, indent=2), proposed=proposed,
                          projection=project(proposed, base=base), rationale=rationale)


SHARE_STEP = 0.001


def shares(weights: dict[int, float], step: float = SHARE_STEP) -> dict[int, float]:
    """Weights as shares that are multiples of `step` and sum to 1 (largest remainder; ties: smaller size)."""
    units = round(1 / step)
    total = sum(weights.values())
    quotas = {s: w / total * units for s, w in weights.items()}
    counts = {s: math.floor(q) for s, q in quotas.items()}
    for s in sorted(quotas, key=lambda s: (counts[s] - quotas[s], s))[:units - sum(counts.values())]:
        counts[s] += 1
    return {s: round(c * step, 6) for s, c in counts.items()}


# ---------------------------------------------------------------- fixed and random baselines


def fixed(evidence: Evidence, *, seed: int = 0, **_options: Any) -> EngineerAnswer:
    """Keep the current config: the paper's fixed-environment baseline."""
    config = evidence.current.config
    return _answer(config, config, "fixed environment: keeps the current config")


RANDOM_DRAWS = 10  # the random engineer's draws per proposal before it gives up on a config the generator can fill


def random_config(evidence: Evidence, *, seed: int, cannot_fill: Callable[[EnvConfig], str | None] | None = None,
                  **_options: Any) -> EngineerAnswer:
    """A random legal config from (seed, round): data shares from a flat Dirichlet, hole and wait ratios
    uniform over their ranges, rounded to 0.001 and 0.01; the global knobs are kept.

    Some legal configs cannot be generated (3x3 boards with no holes rarely need a wait, so a wait ratio of 0.62
    there cannot be met). With `cannot_fill` (the loop passes the generator's check for the next stage's
    seed), such a draw is drawn again, up to `RANDOM_DRAWS` draws, so the random baseline trains on a random
    config rather than failing; the rationale names the draws it skipped and why.
    """
    base = evidence.current.config
    skipped: list[str] = []
    for draw in range(RANDOM_DRAWS):
        rng = np.random.default_rng([seed, evidence.round_index, *([draw] if draw else [])])
        config = _random_draw(base, rng)
        why = cannot_fill(config) if cannot_fill is not None else None
        if why is None:
            said = f"random baseline: a config drawn from seed {seed} and round {evidence.round_index}"
            if skipped:
                said += (f" (draw {draw + 1}: the generator could not fill the {len(skipped)} before it; "
                         f"the first: {skipped[0]})")
            return _answer(config, base, said)
        skipped.append(why)
    error = f"none of {RANDOM_DRAWS} random configs could be generated; the first: {skipped[0]}"
    return EngineerAnswer(prompt="", raw="", proposed=None, projection=None, rationale="", error=error)


def _random_draw(base: EnvConfig, rng: np.random.Generator) -> EnvConfig:
    sizes = base.sizes
    data = shares(dict(zip(sizes, rng.dirichlet(np.ones(len(sizes))).tolist(), strict=True)))
    (hole_lo, hole_hi), (wait_lo, wait_hi) = KNOBS["hole_ratio"], KNOBS["wait_ratio"]
    hole = {s: round(float(rng.uniform(hole_lo, hole_hi)), 2) for s in sizes}
    wait = {s: round(float(rng.uniform(wait_lo, wait_hi)), 2) for s in sizes}
    return EnvConfig(data_ratio=data, hole_ratio=hole, wait_ratio=wait, num_agents=base.num_agents,
                     num_instances=base.num_instances)


# ---------------------------------------------------------------- a transparent curriculum rule

FLOOR = 0.05  # the least learnability weight: mastered and unsolved sizes keep some data
UNLEARNED = 0.2  # a valid rate below this: the size is not learned yet
MASTERED = 0.9  # a valid rate at or above this: the size is mastered
DOMINANT = 0.5  # a failure kind "dominates" at a size when it is at least this share of the failures
HOLE_STEP = 0.05
WAIT_STEP = 0.1
CONFLICTS = ("vertex_conflict", "edge_conflict")


def heuristic(evidence: Evidence, *, seed: int = 0, **_options: Any) -> EngineerAnswer:
    """A deterministic curriculum rule over the current stage's validation results, size by size:

    - data_ratio by learnability p(1-p), p the valid rate, never below `FLOOR` (keeps what works);
    - wait_ratio + `WAIT_STEP` where conflicts are at least half of the failures;
    - hole_ratio - `HOLE_STEP` where holes are at least half of the failures and p < `UNLEARNED`,
      hole_ratio + `HOLE_STEP` where p >= `MASTERED`.

    A size without validation episodes keeps its hole and wait ratios and gets the floor weight.
    """
    base = evidence.current.config
    results = evidence.current.by_size
    known = {s: r for s, r in results.items() if s in base.data_ratio and r.episodes}
    data = shares({s: max(known[s].valid_rate * (1 - known[s].valid_rate), FLOOR) if s in known else FLOOR
                   for s in base.sizes})
    if all(abs(data[s] - base.data_ratio[s]) < SHARE_STEP for s in base.sizes):
        data = dict(base.data_ratio)  # a difference below the rounding step is no change
    hole, wait = dict(base.hole_ratio), dict(base.wait_ratio)
    (hole_lo, hole_hi), wait_hi = KNOBS["hole_ratio"], KNOBS["wait_ratio"][1]
    lines: list[str] = []
    for s in base.sizes:
        if data[s] != base.data_ratio[s]:
            lines.append(f"size {s}: data_ratio {knob_text(base.data_ratio[s])} -> {knob_text(data[s])} "
                         f"({_learnability(known.get(s))})")
        r = known.get(s)
        if r is None:
            continue
        p, failed = r.valid_rate, r.episodes - r.valid
        conflicts = sum(r.failures.get(k, 0) for k in CONFLICTS)
        holes = r.failures.get("hole", 0)
        if failed and conflicts >= DOMINANT * failed and wait[s] < wait_hi:
            wait[s] = round(min(wait[s] + WAIT_STEP, wait_hi), 3)
            lines.append(f"size {s}: wait_ratio {knob_text(base.wait_ratio[s])} -> {knob_text(wait[s])} "
                         f"(conflicts are {conflicts} of {failed} failures)")
        if failed and holes >= DOMINANT * failed and p < UNLEARNED and hole[s] > hole_lo:
            hole[s] = round(max(hole[s] - HOLE_STEP, hole_lo), 3)
            lines.append(f"size {s}: hole_ratio {knob_text(base.hole_ratio[s])} -> {knob_text(hole[s])} "
                         f"(valid {p:.0%} and holes are {holes} of {failed} failures)")
        elif p >= MASTERED and hole[s] < hole_hi:
            hole[s] = round(min(hole[s] + HOLE_STEP, hole_hi), 3)
            lines.append(f"size {s}: hole_ratio {knob_text(base.hole_ratio[s])} -> {knob_text(hole[s])} "
                         f"(valid {p:.0%}: mastered, so harder boards)")
    config = EnvConfig(data_ratio=data, hole_ratio=hole, wait_ratio=wait, num_agents=base.num_agents,
                       num_instances=base.num_instances)
    return _answer(config, base, "\n".join(lines) or "no change: nothing in the validation results calls for one")


def _learnability(r: Tally | None) -> str:
    if r is None or r.episodes == 0:
        return f"no validation episodes: floor weight {FLOOR:g}"
    p = r.valid_rate
    if p * (1 - p) < FLOOR:
        return f"valid {p:.0%}: p(1-p) = {p * (1 - p):.2f} is below the floor weight {FLOOR:g}"
    return f"valid {p:.0%}: learnability p(1-p) = {p * (1 - p):.2f}"


# ---------------------------------------------------------------- sampling for learnability

LEARN_FLOOR = 0.02  # the least data weight a size gets (learnability is at most 0.25): no size is dropped
HOLE_DELTA = 0.1  # candidate hole ratios: the current one, this much fewer holes, this much more
WAIT_DELTA = 0.25  # and one candidate with the wait ratio moved this much toward the middle of its range
# Each candidate is probed on this many boards, each answered this many times (a GRPO group of the tiny policy):
# 8 sizes x 4 candidates x 4 boards x 8 answers = 1,024 sampled answers, within a quarter of a default stage's
# wall time on one CPU thread (benchmarks/bench_probe.py).
LEARN_BOARDS = 4
LEARN_ANSWERS = 8


def candidates(config: EnvConfig, size: int) -> list[tuple[float, float]]:
    """The (hole, wait) ratios the `learnability` engineer measures at `size`: the current pair first, then
    fewer and more holes, then another wait ratio; clipped to the legal ranges, each pair once."""
    (hole_lo, hole_hi), (wait_lo, wait_hi) = KNOBS["hole_ratio"], KNOBS["wait_ratio"]
    hole, wait = config.hole_ratio[size], config.wait_ratio[size]
    other_wait = wait + WAIT_DELTA if wait <= (wait_lo + wait_hi) / 2 else wait - WAIT_DELTA
    pairs = [(hole, wait), (hole - HOLE_DELTA, wait), (hole + HOLE_DELTA, wait), (hole, other_wait)]
    found: list[tuple[float, float]] = []
    for h, w in pairs:
        pair = (round(min(max(h, hole_lo), hole_hi), 3), round(min(max(w, wait_lo), wait_hi), 3))
        if pair not in found:
            found.append(pair)
    return found


def learnability(evidence: Evidence, *, seed: int = 0, probe_fn: ProbeFn | None = None,
                 cannot_fill: Callable[[EnvConfig], str | None] | None = None, **_options: Any) -> EngineerAnswer:
    """Per size, measure each candidate (hole, wait) pair (`candidates`) with `probe_fn` (one size per probe),
    keep the most learnable (mean p_b(1 - p_b) over boards; a tie keeps the earlier, the current pair first),
    and set data_ratio in proportion to the kept learnability, never below `LEARN_FLOOR`.

    `probe_fn(config) -> ProbeResult` measures a one-size config on the run's checkpoint; the propose job
    passes one (`training.probe.measure`). A candidate the generator cannot fill is skipped, and with
    `cannot_fill` (the next stage's check) a size whose kept pair the stage's boards cannot fill goes back to
    its current ratios. The rationale
    names, per size, p and learnability of the kept and the next-best candidate; `compute` is what the probes
    cost (a probe found in the cache costs nothing).
    """
    base = evidence.current.config
    if probe_fn is None:
        return EngineerAnswer(prompt="", raw="", proposed=None, projection=None, rationale="",
                              error="the learnability engineer measures configs on the policy: it needs a probe "
                                    "(the propose job passes one)")
    hole, wait, weight = dict(base.hole_ratio), dict(base.wait_ratio), {}
    spent: list[ProbeResult] = []
    lines: list[str] = []
    for size in base.sizes:
        measured = _measure_candidates(base, size, probe_fn, spent)
        if not measured:
            weight[size] = LEARN_FLOOR
            lines.append(f"size {size}: no candidate could be generated; kept hole {knob_text(hole[size])}, "
                         f"wait {knob_text(wait[size])}")
            continue
        ranked = sorted(range(len(measured)), key=lambda i: (-measured[i][1].learnability, i))
        (h, w), kept = measured[ranked[0]]
        hole[size], wait[size] = h, w
        weight[size] = max(kept.learnability, LEARN_FLOOR)
        line = f"size {size}: hole {knob_text(h)}, wait {knob_text(w)} kept (p {kept.p:.0%}, learnability " \
               f"{kept.learnability:.3f})"
        if len(ranked) > 1:
            (h2, w2), second = measured[ranked[1]]
            line += f"; next best hole {knob_text(h2)}, wait {knob_text(w2)} (p {second.p:.0%}, learnability " \
                    f"{second.learnability:.3f})"
        lines.append(line)
    data = shares(weight)
    for size in base.sizes:
        lines[base.sizes.index(size)] += f"; data_ratio {knob_text(base.data_ratio[size])} -> {knob_text(data[size])}"
    config = EnvConfig(data_ratio=data, hole_ratio=hole, wait_ratio=wait, num_agents=base.num_agents,
                       num_instances=base.num_instances)
    # A few probe boards may be drawn where a stage's many cannot (a wait ratio the size rarely needs): revert the
    # size the generator names (else the last changed) to its current ratios until the stage's seed can fill it.
    changed = [s for s in base.sizes if (hole[s], wait[s]) != (base.hole_ratio[s], base.wait_ratio[s])]
    while cannot_fill is not None and changed and (why := cannot_fill(config)) is not None:
        named = re.search(r"size (\d+)\b", why)
        size = int(named.group(1)) if named and int(named.group(1)) in changed else changed[-1]
        changed.remove(size)
        hole[size], wait[size] = base.hole_ratio[size], base.wait_ratio[size]
        lines.append(f"size {size}: back to hole {knob_text(hole[size])}, wait {knob_text(wait[size])}: the "
                     f"generator could not fill the config ({why})")
        config = config.model_copy(update={"hole_ratio": dict(hole), "wait_ratio": dict(wait)})
    compute = compute_of(spent)
    lines.append(f"probe compute: {compute['completions']} sampled answers, {compute['seconds']:.1f} s "
                 f"({compute['probes']} probes, {compute['cached']} cached)")
    return replace(_answer(config, base, "\n".join(lines)), compute=compute)


def _measure_candidates(base: EnvConfig, size: int, probe_fn: ProbeFn,
                        spent: list[ProbeResult]) -> list[tuple[tuple[float, float], Any]]:
    """Each candidate pair at `size` with its measurement (`SizeProbe`), probed as a one-size config; a pair the
    generator cannot make is no candidate. Every probe is added to `spent`."""
    from envsim.generator import GenerationError

    measured = []
    for h, w in candidates(base, size):
        one = EnvConfig(data_ratio={size: 1.0}, hole_ratio={size: h}, wait_ratio={size: w},
                        num_agents=base.num_agents, num_instances=base.num_instances)
        try:
            spent.append(probe_fn(one))
        except GenerationError:
            continue
        measured.append(((h, w), spent[-1].sizes[size]))
    return measured


def compute_of(results: list[ProbeResult]) -> dict[str, Any]:
    """What probes cost: the answers sampled and the seconds spent by those not found in the cache."""
    new = [r for r in results if not r.cached]
    return {"completions": sum(r.completions for r in new), "seconds": round(sum(r.seconds for r in new), 3),
            "probes": len(results), "cached": len(results) - len(new)}


# ---------------------------------------------------------------- an LLM engineer

MAX_ANSWER_CHARS = 50_000  # the reader looks at the last this-many characters of an answer
MAX_NUMBER_DIGITS = 300  # a JSON integer longer than this is refused (it does not fit in a float)
RATIONALE_CHARS = 2_000
# The longest rationale an in-process model may write when held to the schema: its answer has a token budget,
# and a rationale cut off by it would leave the whole object unclosed (and the config lost).
CONSTRAINED_RATIONALE_CHARS = 400
RATIONALE = "rationale"

INSTRUCTIONS = """\
You are the environment engineer of a reinforcement-learning curriculum. A policy model is trained in stages \
to plan collision-free paths for several agents on MAPF-FrozenLake boards: square grids of ice and holes, \
where agents must reach their goals without falling into a hole, leaving the grid, or colliding. After each \
stage you choose the environment config of the next stage: for each map size, the share of training \
instances, the hole ratio and the wait ratio. Choose the config that will most improve the policy's valid \
and optimal rates on all map sizes by the end of training."""

ANSWER_FORMAT = """\
## Your answer
First the complete config of the next stage as one JSON object in a ```json fence, with every knob for \
every map size (keys are map sizes), following this JSON schema:
{schema}

Then one paragraph that explains your choice."""

RETRY = """\
Your answer could not be used: {error}
Answer again: the complete config as one JSON object in a ```json fence, then one paragraph of rationale."""


class Unreadable(ValueError):
    """An answer holds no JSON object that can be read; the message says what was found instead."""


def llm(evidence: Evidence, *, seed: int, backend: str = "hf:policy", complete_fn: Complete | None = None,
        modules: ContextModules | None = None, max_attempts: int = 3, max_tokens: int = 1024,
        temperature: float = 0.7, base_url: str | None = None, policy_path: str | None = None,
        timeout: float = 120.0, structured: bool = True, probe_fn: ProbeFn | None = None,
        remeasure: bool = False, cannot_fill: Callable[[EnvConfig], str | None] | None = None,
        **_options: Any) -> EngineerAnswer:
    """Ask a language model for the next config; read and project its answer, retrying on failure.

    `complete_fn(messages) -> text` replaces the backend call when given (scripted answers in tests);
    otherwise `lab.llm.complete(backend, ...)` answers, held to `answer_schema` unless `structured` is
    False (then free text, as a model without a schema writes it). An unreadable or illegal answer is
    retried, the error shown to the model, up to `max_attempts` answers in all. A backend failure
    (`LLMError`) ends the proposal at once: asking again would fail again. Seeds of successive attempts are
    `seed`, `seed + 1`, ...

    With `probe_fn` (`training.probe.measure` on the run's checkpoint), the `measured` context module shows the
    current config probed, and `remeasure` probes the answer: where a size it changed measures too easy or too
    hard, the model is asked once more with that measurement in the message, and its second usable answer
    stands (else the first). `compute` is what the probes cost.
    """
    spent: list[ProbeResult] = []

    def probe(config: EnvConfig) -> ProbeResult:
        spent.append(probe_fn(config))
        return spent[-1]

    if modules is not None and modules.measured and probe_fn is not None and evidence.measured is None:
        evidence = replace(evidence, measured=probe(evidence.current.config))

    base = evidence.current.config
    schema = None
    if structured:
        in_process = backend.partition(":")[0] == "hf"
        schema = answer_schema(base.sizes, rationale_chars=CONSTRAINED_RATIONALE_CHARS if in_process else None)

    def ask(messages: Messages, attempt: int) -> str:
        return (complete_fn(messages) if complete_fn is not None else
                complete(backend, messages, max_tokens=max_tokens, temperature=temperature, seed=seed + attempt,
                         base_url=base_url, policy_path=policy_path, timeout=timeout, schema=schema))

    messages: Messages = [{"role": "user", "content": engineer_prompt(evidence, modules)}]
    answer, messages = _converse(base, messages, ask, max_attempts, cannot_fill)
    if remeasure and probe_fn is not None and answer.projection is not None:
        measured = probe(answer.projection.config)
        flagged = [s for s in changed_sizes(base, answer.projection.config)
                   if measured.sizes[s].band != "learnable"]
        if flagged:
            again = [*messages, {"role": "assistant", "content": answer.raw},
                     {"role": "user", "content": REMEASURE.format(
                         sizes=", ".join(f"{s} ({measured.sizes[s].band})" for s in flagged),
                         table=measured_table(measured))}]
            second, _ = _converse(base, again, lambda m, a: ask(m, answer.attempts + a), 1)
            if second.projection is not None:
                answer = replace(second, attempts=answer.attempts + 1)
            else:
                answer = replace(answer, prompt=second.prompt, attempts=answer.attempts + 1, rationale=(
                    f"{answer.rationale}\n(asked again after measuring; the second answer was not usable: "
                    f"{second.error}; the first stands)").strip())
    if spent:
        answer = replace(answer, compute=compute_of(spent))
    return answer


REMEASURE = """\
Your config was measured on the policy before training. Sizes you changed measure outside the learnable band: \
{sizes}.
{table}
Answer again, with this measurement in mind: the complete config as one JSON object in a ```json fence, then \
one paragraph of rationale."""


def changed_sizes(before: EnvConfig, after: EnvConfig) -> list[int]:
    """The sizes where any per-size knob differs between two configs."""
    return [s for s in after.sizes if any(getattr(before, k).get(s) != getattr(after, k)[s] for k in KNOBS)]


def _converse(base: EnvConfig, messages: Messages, ask: Callable[[Messages, int], str],
              max_attempts: int, cannot_fill: Callable[[EnvConfig], str | None] | None = None,
              ) -> tuple[EngineerAnswer, Messages]:
    """Ask until an answer reads and projects (up to `max_attempts` answers), showing the model each error; the
    answer and the conversation that led to it. `ask(messages, attempt)` is one call of the model. With
    `cannot_fill` (the next stage's generator check), a config its boards cannot fill is an error to retry too."""
    raw, proposed, error = "", None, "no answer"
    attempts = 0
    for attempt in range(max(1, max_attempts)):
        attempts = attempt + 1
        if attempt:
            messages = [*messages, {"role": "assistant", "content": raw},
                        {"role": "user", "content": RETRY.format(error=error)}]
        try:
            raw = ask(messages, attempt)
        except LLMError as err:
            return EngineerAnswer(_transcript(messages), raw, proposed, None, "", f"backend failed: {err}",
                                  attempts), messages
        if not isinstance(raw, str):
            raw, proposed, error = repr(raw), None, f"the backend returned {type(raw).__name__}, not text"
            continue
        try:
            proposed, span = read_config(raw)
        except Unreadable as err:
            proposed, error = None, str(err)
            continue
        proposed, said = _split_rationale(proposed)
        try:
            projection = project(proposed, base=base)
        except (ValueError, TypeError, OverflowError) as err:  # ConfigError is a ValueError
            error = f"the config is not legal: {err}"
            continue
        if cannot_fill is not None and (why := cannot_fill(projection.config)) is not None:
            error = f"the generator cannot fill this config: {why}"
            continue
        rationale = said if said is not None else _rationale(raw, span)
        return EngineerAnswer(_transcript(messages), raw, proposed, projection, rationale, None, attempts), messages
    return EngineerAnswer(_transcript(messages), raw, proposed, None, "",
                          f"no usable config after {attempts} answer{'s' * (attempts > 1)}: {error}",
                          attempts), messages


def answer_schema(sizes: tuple[int, ...], *, rationale_chars: int | None = None) -> dict[str, Any]:
    """The JSON schema of the llm engineer's answer: the config for these sizes (`EnvConfig.sized_schema`:
    every knob of every size, each within its range, given to the thousandth) and, last, the rationale as a
    string field of the same object (at most `rationale_chars` characters when given). What it cannot say
    (that the data shares sum to 1) is left to `project`, which renormalises and reports it.

    The thousandth (`multipleOf`, the step of `shares`) bounds every number's length: a model held to the
    schema cannot spin out digits until its token budget ends and leave the object unclosed."""
    schema = EnvConfig.sized_schema(sizes)
    for knob in KNOBS:
        for item in schema["properties"][knob]["properties"].values():
            item["multipleOf"] = SHARE_STEP
    schema["title"] = "EngineerAnswer"
    schema["description"] = "The next stage's environment config, and why."
    rationale: dict[str, Any] = {"type": "string", "description": "one paragraph that explains the choice"}
    if rationale_chars is not None:
        rationale["maxLength"] = rationale_chars
    schema["properties"][RATIONALE] = rationale
    schema["required"] = [*schema["required"], RATIONALE]
    return schema


def _split_rationale(proposed: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The config without its `rationale` field, and that field when it is text (a structured answer carries
    its rationale inside the object; a free-text answer has none there). An object with no config key keeps
    the field, so `project` names it as an unknown key rather than reading nothing as "keep everything"."""
    if RATIONALE not in proposed or not _CONFIG_KEYS & set(proposed):
        return proposed, None
    said = proposed[RATIONALE]
    config = {k: v for k, v in proposed.items() if k != RATIONALE}
    return config, " ".join(said.split())[:RATIONALE_CHARS] if isinstance(said, str) else None


def engineer_prompt(evidence: Evidence, modules: ContextModules | None = None) -> str:
    """The first message to the model: instructions, the context, the current config and the answer format."""
    schema = json.dumps(EnvConfig.model_json_schema(), separators=(",", ":"))
    current = json.dumps(evidence.current.config.model_dump(mode="json"), separators=(", ", ": "))
    return "\n\n".join([INSTRUCTIONS, build_context(evidence, modules),
                        f"## The current config (stage {evidence.current.stage_index})\n{current}",
                        ANSWER_FORMAT.format(schema=schema)])


_FENCE = re.compile(r"```[ \t]*+([A-Za-z0-9_+-]*+)[^\n`]*+\n?(.*?)```", re.DOTALL)
# A JSON string (escapes included) or a brace: the scanner skips strings, so braces inside them do not count.
_BRACE = re.compile(r'"(?:[^"\\]|\\.)*+"|[{}]', re.DOTALL)
_CONFIG_KEYS = frozenset(KNOBS) | frozenset(GLOBALS)


def read_config(text: str) -> tuple[dict[str, Any], tuple[int, int]]:
    """The config object an answer gives, and where it stands in the text (start, end).

    The last ```json (or bare ```) fenced block holding a JSON object with a config key wins; without
    one, the last top-level balanced `{...}` of the text that is a JSON object, those with a config key
    first. NaN, infinities and numbers too large for a float are refused, so what comes back is strict
    JSON. Raises `Unreadable` naming what was wrong.
    """
    offset = max(0, len(text) - MAX_ANSWER_CHARS)
    tail = text[offset:]
    if not tail.strip():
        raise Unreadable("the answer is empty")
    problem = ""
    for fence in reversed(list(_FENCE.finditer(tail))):
        if fence.group(1).lower() not in ("", "json", "json5", "javascript", "js"):
            continue
        found = _last_object(fence.group(2))
        if isinstance(found, str):
            problem = problem or f"the ```json block holds no usable JSON object: {found}"
        elif _CONFIG_KEYS & set(found[0]):
            return found[0], (offset + fence.start(), offset + fence.end())
    found = _last_object(tail)
    if isinstance(found, str):
        raise Unreadable(problem or found)
    obj, (start, end) = found
    return obj, (offset + start, offset + end)


def _spans(text: str) -> tuple[list[tuple[int, int]], int | None]:
    """The top-level balanced `{...}` spans (start, end) of `text`, and the first brace never closed.

    A brace that is never closed does not hide what follows it: the spans are the matched pairs that no
    other matched pair contains.
    """
    stack: list[int] = []
    pairs: list[tuple[int, int]] = []
    for m in _BRACE.finditer(text):
        if m.group() == "{":
            stack.append(m.start())
        elif m.group() == "}" and stack:
            pairs.append((stack.pop(), m.end()))
    pairs.sort()
    top: list[tuple[int, int]] = []
    for start, end in pairs:
        if not top or start >= top[-1][1]:
            top.append((start, end))
    return top, (stack[0] if stack else None)


def _last_object(text: str) -> tuple[dict[str, Any], tuple[int, int]] | str:
    """The last top-level JSON object of `text` and its span (one with a config key first), or why none."""
    decoder = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite_float, parse_int=_bounded_int)
    spans, unclosed = _spans(text)
    other: tuple[dict[str, Any], tuple[int, int]] | None = None
    error = ""
    for start, end in reversed(spans):
        try:
            value = decoder.decode(text[start:end])
        except (ValueError, RecursionError) as err:
            error = error or _json_error(err, start)
            continue
        if isinstance(value, dict):
            if _CONFIG_KEYS & set(value):
                return value, (start, end)
            other = other or (value, (start, end))
    if unclosed is not None:
        return f"the JSON object that starts at character {unclosed} is never closed (was the answer cut off?)"
    if other is not None:
        return other
    if error:
        return f"the JSON object is not valid: {error}"
    return "no JSON object in the answer (expected a ```json block holding the config)"


def _json_error(err: Exception, start: int) -> str:
    if isinstance(err, RecursionError):
        return "it is nested too deeply"
    if isinstance(err, json.JSONDecodeError):
        return f"{err.msg} at character {start + err.pos}"
    return str(err)


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows; give a finite number")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise ValueError(f"the number {literal[:40]} is too large")
    return value


def _bounded_int(literal: str) -> int:
    if len(literal.lstrip("-")) > MAX_NUMBER_DIGITS:
        raise ValueError(f"a number with {len(literal)} digits is too large")
    return int(literal)


def _rationale(raw: str, span: tuple[int, int]) -> str:
    """The prose around the config: what follows it, else what precedes it (fences and tags removed)."""
    after, before = raw[span[1]:], raw[:span[0]]
    for part in (after, before):
        text = " ".join(part.replace("```json", " ").replace("```", " ").split())
        if text:
            return text[:RATIONALE_CHARS]
    return ""


def _transcript(messages: Messages) -> str:
    """The prompt as stored: the first message alone, or every turn of a retried conversation."""
    if len(messages) == 1:
        return messages[0]["content"]
    return "\n\n".join(f"--- {m['role']} ---\n{m['content']}" for m in messages)


ENGINEERS: dict[str, Callable[..., EngineerAnswer]] = {
    "fixed": fixed,
    "random": random_config,
    "heuristic": heuristic,
    "learnability": learnability,
    "llm": llm,
}
