"""A person's text (a run's or an experiment's name, a description, a decision's note): how long the lab lets it
be, and how a page or a report shows it.

Such text comes from whoever can reach the page, the command line or an archive, and every page load shows the
runs' names: an 8 MB name was 16.8 MB streamed on every load, and a name `<img src=...>` or `![](...)` put into
Markdown made every viewer's browser fetch that address. So each way in (lab.loop.create_run, lab.study.experiments,
lab.proposals.decide, lab.archive's import) refuses text over its bound with `too_long`'s message, before anything
is stored, and everything that writes Markdown shows it through `as_text`.

An engineer's text (the prompt it was given, its raw answer, its rationale) is not refused but cut: a proposal
keeps at most `ANSWER_LIMIT` characters of each (`clipped`), so the Proposal tab never sends megabytes.
"""

from __future__ import annotations

import html
import re

NAME_LIMIT = 200  # characters of a run's or an experiment's name (and an arm's, inside its runs' names)
TEXT_LIMIT = 10_000  # characters of a description or a decision's note: a few pages of text
ANSWER_LIMIT = 64 * 1024  # characters kept of an engineer's prompt, answer and rationale (a few kB in a real one)

# What Markdown reads in a line wherever it stands: code, emphasis, links and images, headings, table cells, math
# (Gradio's `$$`), strikethrough, and the addresses GFM links by themselves (`http://`, `www.`, `name@host`: the
# page's renderer would keep the escapes inside such a link as backslashes). A backslash before an ASCII
# punctuation character shows that character as itself.
_INLINE = re.compile(r"[\\`*_\[\]()!#|~$@]|(?<=[a-z]):(?=//)|(?<=www)\.", re.IGNORECASE)
# What it reads only at the start of a line: an indented code block (four spaces), a list item (`-`, `+`, `1.`,
# `1)`) or a heading's underline (`=`). Markdown drops a line's leading blanks in a paragraph, so they go here too.
_LEADING = re.compile(r"^[ \t]*([-+=]|\d+[.)])?", re.MULTILINE)


def too_long(field: str, text: str, limit: int) -> str | None:
    """Why `text` cannot be stored as `field` (its length and the limit), None when it fits."""
    if len(text) <= limit:
        return None
    return f"{field} is {len(text):,} characters long; at most {limit:,} are stored"


def clipped(text: str, limit: int = ANSWER_LIMIT) -> str:
    """`text`, or its first `limit` characters and a line saying how many more were cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[... {len(text) - limit:,} more characters cut: the lab keeps the first {limit:,}]"


def as_text(text: str) -> str:
    """`text` as Markdown that shows each of its characters as typed (its blanks folded, as Markdown folds them):
    no emphasis, link, image, heading, list, code, table cell or HTML tag comes of it (`&`, `<` and `>` go as
    entities, which Markdown shows as themselves). Not for code spans, where Markdown reads no escape: a person's
    text is never put in one."""
    escaped = _INLINE.sub(lambda m: "\\" + m[0], str(text))
    escaped = _LEADING.sub(lambda m: _marker(m[1] or ""), escaped)
    return html.escape(escaped, quote=False)


def _marker(marker: str) -> str:
    """A line's leading list or heading marker with its punctuation escaped (`1.` -> `1\\.`, `-` -> `\\-`)."""
    return marker[:-1] + "\\" + marker[-1] if marker else ""
