"""Forked processes that start together at a barrier: what the storage, queue, worker and loop tests use to race
real writers against one database."""

from __future__ import annotations

import multiprocessing
import os
import traceback
from pathlib import Path

from sqlalchemy import Engine

FORK = multiprocessing.get_context("fork")


def _report(target, barrier, results, index: int, *args) -> None:
    try:
        results.put((index, True, target(barrier, *args)))
    except BaseException:
        results.put((index, False, traceback.format_exc()))


def in_processes(target, args_per_process: list[tuple], engine: Engine) -> list:
    """Run `target(barrier, *args)` in forked processes that pass `barrier.wait()` together; their results.

    A failing child fails the test with its traceback (a child that never reached the barrier breaks
    it for the others after a timeout).
    """
    engine.dispose()  # no pooled connection crosses the fork
    barrier, results = FORK.Barrier(len(args_per_process), timeout=30), FORK.Queue()
    procs = [
        FORK.Process(target=_report, args=(target, barrier, results, i, *args))
        for i, args in enumerate(args_per_process)
    ]
    for p in procs:
        p.start()
    reports = sorted(results.get(timeout=90) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    failures = [value for _, ok, value in reports if not ok]
    assert not failures, "a child process failed:\n" + failures[0]
    return [value for _, _, value in reports]


def alive(pid: int) -> bool:
    """Whether process `pid` runs: it exists and is not a zombie (ended, not yet reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False
