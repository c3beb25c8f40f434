"""An environment engineer as one object: its name, what it reads, what its propose job must give it, whether asking
it again changes its answer, and the function that proposes.

Every engineer of the lab is registered once (`lab.engineers.ENGINEERS`, by `register`), and everything that names
engineers reads the registry when it is asked, never a list of its own: the loop's checks and its propose job, the
command line's help, the page's choices (the Runs form's, the Train tab's switch), an experiment's arms and the
Proposal tab's word on asking again. So a new engineer is one module and one `register` call (docs/engineers.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from lab.engineers.answer import EngineerAnswer
from lab.engineers.needs import NOTHING, Needs
from storage.settings import RunSettings


class Propose(Protocol):
    """`propose(evidence, *, seed, **options) -> EngineerAnswer`: options it does not use are ignored, so the loop
    passes the same ones to every engineer (the seed, `cannot_fill`, and what its `Needs` declare)."""

    def __call__(self, evidence: Any, *, seed: int, **options: Any) -> EngineerAnswer: ...


@dataclass(frozen=True)
class Engineer:
    """One engineer.

    `reads`: what it reads, in a few words (the docs' list, the page's help). `same_when_asked_again`: its answer is a
    function of what a rejection does not change, so asked again on the same stage it answers the same config
    (`why_same` says why, on the Proposal tab); the others draw from a seed each rejection moves on
    (`lab.loop.proposal_seed`). `needs`: what its propose job gives it besides the evidence, for a run's settings
    (None: nothing more). `alone`: a run by itself may have it; a held engineer (`static`, `schedule`) runs only as
    an experiment's arm, whose runs store the configs of its file.
    """

    name: str
    propose: Propose
    reads: str
    same_when_asked_again: bool = False
    why_same: str = ""
    needs: Callable[[RunSettings], Needs] | None = None
    alone: bool = True

    def __post_init__(self) -> None:
        if self.same_when_asked_again and not self.why_same:
            raise ValueError(f"engineer {self.name!r} answers the same when asked again: say why (why_same)")

    def needs_for(self, settings: RunSettings) -> Needs:
        return NOTHING if self.needs is None else self.needs(settings)


ENGINEERS: dict[str, Engineer] = {}


def register(engineer: Engineer) -> Engineer:
    """Add `engineer` to the lab's engineers (a name taken already is refused); returns it."""
    if engineer.name in ENGINEERS:
        raise ValueError(f"an engineer named {engineer.name!r} is registered already")
    ENGINEERS[engineer.name] = engineer
    return engineer


def unregister(name: str) -> None:
    """Take an engineer out again (a test's scripted one)."""
    ENGINEERS.pop(name, None)


def names(alone: bool = False) -> list[str]:
    """The registered engineers' names in registration order; `alone`: only those a run by itself may have."""
    return [e.name for e in ENGINEERS.values() if e.alone or not alone]


def names_text(alone: bool = False) -> str:
    """`fixed, random, ... or bandit`: the names for a help text."""
    listed = names(alone)
    return listed[0] if len(listed) == 1 else f"{', '.join(listed[:-1])} or {listed[-1]}"
