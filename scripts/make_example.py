"""Makes the shipped example: a real 3-stage run that a new lab imports on its first start.

Without it, `envlab serve` on a fresh machine opens a lab where every tab says there is nothing yet, and a
teacher who wants to replay trajectories has to train first. So envlab ships one run, `assets/example-run.zip`
(a run archive, docs/archive.md): the `tiny` policy trained for 3 stages from the round-0 config by the
heuristic engineer, seed 0, on boards of 2 to 5 agents (a quarter each), with a person's decisions on its
proposals, one of each kind, each with its reason:

- after stage 0 the first proposal is rejected: it raises `wait_ratio` at sizes whose conflicts are too few to
  say so; asked again, the heuristic (deterministic) proposes the same, and that one is edited: the raises
  at sizes where conflicts end fewer than `CONFLICT_SHARE` of the boards are taken out, to see whether the
  others help;
- after stages 1 and 2 the proposal is accepted, saying where the waits added for the stage paid off and what
  else the proposal changes.

The notes are written from the run's own numbers (`decision`), and a proposal that does not fit a note's
reason stops the making with `ExampleError` instead of storing a note that says something false.

Stages 0 and 3 are also evaluated on the benchmark, so the Leaderboard has a before and an after. The
checkpoints stay out of the file (5.5 MB each): the example is there to read and replay; a stage of it cannot
be trained on or benchmarked again.

`python scripts/make_example.py --make assets/example-run.zip` makes it again (docs/example.md): a run on a scratch
SQLite database, driven in this process by the same worker and loop as `envlab run`, decided here, exported.
`lab.study.example.ensure_example(engine)` imports it into an empty database (`envlab serve` does, unless
`--no-example`).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runs from a checkout without an install

from sqlalchemy import Engine  # noqa: E402
from sqlmodel import Session, func, select  # noqa: E402

from envsim.config import EnvConfig  # noqa: E402
from envsim.scoring import Tally  # noqa: E402
from lab.archive import export_run  # noqa: E402
from lab.cli.runs import quiet_libraries, stage_line  # noqa: E402
from lab.engineers import CONFLICTS  # noqa: E402
from lab.jobs.worker import WorkerOptions, handlers, run_worker  # noqa: E402
from lab.loop import LoopError, Step, after_job, create_run, drive, queue_benchmark, stages_of  # noqa: E402
from lab.proposals import current_proposal, decide  # noqa: E402
from lab.results import stage_summaries  # noqa: E402
from lab.study.example import DESCRIPTION, NAME  # noqa: E402
from storage.db import RUNS_SETTING, make_engine, session, upgrade  # noqa: E402
from storage.models import Action, Job, JobStatus, Proposal, Run, RunStatus, StageStatus  # noqa: E402
from storage.settings import RunSettings  # noqa: E402

STAGES = 3
SEED = 0
USER = "example"
CONFLICT_SHARE = 0.5  # the person's rule: conflicts on fewer than this share of a size's boards do not justify
# more waiting boards
AGENT_COUNTS = (2, 3, 4, 5)  # the run's agent counts, a quarter of the boards each
BENCHMARKED = (0, STAGES)  # the Leaderboard's before and after


class ExampleError(RuntimeError):
    """The example cannot be made as written: the message says what differs from what its decisions expect."""


# ---------------------------------------------------------------- the person's decisions


def _size(s: int) -> str:
    return f"{s}x{s}"


def _sizes(sizes: Sequence[int]) -> str:
    return ", ".join(_size(s) for s in sizes)


def _conflicts(tally: Tally) -> int:
    return sum(tally.failures.get(k, 0) for k in CONFLICTS)


def _few(tally: Tally) -> bool:
    """Whether a size's conflicts are too few to ask for more waiting boards: on fewer than `CONFLICT_SHARE` of its
    boards."""
    return _conflicts(tally) < CONFLICT_SHARE * tally.episodes


def _wait_raises(base: EnvConfig, proposed: EnvConfig) -> list[int]:
    return [s for s in base.sizes if proposed.wait_ratio[s] > base.wait_ratio[s]]


def _rates(sizes: Sequence[int], before: dict[int, Tally], after: dict[int, Tally]) -> str:
    return " and ".join(f"{_size(s)} ({before[s].valid_rate:.0%} → {after[s].valid_rate:.0%} valid)" for s in sizes)


@dataclass(frozen=True)
class Seen:
    """What the person reads before deciding: the stage the proposal follows (its index, config and validation
    results per size), the stage before that one (None after stage 0), and the proposed config."""

    index: int
    config: EnvConfig
    results: dict[int, Tally]
    before: tuple[EnvConfig, dict[int, Tally]] | None
    proposed: EnvConfig


def _reject(seen: Seen) -> tuple[dict | None, str]:
    raised = _wait_raises(seen.config, seen.proposed)
    few = [s for s in raised if _few(seen.results[s])]
    if not few:
        raise ExampleError(f"the first proposal after stage {seen.index} raises no wait_ratio where conflicts end "
                           f"fewer than {CONFLICT_SHARE:.0%} of the boards: the rejection's reason does not fit it")
    s = min(few, key=lambda k: _conflicts(seen.results[k]) / seen.results[k].episodes)
    r = seen.results[s]
    return None, (f"It raises wait_ratio at {len(raised)} sizes at once, {len(few)} of them where conflicts end "
                  f"fewer than {CONFLICT_SHARE:.0%} of the boards: at {_size(s)} the policy is {r.valid_rate:.0%} "
                  f"valid and its {_conflicts(r)} conflicts on {r.episodes} boards are too few to ask for more "
                  "waiting boards. Asking the engineer again.")


def _edit(seen: Seen) -> tuple[dict | None, str]:
    raised = _wait_raises(seen.config, seen.proposed)
    few = [s for s in raised if _few(seen.results[s])]
    if not few or len(few) == len(raised):
        raise ExampleError(f"the proposal after stage {seen.index} raises wait_ratio on {len(few)} of "
                           f"{len(raised)} sizes where conflicts end fewer than {CONFLICT_SHARE:.0%} of the boards: "
                           "the edit does not fit it")
    kept = [s for s in raised if s not in few]
    wait = {s: seen.config.wait_ratio[s] if s in few else seen.proposed.wait_ratio[s] for s in seen.config.sizes}
    edited = seen.proposed.model_copy(update={"wait_ratio": wait}).model_dump(mode="json")
    return edited, (f"The heuristic proposed the same again (it is deterministic, and the results have not "
                    f"changed). Kept its data shares and hole ratios, and raised wait_ratio only at {_sizes(kept)}, "
                    f"where conflicts end at least {CONFLICT_SHARE:.0%} of the boards, to see whether more waiting "
                    f"boards help there; wait_ratio stays as it was at {_sizes(few)}.")


def _accept(seen: Seen) -> tuple[dict | None, str]:
    config, proposed, results = seen.config, seen.proposed, seen.results
    said = ["Accepted as it is."]
    raised = _wait_raises(config, proposed)
    helped = False
    if seen.before is not None and (tried := _wait_raises(seen.before[0], config)):
        old = seen.before[1]
        up = [s for s in tried if results[s].valid > old[s].valid]
        down = [s for s in tried if results[s].valid < old[s].valid]
        same = [s for s in tried if s not in up and s not in down]
        verdict = ([f"paid off at {_rates(up, old, results)}"] if up else ["did not pay off"]) + (
            [f"{_sizes(same)} stayed the same"] if same else []) + (
            [f"{_rates(down, old, results)} fell"] if down else [])
        said.append(f"The waits added for stage {seen.index} " + "; ".join(verdict) + ".")
        helped = bool(up)
    if raised:
        said.append(f"{'So' if helped else 'Still,'} I take the heuristic's wait raises as they are, at "
                    f"{_sizes(raised)}.")
    moves = sorted(config.sizes, key=lambda s: proposed.data_ratio[s] - config.data_ratio[s])
    if proposed.data_ratio[moves[-1]] > config.data_ratio[moves[-1]]:
        more, less = moves[-1], moves[0]
        said.append(f"It gives more data to {_size(more)} ({results[more].valid_rate:.0%} valid) and less to "
                    f"{_size(less)} ({results[less].valid_rate:.0%}).")
    if harder := [s for s in config.sizes if proposed.hole_ratio[s] > config.hole_ratio[s]]:
        least = min(results[s].valid_rate for s in harder)
        said.append(f"More holes at {_sizes(harder)} ({least:.0%} valid{' or more' if len(harder) > 1 else ''}): "
                    "mastered, so harder boards.")
    if easier := [s for s in config.sizes if proposed.hole_ratio[s] < config.hole_ratio[s]]:
        said.append(f"Fewer holes at {_sizes(easier)}, where holes are most of the failures.")
    return None, " ".join(said)


def decision(s: Session, proposal: Proposal) -> tuple[Action, dict | None, str]:
    """What the example's person does with `proposal`: (action, edited config or None, the reason)."""
    if proposal.projected_config is None:
        raise ExampleError(f"proposal {proposal.id} failed ({proposal.error}): the heuristic engineer never fails")
    stages = stages_of(s, proposal.run_id)
    summaries = stage_summaries(s, proposal.run_id)
    k = proposal.after_stage
    seen = Seen(k, stages[k].config, summaries[k].by_size,
                None if k == 0 else (stages[k - 1].config, summaries[k - 1].by_size),
                proposal.projected_config)
    asked = s.exec(select(func.count()).select_from(Proposal).where(  # this one and those before it
        Proposal.run_id == proposal.run_id, Proposal.after_stage == k, Proposal.id <= proposal.id)).one()
    if k == 0:
        action, choose = (Action.REJECT, _reject) if asked == 1 else (Action.EDIT, _edit)
    else:
        action, choose = Action.ACCEPT, _accept
    edited, note = choose(seen)
    return action, edited, note


# ---------------------------------------------------------------- making it


def _decide_waiting(engine: Engine, run_id: int, say: Callable[[str], None]) -> bool:
    """Decide the run's current proposal if it waits for a person; returns whether it did."""
    with session(engine) as s:
        run = s.get(Run, run_id)
        proposal = current_proposal(s, run_id)
        if run.status != RunStatus.WAITING or proposal is None:
            return False
        action, edited, note = decision(s, proposal)
        decide(s, proposal.id, action, USER, edited=edited, note=note)
        say(f"proposal {proposal.id} after stage {proposal.after_stage}: {action}. {note}")
        return True


def make(out: str | Path, say: Callable[[str], None] = print, work: Path | None = None) -> Path:
    """Train the example run on a scratch database (its checkpoints in the same scratch folder, removed at the
    end), decide its proposals, benchmark stages 0 and 3, and export it to `out`. Says one line per stage, per
    decision and per benchmark. With `work`, the database and checkpoints live there and are kept: a making
    stopped midway goes on from where it stopped when made again with the same `work` (stages from their last
    checkpoint, decisions and benchmarks made once)."""
    if work is not None:
        work.mkdir(parents=True, exist_ok=True)
        return _make_in(work, out, say)
    with tempfile.TemporaryDirectory(prefix="envlab-example-") as scratch:
        return _make_in(Path(scratch), out, say)


def _make_in(folder: Path, out: str | Path, say: Callable[[str], None]) -> Path:
    saved = os.environ.get(RUNS_SETTING)
    os.environ[RUNS_SETTING] = str(folder)  # the checkpoints go to that folder, whatever $ENVLAB_RUNS says
    engine = make_engine(str(folder / "example.db"))
    try:
        upgrade(engine)
        run_id = _train(engine, say)
        for index in BENCHMARKED:
            if not _benchmarked(engine, run_id, index):
                _benchmark(engine, run_id, index)
            say(f"stage {index} evaluated on the benchmark")
        path = export_run(engine, run_id, out)
    finally:
        engine.dispose()
        if saved is None:
            os.environ.pop(RUNS_SETTING, None)
        else:
            os.environ[RUNS_SETTING] = saved
    say(f"run {run_id} -> {path} ({path.stat().st_size / 1e6:.1f} MB, without checkpoints)")
    return path


def _train(engine: Engine, say: Callable[[str], None]) -> int:
    """Create the run (or take the one an earlier making left) and drive it to its end with a worker in this
    process, deciding where a person would."""
    with session(engine) as s:
        earlier = s.exec(select(Run).where(Run.name == NAME)).first()
        run_id = earlier.id if earlier is not None else create_run(
            s, name=NAME, description=DESCRIPTION,
            config=EnvConfig.default().model_copy(update={"agent_ratio": {k: 1 / len(AGENT_COUNTS)
                                                                          for k in AGENT_COUNTS}}),
            settings=RunSettings(stages=STAGES, auto_apply=False, agent_counts=AGENT_COUNTS),
            engineer="heuristic", seed=SEED).id
    jobs = handlers()
    shown: set[int] = set()

    def on_state(state: Step) -> None:
        with session(engine) as s:
            for stage in stages_of(s, run_id):
                if stage.status == StageStatus.DONE and stage.index not in shown:
                    shown.add(stage.index)
                    say(stage_line(s, stage, STAGES))

    def work() -> bool:
        ran = run_worker(engine, jobs, WorkerOptions(once=True, after=after_job))
        return ran > 0 or _decide_waiting(engine, run_id, say)

    state = drive(engine, run_id, work, on_state=on_state, poll_s=0.5)
    if state.status != RunStatus.DONE:
        raise ExampleError(f"the example run ended {state.text}")
    return run_id


def _benchmark_job(engine: Engine, run_id: int, index: int, *statuses: JobStatus) -> Job | None:
    """The run's benchmark job of stage `index` in one of `statuses` (an earlier making's, in the same folder)."""
    with session(engine) as s:
        return s.exec(select(Job).where(Job.run_id == run_id, Job.kind == "benchmark", Job.target == index,
                                        Job.status.in_(statuses))).first()


def _benchmarked(engine: Engine, run_id: int, index: int) -> bool:
    return _benchmark_job(engine, run_id, index, JobStatus.DONE) is not None


def _benchmark(engine: Engine, run_id: int, index: int) -> None:
    """Benchmark stage `index`: the job an earlier making left queued or running (the worker hands a dead worker's
    back, and it goes on from the boards it stored), else a new one."""
    job = _benchmark_job(engine, run_id, index, JobStatus.QUEUED, JobStatus.RUNNING)
    try:
        job = job or queue_benchmark(engine, run_id, index)
    except LoopError as err:
        raise ExampleError(str(err)) from err
    run_worker(engine, handlers(), WorkerOptions(once=True))
    with session(engine) as s:
        ended = s.get(Job, job.id)
        if ended.status != JobStatus.DONE:
            raise ExampleError(f"the benchmark of stage {index} ended {ended.status}: {ended.error}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/make_example.py", description=__doc__.splitlines()[0])
    p.add_argument("--make", type=Path, metavar="ZIP", required=True,
                   help="train the example run and write it here (the shipped one is assets/example-run.zip)")
    p.add_argument("--work", type=Path, metavar="DIR",
                   help="keep the database and checkpoints in DIR (default: a scratch folder removed at the end), so "
                        "a making stopped midway goes on from where it stopped when run again with the same DIR")
    args = p.parse_args(argv)
    if not sys.stdout.isatty():
        quiet_libraries()
    started = time.monotonic()
    make(args.make, say=lambda line: print(line, flush=True), work=args.work)
    print(f"made in {time.monotonic() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
