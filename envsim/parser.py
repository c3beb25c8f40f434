"""Read a free-form LLM answer into a joint plan (one list of action words per agent)."""

from __future__ import annotations

from dataclasses import dataclass

from envsim.rules import Failure

Plan = tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Parsed:
    """A readable plan, or why the answer is not one.

    `plan` is None exactly when `failure` is `Failure.PARSE_ERROR` or `Failure.WRONG_AGENT_COUNT`;
    `message` then names the offending line or agent.
    """

    plan: Plan | None
    failure: Failure | None = None
    message: str = ""
