"""Read a free-form LLM answer into a joint plan (one list of action words per agent).

The policy is asked for one line per agent, `Agent 0: RIGHT DOWN WAIT DOWN`. Real answers wrap that in
reasoning, markdown and tags, so the reader is tolerant about decoration and strict about content: it
never guesses which of two plans was meant or what an unknown word stands for.

Grammar:

1. **Where to read.** If the text has an `<answer>` tag (any case, spaces allowed inside the brackets),
   only the last `<answer>` block is read. An unclosed last block runs to the end of the text (a trainer
   that stops generating at `</answer>` cuts the closing tag off); an empty last block is a parse error.
   A `</answer>` with no `<answer>` before it (the prompt opened the block) ends the text read. Without
   tags the whole text is read. `<nl>` counts as a line break (the compact tokenizer's newline token).
2. **Agent lines.** A line is an agent line when it opens with an agent label followed by `:` or `=`.
   The label is `Agent <n>`, `Agent<n>`, `Agent_<n>`, `Agent #<n>` or `A<n>`, in any case, `<n>` in ASCII
   digits. Markdown may come first (spaces, bullets `-` `*` `+` `•`, headings `#`, quotes `>`, backticks,
   a list number `1.` or `1)`) and bold or italic markers may close around the label (`**Agent 0:**`,
   `**Agent 0**:`). Every other line is prose and is skipped: `Agent 0 should go right first` has no
   colon after the number. A line that *does* open with `Agent 0:` is a plan, so reasoning such as
   `Agent 0: start (0,0)` belongs outside the answer block.
3. **Actions.** All of the agent line after the `:` or `=` is its action list. Words are separated by
   whitespace, `,` `;` `.` `|` `=` `-` `>` `<`, brackets, straight and curly quotes, backticks, `*` `_`
   and the arrows `→ ⇒ ⟶ ➔ ➜` (so `->` and `=>` separate too). Every word must be an action, long or short
   (`UP DOWN LEFT RIGHT WAIT`, `U D L R W`), in any case. Nothing after the colon is a legal empty list.
   A *cell note*, two whole numbers joined by a comma and bracketed or not (`(0, 1)`, `[0,1]`, `0 , 1`),
   may stand anywhere in the list: `R (0,1) D (1,1)` is the list `RIGHT DOWN`. Notes are the writer's
   trace of where each move leads; they are skipped, never checked: the actions alone are the plan. The
   tiny policy writes one after each move (`envsim.prompts.compact_answer`), its numbers spelled digit
   by digit (`1 0 , 3` is the cell (10, 3)): digits with only spaces between them are one number. A
   number that is not part of a note (`R 3`, `0 , 1 , 2`) is an unknown word.
4. **Checks**, the first that fails decides: an unknown word (`parse_error`, the first in reading order);
   no agent line at all (`parse_error`); an agent index outside 0..K-1, an agent with two lines, an agent
   with no line (`wrong_agent_count`). Messages name the word, the agent and the line (counted within the
   text read, from 1).

Every pattern is linear: possessive quantifiers and disjoint character classes leave the regex engine
nothing to backtrack into, so a megabyte of junk costs a single pass.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

from envsim.rules import ACTIONS, SHORT, Failure

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


_OPEN = re.compile(r"<\s*answer\s*>", re.IGNORECASE)
_CLOSE = re.compile(r"<\s*/\s*answer\s*>", re.IGNORECASE)
_HEADER = re.compile(
    r"[\s>#*_`•+\-]*+"  # markdown before the label
    r"(?:[0-9]{1,3}[.)][\s*_`]*+)?+"  # a numbered-list marker
    r"(?:agent[\s_#]*+|a)([0-9]++)"  # the label and its index
    r"[\s*_`]*+[:=]",  # bold closing before the colon
    re.IGNORECASE,
)
_SPACED_DIGITS = re.compile(r"(?<=[0-9])[^\S\n]++(?=[0-9])")  # `1 2`: a number spelled digit by digit
_CELL_NOTE = re.compile(  # starts only at a bracket or at a number's first digit, so junk costs one pass
    r"(?:[(\[][^\S\n]*+)?+(?<![0-9])[0-9]++[^\S\n]*+,[^\S\n]*+[0-9]++(?:[^\S\n]*+[)\]])?+")
_WORD = re.compile(r"[^\s,;.|=<>\-\[\](){}\"'`*_→⇒⟶➔➜“”‘’]+")
_CANON: dict[str, str] = {a: a for a in ACTIONS} | SHORT  # upper-case spelling -> canonical word
_MAX_INDEX_DIGITS = 6  # longer indices are reported as too large without converting them


def parse(text: str, num_agents: int) -> Parsed:
    """Read `text` as a plan for agents 0..num_agents-1; never raises (see the module docstring)."""
    if not isinstance(text, str):
        return _fail(Failure.PARSE_ERROR, f"the answer is {type(text).__name__}, not text")
    body, note = _answer_body(text)
    if body is None:
        return _fail(Failure.PARSE_ERROR, note)

    plans: dict[int, tuple[str, ...]] = {}
    line_of: dict[int, int] = {}
    agent_lines = 0
    duplicate = stranger = ""
    for number, line in enumerate(body.replace("<nl>", "\n").splitlines(), start=1):
        header = _HEADER.match(line)
        if header is None:
            continue
        agent_lines += 1
        digits = header.group(1)
        index = int(digits) if len(digits) <= _MAX_INDEX_DIGITS else -1
        label = digits if index >= 0 else digits[:_MAX_INDEX_DIGITS] + "..."
        actions = []
        listed = _CELL_NOTE.sub(" ", _SPACED_DIGITS.sub("", line[header.end():]))
        for word in _WORD.findall(listed):
            action = _CANON.get(word.upper())
            if action is None:
                shown = word if len(word) <= 20 else word[:20] + "..."
                return _fail(Failure.PARSE_ERROR,
                             f"unknown action {shown!r} for agent {label} on line {number}{note}")
            actions.append(action)
        if not 0 <= index < num_agents:
            stranger = stranger or (f"agent {label} on line {number} does not exist "
                                    f"({num_agents} agent{'s' * (num_agents != 1)})")
        elif index in plans:
            duplicate = duplicate or f"agent {index} has two plans (lines {line_of[index]} and {number})"
        else:
            plans[index], line_of[index] = tuple(actions), number

    if not agent_lines:
        return _fail(Failure.PARSE_ERROR, f"no agent lines (expected 'Agent 0: UP RIGHT ...'){note}")
    missing = [i for i in range(num_agents) if i not in plans]
    if stranger or duplicate or missing:
        message = stranger or duplicate or f"no plan for agent{'s' * (len(missing) > 1)} {_listed(missing)}"
        return _fail(Failure.WRONG_AGENT_COUNT, message + note)
    return Parsed(plan=tuple(plans[i] for i in range(num_agents)))


def format_plan(plan: Plan) -> str:
    """The canonical answer: one `Agent i: WORD WORD` line per agent (`Agent i:` for an empty list)."""
    return "\n".join(f"Agent {i}:" + "".join(" " + a for a in actions) for i, actions in enumerate(plan))


def _answer_body(text: str) -> tuple[str | None, str]:
    """The part of `text` to read, and a note for messages; None and the reason when nothing is to be read."""
    last_open = next(iter(deque(_OPEN.finditer(text), maxlen=1)), None)
    if last_open is None:
        close = _CLOSE.search(text)
        return (text if close is None else text[: close.start()]), ""
    close = _CLOSE.search(text, last_open.end())
    body = text[last_open.end() : None if close is None else close.start()]
    note = "" if close else " (the last <answer> block is not closed)"
    if not body.strip():
        return None, "the last <answer> block is empty" + (" and not closed" if note else "")
    return body, note


def _listed(indices: list[int]) -> str:
    return ", ".join(map(str, indices[:8])) + (", ..." if len(indices) > 8 else "")


def _fail(failure: Failure, message: str) -> Parsed:
    return Parsed(plan=None, failure=failure, message=message)
