"""Reading a language model's answer: the config object it gives (`read_config`), its rationale, and why an
answer could not be read (`Unreadable`). Whatever a model writes is untrusted: bounded, strict JSON, never raised
on except as `Unreadable`."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from envsim.config import AGENT_RATIO, GLOBALS, KNOBS, NUM_AGENTS, RANDOM_SHARE

MAX_ANSWER_CHARS = 50_000  # the reader looks at the last this-many characters of an answer
MAX_NUMBER_DIGITS = 300  # a JSON integer longer than this is refused (it does not fit in a float)
RATIONALE_CHARS = 2_000
RATIONALE = "rationale"


class Unreadable(ValueError):
    """An answer holds no JSON object that can be read; the message says what was found instead."""



def split_rationale(proposed: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The config without its `rationale` field, and that field when it is text (a structured answer carries
    its rationale inside the object; a free-text answer has none there). An object with no config key keeps
    the field, so `project` names it as an unknown key rather than reading nothing as "keep everything"."""
    if RATIONALE not in proposed or not _CONFIG_KEYS & set(proposed):
        return proposed, None
    said = proposed[RATIONALE]
    config = {k: v for k, v in proposed.items() if k != RATIONALE}
    return config, " ".join(said.split())[:RATIONALE_CHARS] if isinstance(said, str) else None



_FENCE = re.compile(r"```[ \t]*+([A-Za-z0-9_+-]*+)[^\n`]*+\n?(.*?)```", re.DOTALL)
# A JSON string (escapes included) or a brace: the scanner skips strings, so braces inside them do not count.
_BRACE = re.compile(r'"(?:[^"\\]|\\.)*+"|[{}]', re.DOTALL)
_CONFIG_KEYS = frozenset(KNOBS) | frozenset(GLOBALS) | {AGENT_RATIO, NUM_AGENTS, RANDOM_SHARE}


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


def rationale_of(raw: str, span: tuple[int, int]) -> str:
    """The prose around the config: what follows it, else what precedes it (fences and tags removed)."""
    after, before = raw[span[1]:], raw[:span[0]]
    for part in (after, before):
        text = " ".join(part.replace("```json", " ").replace("```", " ").split())
        if text:
            return text[:RATIONALE_CHARS]
    return ""
