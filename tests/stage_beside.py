"""A real stage of the tiny policy training beside the page, for the page's speed figures (benchmarks/bench_app.py,
benchmarks/bench_page.py) and its error walk (tests/pages/test_browser.py).

Stage 1 of the seeded `waiting` run (`tests.seeded.seed_lab`) is queued by accepting its pending proposal, and a real
`envlab worker` (as `envlab serve` starts it: its own process at its default lower CPU priority and with a core left
to the page, the stage in a child process) trains it with TRL's GRPO. The run asks for `steps` GRPO steps
(`max_steps`), many more than its 16 boards give in one epoch, so the stage is still training when the measurements
end; whether it trained the whole time is read from the stage's `training_logs` rows, not assumed: a figure taken
beside a stage that was loading its model, or already evaluating, is no figure of the page under training load.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, func
from sqlmodel import select

from lab.jobs.worker import beside_page_env, start_worker
from lab.pages.proposal import decide_proposal
from storage.db import session
from storage.models import Job, Run, Stage, TrainingLog

STEPS = 2000  # GRPO steps the stage is asked for: more than any measurement beside it lasts


@dataclass
class StageBeside:
    """The worker process and the stage it trains."""

    engine: Engine
    run_id: int
    worker: subprocess.Popen
    log: Path
    steps: int
    stage_index: int = 1

    def job(self) -> Job | None:
        with session(self.engine) as s:
            return s.exec(select(Job).where(Job.kind == "stage", Job.run_id == self.run_id)
                          .order_by(Job.id.desc())).first()

    def step(self) -> int | None:
        """The last GRPO step the stage logged while its job runs and has steps to go; None when it is not
        training (loading, evaluating, ended, or its worker gone)."""
        job = self.job()
        if job is None or job.status != "running" or self.worker.poll() is not None:
            return None
        with session(self.engine) as s:
            last = s.exec(select(func.max(TrainingLog.step)).where(TrainingLog.run_id == self.run_id,
                                                                    TrainingLog.stage_index == self.stage_index)).one()
        return last if last is not None and 0 < last < self.steps else None

    def state(self) -> str:
        """What the stage is doing, in words, for a report that it was not training."""
        job = self.job()
        if self.worker.poll() is not None:
            return f"the worker exited ({self.worker.returncode}); its log: {self.log}"
        if job is None:
            return "no stage job was queued"
        tail = (job.log_tail or "").strip().splitlines()[-1:] or ["(no log line yet)"]
        done = f"step {job.step}/{job.total}" if job.total else "no step counted yet"
        return f"stage job {job.status}, {done}: {tail[0][:200]}"

    def wait_training(self, wait_s: float) -> int | None:
        """The first GRPO step logged within `wait_s` seconds, or None (at once when the stage ends first)."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if (step := self.step()) is not None:
                return step
            job = self.job()
            if self.worker.poll() is not None or (job is not None and job.status not in ("queued", "running")):
                return None  # the worker is gone, or the stage ended (or failed) without being seen training
            time.sleep(0.5)
        return None

    def stop(self) -> None:
        """The worker asked to stop twice (the first SIGTERM waits for the job to end, the second interrupts it and
        ends its stage's process), killed if it is still there after 30 s."""
        for _ in range(2):
            if self.worker.poll() is None:
                self.worker.terminate()
                time.sleep(1)
        try:
            self.worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.worker.kill()
            self.worker.wait()


def queue_stage(engine: Engine, ids: dict[str, int], grpo: dict[str, Any]) -> int:
    """Stage 1 of the `waiting` run queued, from the tiny policy as shipped, with the GRPO fields `grpo` and one
    validation board, by accepting its pending proposal; returns the run's id."""
    run_id = ids["waiting"]
    with session(engine) as s:
        stage0 = s.exec(select(Stage).where(Stage.run_id == run_id, Stage.index == 0)).one()
        stage0.checkpoint = "tiny"  # stage 0 evaluated the tiny policy as shipped
        run = s.get(Run, run_id)
        run.settings = run.settings.model_copy(update={"grpo": grpo, "validation_boards": 1})
        s.add(stage0)
        s.add(run)
        s.commit()
    said = decide_proposal(engine, ids["pending"], "accept", "bench")
    assert said.startswith("✓"), said
    return run_id


def start(engine: Engine, db: str, ids: dict[str, int], steps: int = STEPS) -> StageBeside:
    """Stage 1 of the `waiting` run queued (`queue_stage`: `steps` GRPO steps) and a worker started on `db` to train
    it; its log beside the database."""
    run_id = queue_stage(engine, ids, {"max_steps": steps})
    log = Path(db).with_suffix(".worker.log")
    worker = start_worker(db, options=["--poll", "0.2"], log=log, die_with_parent=True, env=beside_page_env())
    return StageBeside(engine, run_id, worker, log, steps)


def measured_beside(engine: Engine, db: str, ids: dict[str, int], steps: int, wait_s: float,
                    measure: Callable[[], dict[str, float]]) -> tuple[dict[str, float] | None, str]:
    """`measure()` run while a real stage of `steps` GRPO steps trains beside it (`start`), and what the stage did:
    the figures, with `yes, GRPO steps A to B of N logged meanwhile`; or None, with why none count (the stage was
    not seen training within `wait_s`, or stopped during the measurements)."""
    stage = start(engine, db, ids, steps)
    try:
        first = stage.wait_training(wait_s)
        if first is None:
            return None, f"NO: not seen training within {wait_s:.0f} s ({stage.state()}); not measured"
        figures = measure()
        last = stage.step()
        if last is None:
            return None, f"NO: the stage stopped training during the measurements ({stage.state()}); figures dropped"
        return figures, f"yes, GRPO steps {first} to {last} of {steps} logged meanwhile"
    finally:
        stage.stop()
