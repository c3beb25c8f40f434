"""A process keeps at most `zygote.KEPT` zygotes: one whose children's import settings keep changing (a command run
for one database, then another: each has its own Trackio folder) does not keep one per setting it met. The least
recently used one goes first, never one whose child may still run."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

from lab.jobs import zygote
from tests.jobs.test_child import ROOT, _zygotes_of


def test_the_least_recently_used_idle_zygote_goes_and_a_busy_one_stays(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("ENVLAB_ZYGOTE", "1")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    zygote.close_all()
    before = _zygotes_of(os.getpid())
    envs = [{**os.environ, "TRACKIO_DIR": str(tmp_path / f"trackio-{i}")} for i in range(4)]
    try:
        first, second = (zygote._running(env) for env in envs[:2])
        running = SimpleNamespace(returncode=None)  # a child whose end its watcher has not read yet
        first.children.append(running)
        third = zygote._running(envs[2])  # three: the idle one of the two before goes, the busy one stays
        assert second.proc.wait(timeout=10) is not None and first.alive() and third.alive()
        assert _zygotes_of(os.getpid()) - before == {first.proc.pid, third.proc.pid}
        running.returncode = 0  # its child ended: the least recently used, idle now, goes next
        fourth = zygote._running(envs[3])
        assert first.proc.wait(timeout=10) is not None
        assert _zygotes_of(os.getpid()) - before == {third.proc.pid, fourth.proc.pid}
        assert zygote._running(envs[2]) is third  # used again: kept, not started anew
    finally:
        zygote.close_all()
    assert _zygotes_of(os.getpid()) - before == set()
