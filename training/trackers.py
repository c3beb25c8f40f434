"""Experiment trackers (Trackio, W&B): a lab run is one tracker run, whatever number of stages it trains in.

TRL logs to the trackers a run's `settings.grpo["report_to"]` names through transformers' callbacks, and a stage
is a trainer of its own in a process of its own: left alone, every stage would open a tracker run of its own, its
steps counted from 1 again. So the lab names the tracker run and its axis, here:

- project: the lab's database, by its name (`runs/envlab.db` is project "envlab"; two databases in one folder,
  whose run ids both start at 1, are two projects);
- run: `#<id> <name> (<uuid's first 8>)`, e.g. "#3 curriculum (1f0c9a2e)", which every stage of the run resumes
  (the uuid keeps a database made again under the same name from resuming the old one's runs);
- step: one axis across stages; stage k's step s is logged at s plus the last step each earlier stage logged (the
  `TrainingLog` rows the Train tab draws), with the stage's own step and its index as fields (`train/stage_step`,
  `train/stage`). TRL's own profiling timings (`profiling/...`, logged by TRL, not by these callbacks) keep the
  stage's step.

Offline by default: Trackio writes an SQLite file per project under `TRACKIO_DIR`, which a worker's child points at
`<runs root>/trackio` unless set (`child_env`; Trackio reads it when it is imported, before any stage code runs);
W&B writes under `<runs root>/wandb` in offline mode unless an API key (`WANDB_API_KEY`, or `wandb login`'s
~/.netrc) or `WANDB_MODE` says otherwise. docs/training.md, "Trackers", has the commands that show them.

No transformers here (the page reads `where_to_see`); the callbacks that log on the run's axis are in
`training.stage`, beside the stage's other callback.
"""

from __future__ import annotations

import netrc
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, func
from sqlmodel import select

from storage.db import runs_root, session
from storage.models import Run, TrainingLog

TRACKERS = ("trackio", "wandb")  # the report_to values that get one tracker run per lab run
TRACKIO_DIR_SETTING = "TRACKIO_DIR"
DEFAULT_PROJECT = "envlab"


def reported(report_to: str | list[str] | None) -> list[str]:
    """The trackers of `TRACKERS` that a `report_to` (as a run's settings or `GRPOConfig` hold it) names; "all" names
    each (transformers then reports to those installed)."""
    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    return [t for t in TRACKERS if t in names or "all" in names]


def project(engine: Engine) -> str:
    """The tracker project of the lab on `engine`: its database's name (the SQLite file's stem)."""
    database = engine.url.database
    if engine.url.get_backend_name() == "sqlite":
        database = None if database in (None, "", ":memory:") else Path(database).stem
    return database or DEFAULT_PROJECT


def run_name(run: Run) -> str:
    return f"#{run.id} {run.name} ({run.uuid[:8]})"


def trackio_dir(engine: Engine) -> Path:
    """Where the lab's stages keep Trackio's files: `$TRACKIO_DIR` when set, else `<runs root>/trackio`."""
    if value := os.environ.get(TRACKIO_DIR_SETTING):
        return Path(value).expanduser().resolve()
    return runs_root(engine) / "trackio"


def child_env(engine: Engine) -> dict[str, str]:
    """What a job's process needs in its environment before it imports Trackio (`lab.jobs.worker.child_env`)."""
    return {TRACKIO_DIR_SETTING: str(trackio_dir(engine))}


@dataclass(frozen=True)
class Tracking:
    """One stage's place in its run's tracker run."""

    project: str
    name: str
    run_uuid: str
    stage: int
    offset: int  # the steps before this stage's on the run's axis
    root: Path  # the runs root (W&B's offline files go under it)

    def step(self, stage_step: int) -> int:
        return self.offset + stage_step

    def fields(self) -> dict[str, str]:
        """`GRPOConfig` fields: transformers' Trackio callback opens `project`/`run_name` with resume="allow"."""
        return {"project": self.project, "run_name": self.name}

    def wandb_init(self, environ: dict[str, str] | None = None) -> dict[str, Any]:
        """`wandb.init`'s arguments: the run's uuid as its id, resumed by every stage, offline without a key."""
        environ = os.environ if environ is None else environ
        mode = environ.get("WANDB_MODE") or ("online" if _wandb_key(environ) else "offline")
        return dict(project=environ.get("WANDB_PROJECT", self.project), id=self.run_uuid, name=self.name,
                    resume="allow", dir=str(self.root), mode=mode)


def _wandb_key(environ: dict[str, str]) -> bool:
    if environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def tracking(engine: Engine, run_id: int, stage_index: int) -> Tracking:
    """Stage `stage_index` of run `run_id` in its tracker run: the offset is the sum of the last step each earlier
    stage logged (the axis is monotone even where `logging_steps` > 1 leaves a stage's last steps unlogged)."""
    with session(engine) as s:
        run = s.get(Run, run_id)
        last = s.exec(select(func.max(TrainingLog.step)).where(TrainingLog.run_id == run_id,
                                                               TrainingLog.stage_index < stage_index)
                      .group_by(TrainingLog.stage_index)).all()
    return Tracking(project=project(engine), name=run_name(run), run_uuid=run.uuid, stage=stage_index,
                    offset=sum(last), root=runs_root(engine))


def where_to_see(engine: Engine, run: Run) -> str | None:
    """The command that shows the run's curves in Trackio (the Train tab says it), or None when it reports none."""
    if "trackio" not in reported(run.settings.overrides.report_to):
        return None
    return f"{TRACKIO_DIR_SETTING}={shlex.quote(str(trackio_dir(engine)))} trackio show --project " \
        f"{shlex.quote(project(engine))}"


def announce(tracking: Tracking, names: list[str]) -> str:
    """The stage's log line that says where its curves go."""
    where = []
    if "trackio" in names:
        from trackio.utils import TRACKIO_DIR  # as Trackio read it when imported (TRACKIO_DIR, else its cache)

        where.append(f"Trackio (files in {TRACKIO_DIR})")
    if "wandb" in names:
        where.append(f"W&B ({tracking.wandb_init()['mode']}, files in {tracking.root / 'wandb'})")
    return f"curves to {' and '.join(where)}: project {tracking.project}, run {tracking.name!r}, stage " \
        f"{tracking.stage} from step {tracking.offset + 1} of the run's axis"
