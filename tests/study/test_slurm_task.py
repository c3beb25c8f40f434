"""A Slurm array task requeued by submitit's `checkpoint` hook (time limit or preemption) comes back with every
setting it was submitted with, `by_run` among them: an experiment's task claims the oldest run's jobs first again."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from lab.study.slurm import SlurmTask


def test_a_requeued_task_keeps_every_setting_it_was_submitted_with(tmp_path: Path):
    pytest.importorskip("submitit")
    task = SlurmTask(db=str(tmp_path / "lab.db"), runs=str(tmp_path / "runs"), stale_s=60.0, idle_exit_s=5.0,
                     threads=2, poll_s=0.5, by_run=True)
    delayed = task.checkpoint()  # it held no job: nothing to hand back
    again = pickle.loads(pickle.dumps(delayed.function))  # as submitit stores it for the requeued task
    assert again == task and again.by_run is True and (delayed.args, delayed.kwargs) == ((), {})
