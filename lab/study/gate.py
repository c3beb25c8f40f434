"""The gate: does the best environment move as the policy learns? (docs/results/README.md, "The gate")

An engineer that adapts the environment to the policy can only beat the best fixed environment if the best
environment changes as training goes on. The gate measures that before any adaptive engineer is studied: the same
configs, trained for one stage each, from three starting points of one policy's training:

- `weak`: an early checkpoint of the 2-to-5-agent warm start (`WEAK_STEP`, where 4 and 5 agents are near 0%),
- `tiny`: the shipped `tiny` (step 22,000 of the same warm start),
- `static`: `tiny` trained two stages of 128 GRPO steps on the headroom screen's best config (the second-pass study's
  `static` arm, seed 0).

Each start is one experiment (`gate-weak`, `gate-tiny`, `gate-static`) of the same settings: the configs below as
`static:FILE` arms, `SEEDS` seeds, one stage of `INSTANCES` boards (`STEPS` GRPO steps), `DEV_PER_SIZE` dev boards
per (agent count, map size) drawn for each seed (a cell's standard error is at most 2.9 points at that count), and
the 2,520 validation boards of 3 to 5 agents. Configs are ranked on the dev boards and scored on validation.

    python -m lab.study.gate make-configs --out DIR     # initial.json and one file per config
    python -m lab.study.gate checkpoint NAME --db DB    # the policy an experiment's single run ended on

The configs widen the headroom screen's grid past its corner (fewest holes, most waits), where its winner sat: 5%
holes with 90% of the boards needing a wait, and no holes at all, at each of its three agent mixes; its winner
itself as the anchor, and one harder config (uniform mix, 25% holes, half the boards needing a wait) for the
ranking's other end. A wait ratio near 1 on a board without holes cannot be generated: two agents on an open 9x9
rarely have to wait, so 1,024 boards of the mixes with 2 agents found too few (`envsim.generator.cannot_fill`:
holes 0 fails at waits 0.85 and up for mixA, 0.75 and up for mixC; holes 0.05 fills at 0.9, not at 1.0). Each
config was checked to fill for both seeds' stage 1 before the gate started.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sqlmodel import select

from envsim.config import EnvConfig
from lab.study.experiments import ExperimentError, load_scenario
from lab.study.headroom import INITIAL, MIXES, SCENARIO, config_name, initial_config
from storage.db import runs_root, session
from storage.models import Experiment, Run, RunStatus, Stage

# (agent mix, hole ratio, wait ratio) of each config, as the headroom screen names them
GRID: tuple[tuple[str, float, float], ...] = (
    ("mixA", 0.1, 0.75),  # the headroom screen's winner: the anchor
    ("mixA", 0.05, 0.9),
    ("mixB", 0.05, 0.9),
    ("mixC", 0.05, 0.9),
    ("mixA", 0.0, 0.75),
    ("mixB", 0.0, 0.75),
    ("mixC", 0.0, 0.6),
    ("mixB", 0.25, 0.5),  # harder: the ranking's other end
)
STARTS = ("weak", "tiny", "static")
SEEDS = 2
INSTANCES = 1024  # 256 GRPO steps a stage (the tiny policy's 8 answers a board, 32 a step)
STEPS = INSTANCES * 8 // 32
DEV_PER_SIZE = 300  # sqrt(0.25 / 300) = 2.9 points: a (count, size) cell's standard error at worst
WEAK_STEP = 10_000  # the warm start's check boards there: 43.1 / 22.2 / 7.9 / 0.0% at 2 / 3 / 4 / 5 agents
PREP = "gate-start-static"  # the experiment that trains the `static` start


class GateError(ValueError):
    """The gate cannot be made or read as asked; the message says why."""


def configs(initial: EnvConfig) -> dict[str, EnvConfig]:
    """The gate's configs by name, on the initial config's sizes with its data shares and boards per stage."""
    return {config_name(mix, holes, waits): initial.model_copy(update={
        "hole_ratio": dict.fromkeys(initial.sizes, holes), "wait_ratio": dict.fromkeys(initial.sizes, waits),
        "agent_ratio": dict(MIXES[mix])}) for mix, holes, waits in GRID}


def write_configs(out: Path, scenario: str = SCENARIO) -> dict[str, Path]:
    """`out/initial.json` (the headroom screen's: sizes 5..10, data even) and `out/<name>.json` per config."""
    initial = initial_config(load_scenario(scenario).config)
    out.mkdir(parents=True, exist_ok=True)
    (out / INITIAL).write_text(initial.model_dump_json(indent=2) + "\n")
    files = {}
    for name, config in configs(initial).items():
        files[name] = out / f"{name}.json"
        files[name].write_text(config.model_dump_json(indent=2) + "\n")
    return files


def final_checkpoint(engine, name: str) -> str:
    """The policy the one run of experiment `name` ended on: its last stage's checkpoint (absolute; a stored one is
    relative to the runs root, an absolute one stays as it is), once the run is done."""
    with session(engine) as s:
        experiment = s.exec(select(Experiment).where(Experiment.name == name)).first()
        if experiment is None:
            raise GateError(f"no experiment named {name!r}")
        runs = s.exec(select(Run).where(Run.experiment_id == experiment.id)).all()
        if len(runs) != 1:
            raise GateError(f"experiment {name!r} has {len(runs)} runs; a start is the end of one run")
        run = runs[0]
        if run.status != RunStatus.DONE:
            raise GateError(f"experiment {name!r}: its run {run.id} is {run.status}, not done")
        last = s.exec(select(Stage).where(Stage.run_id == run.id).order_by(Stage.index.desc())).first()
        if last is None or not last.checkpoint:
            raise GateError(f"experiment {name!r}: its run {run.id} has no trained stage with a checkpoint")
        return str(runs_root(engine) / last.checkpoint)


def _make_configs(args: argparse.Namespace) -> None:
    try:
        files = write_configs(args.out, args.from_scenario)
    except ExperimentError as err:
        raise SystemExit(f"gate make-configs: {err}") from None
    print(f"{len(files)} configs and {INITIAL} in {args.out}")


def _checkpoint(args: argparse.Namespace) -> None:
    from lab.cli.common import UsageError, engine_of

    try:
        print(final_checkpoint(engine_of(args.db), args.experiment))
    except (GateError, UsageError) as err:
        raise SystemExit(f"gate checkpoint: {err}") from None


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m lab.study.gate", description=__doc__.split("\n\n")[0])
    verbs = p.add_subparsers(dest="verb", required=True)
    s = verbs.add_parser("make-configs", help="write the gate's configs")
    s.add_argument("--out", type=Path, required=True, help="folder for initial.json and the configs")
    s.add_argument("--from-scenario", default=SCENARIO, help=f"the scenario whose sizes they use (default {SCENARIO})")
    s.set_defaults(fn=_make_configs)
    s = verbs.add_parser("checkpoint", help="the policy an experiment's single run ended on (a start)")
    s.add_argument("experiment")
    s.add_argument("--db", help="database path or URL (default: $ENVLAB_DB or runs/envlab.db)")
    s.set_defaults(fn=_checkpoint)
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    args.fn(args)


if __name__ == "__main__":
    main()
