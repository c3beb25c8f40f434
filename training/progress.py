"""How a long training function reports to whoever runs it, and how it learns to stop.

`training` runs for minutes to hours (a GRPO stage, an evaluation of 3,150 boards) and is started by
someone above it: the lab's worker (`lab.worker`), `accelerate launch -m training.stage`, a test. This
module is the one thing they agree on, so `training` needs nothing from them: a `Progress` callback that
the runner passes in, and `Cancelled`, which a function raises when the callback said stop.
"""

from __future__ import annotations

from typing import Any, Protocol


class Progress(Protocol):
    """`progress(step, total, line=None, result=None) -> bool`: report where the work is (`total` None when
    unknown), optionally with a log line and a partial result (e.g. the latest checkpoint); returns True
    once someone asked the work to stop, and the caller then raises `Cancelled`."""

    def __call__(self, step: int, total: int | None, line: str | None = None,
                 result: dict[str, Any] | None = None) -> bool: ...


class Cancelled(Exception):
    """Raised by work that stopped because a cancel was requested; its job ends `cancelled`."""
