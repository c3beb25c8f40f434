"""The `llm` engineer: asks a language model (the policy itself, Gemma, or any OpenAI-compatible server) and reads
its JSON back through `envsim.config.project` (`lab.engineers.reading`), retrying with the error shown when the
answer is unusable. By default the answer is held to `answer_schema` (structured output from a server,
constrained decoding in process), so it is one JSON object of the config with its rationale as a field."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from envsim.config import AGENT_RATIO, KNOBS, EnvConfig, narrow_counts, project
from lab.context import ContextModules, Evidence, build_context, measured_table
from lab.engineers.answer import SHARE_STEP, EngineerAnswer, FillCheck, ProbeFn
from lab.engineers.learnability import compute_of
from lab.engineers.needs import Needs
from lab.engineers.reading import (
    RATIONALE,
    Unreadable,
    rationale_of,
    read_config,
    split_rationale,
)
from lab.llm import LLMError, Messages, complete
from storage.settings import RunSettings
from training.probe import (
    ProbeResult,  # the probe's numbers; torch loads only where a probe samples
    probe_size,
)

Complete = Callable[[Messages], str]
# The longest rationale an in-process model may write when held to the schema: its answer has a token budget,
# and a rationale cut off by it would leave the whole object unclosed (and the config lost).
CONSTRAINED_RATIONALE_CHARS = 400

INSTRUCTIONS = """\
You are the environment engineer of a reinforcement-learning curriculum. A policy model is trained in stages \
to plan collision-free paths for several agents on MAPF-FrozenLake boards: square grids of ice and holes, \
where agents must reach their goals without falling into a hole, leaving the grid, or colliding. After each \
stage you choose the environment config of the next stage: for each map size, the share of training \
instances, the hole ratio and the wait ratio. Choose the config that will most improve the policy's valid \
and optimal rates on all map sizes by the end of training."""

# Added to the instructions where the run lets the engineer mix several agent counts (`Evidence.agent_counts`).
AGENT_MIX = """\
You also choose the stage's agent mix, {knob}: the share of the stage's training instances with each agent \
count (the keys), summing to 1. This run may use the agent counts {counts} only."""

ANSWER_FORMAT = """\
## Your answer
First the complete config of the next stage as one JSON object in a ```json fence, with every knob for \
every map size (keys are map sizes), following this JSON schema:
{schema}

Then one paragraph that explains your choice."""

RETRY = """\
Your answer could not be used: {error}
Answer again: the complete config as one JSON object in a ```json fence, then one paragraph of rationale."""


def llm(evidence: Evidence, *, seed: int, backend: str = "hf:policy", complete_fn: Complete | None = None,
        modules: ContextModules | None = None, max_attempts: int = 3, max_tokens: int = 1024,
        temperature: float = 0.7, base_url: str | None = None, policy_path: str | None = None,
        timeout: float = 120.0, structured: bool = True, probe_fn: ProbeFn | None = None,
        remeasure: bool = False, cannot_fill: FillCheck | None = None, thinking: bool = False,
        **_options: Any) -> EngineerAnswer:
    """Ask a language model for the next config; read and project its answer, retrying on failure.

    `complete_fn(messages) -> text` replaces the backend call when given (scripted answers in tests);
    otherwise `lab.llm.complete(backend, ...)` answers, held to `answer_schema` unless `structured` is
    False (then free text, as a model without a schema writes it). An unreadable or illegal answer is
    retried, the error shown to the model, up to `max_attempts` answers in all. A backend failure
    (`LLMError`) ends the proposal at once: asking again would fail again. Seeds of successive attempts are
    `seed`, `seed + 1`, ... `thinking`: the run's `thinking` setting, the chat template's `enable_thinking` where the
    run's own policy answers (`hf:policy`), so that it answers as it trains (off by default: at once).

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
        schema = answer_schema(base.sizes, evidence.agent_counts,
                               rationale_chars=CONSTRAINED_RATIONALE_CHARS if in_process else None)

    def ask(messages: Messages, attempt: int) -> str:
        return (complete_fn(messages) if complete_fn is not None else
                complete(backend, messages, max_tokens=max_tokens, temperature=temperature, seed=seed + attempt,
                         base_url=base_url, policy_path=policy_path, timeout=timeout, schema=schema,
                         thinking=thinking))

    messages: Messages = [{"role": "user", "content": engineer_prompt(evidence, modules)}]
    answer, messages = _converse(base, messages, ask, max_attempts, cannot_fill, evidence.agent_counts)
    if remeasure and probe_fn is not None and answer.projection is not None:
        measured = probe(answer.projection.config)
        flagged = [s for s in changed_sizes(base, answer.projection.config)
                   if measured.sizes[s].band != "learnable"]
        if flagged:
            again = [*messages, {"role": "assistant", "content": answer.raw},
                     {"role": "user", "content": REMEASURE.format(
                         sizes=", ".join(f"{s} ({measured.sizes[s].band})" for s in flagged),
                         table=measured_table(measured))}]
            second, _ = _converse(base, again, lambda m, a: ask(m, answer.attempts + a), 1,
                                  counts=evidence.agent_counts)
            if second.projection is not None:
                answer = replace(second, attempts=answer.attempts + 1)
            else:
                answer = replace(answer, prompt=second.prompt, attempts=answer.attempts + 1, rationale=(
                    f"{answer.rationale}\n(asked again after measuring; the second answer was not usable: "
                    f"{second.error}; the first stands)").strip())
    if spent:
        answer = replace(answer, compute=compute_of(spent))
    return answer


def llm_needs(settings: RunSettings) -> Needs:
    """A backend, and the checkpoint the proposal follows (which `hf:policy` asks); a probe of the run's size where
    its context shows the current config measured or the run re-measures its answer; the stage's dev episodes where
    its context shows failed boards (`failure_cases`)."""
    context = settings.context or {}
    measures = bool(context.get("measured") or settings.remeasure)
    return Needs(language_model=True, policy_path=True, probe=probe_size(settings) if measures else None,
                 reads_episodes=bool(context.get("failure_cases")))


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
              max_attempts: int, cannot_fill: FillCheck | None = None, counts: tuple[int, ...] | None = None,
              ) -> tuple[EngineerAnswer, Messages]:
    """Ask until an answer reads and projects (up to `max_attempts` answers), showing the model each error; the
    answer and the conversation that led to it. `ask(messages, attempt)` is one call of the model. With
    `cannot_fill` (the next stage's generator check), a config its boards cannot fill is an error to retry too;
    with `counts` (the run's agent counts), so is an agent count outside them."""
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
        proposed, said = split_rationale(proposed)
        try:
            projection = project(proposed, base=base, counts=counts)
        except (ValueError, TypeError, OverflowError) as err:  # ConfigError is a ValueError
            error = f"the config is not legal: {err}"
            continue
        if cannot_fill is not None and (why := cannot_fill(projection.config)) is not None:
            error = f"the generator cannot fill this config: {why}"
            continue
        rationale = said if said is not None else rationale_of(raw, span)
        return EngineerAnswer(_transcript(messages), raw, proposed, projection, rationale, None, attempts), messages
    return EngineerAnswer(_transcript(messages), raw, proposed, None, "",
                          f"no usable config after {attempts} answer{'s' * (attempts > 1)}: {error}",
                          attempts), messages



def answer_schema(sizes: tuple[int, ...], counts: tuple[int, ...] | None = None, *,
                  rationale_chars: int | None = None) -> dict[str, Any]:
    """The JSON schema of the llm engineer's answer: the config for these sizes (`EnvConfig.sized_schema`:
    every knob of every size and the share of each of the run's agent counts, `counts` (None: every legal count),
    each within its range, given to the thousandth)
    and, last, the rationale as a string field of the same object (at most `rationale_chars` characters when
    given). What it cannot say (that the data and agent shares sum to 1) is left to `project`, which renormalises
    and reports it.

    The thousandth (`multipleOf`, the step of `shares`) bounds every number's length: a model held to the
    schema cannot spin out digits until its token budget ends and leave the object unclosed."""
    schema = EnvConfig.sized_schema(sizes, counts)
    for knob in (*KNOBS, AGENT_RATIO):
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



def engineer_prompt(evidence: Evidence, modules: ContextModules | None = None) -> str:
    """The first message to the model: instructions (with the agent mix where the run has several agent counts),
    the context, the current config and the answer format, whose schema names the run's agent counts only."""
    counts = evidence.agent_counts
    schema = json.dumps(narrow_counts(EnvConfig.model_json_schema(), counts), separators=(",", ":"))
    current = json.dumps(evidence.current.config.model_dump(mode="json"), separators=(", ", ": "))
    instructions = INSTRUCTIONS if counts is None or len(counts) == 1 else \
        f"{INSTRUCTIONS}\n{AGENT_MIX.format(knob=AGENT_RATIO, counts=', '.join(map(str, counts)))}"
    return "\n\n".join([instructions, build_context(evidence, modules),
                        f"## The current config (stage {evidence.current.stage_index})\n{current}",
                        ANSWER_FORMAT.format(schema=schema)])



def _transcript(messages: Messages) -> str:
    """The prompt as stored: the first message alone, or every turn of a retried conversation."""
    if len(messages) == 1:
        return messages[0]["content"]
    return "\n\n".join(f"--- {m['role']} ---\n{m['content']}" for m in messages)
