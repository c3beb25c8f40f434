"""`envlab headroom make-configs|report|study-plan` (the headroom screen, `lab.study.headroom`) and `envlab gate
make-configs|checkpoint|report` (the gate, `lab.study.gate`): the screens a study of engineers is designed from
(docs/experiments.md, docs/results/README.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from lab.cli.common import UsageError, engine_of
from storage.settings import MATCH_MODES

DB_HELP = "database path or URL (default: $ENVLAB_DB or runs/envlab.db)"


# ---------------------------------------------------------------- the headroom screen


def _headroom_configs(args: argparse.Namespace) -> None:
    from lab.study.experiments import ExperimentError
    from lab.study.headroom import INITIAL, HeadroomError, Plan, commands, write_configs

    try:
        files = write_configs(args.out, args.from_scenario)
    except (ExperimentError, HeadroomError) as err:
        raise UsageError(f"make-configs: {err}") from None
    print(f"{len(files)} configs and {INITIAL} in {args.out}")
    print("\n".join(commands(args.out, Plan(scenario=args.from_scenario))))


def _headroom_report(args: argparse.Namespace) -> None:
    from lab.study.experiments import ExperimentError
    from lab.study.headroom import (
        STEPS_SUFFIX,
        HeadroomError,
        commands,
        headroom,
        plan_of,
        steps_probe,
        verdict,
        write_report,
    )

    engine = engine_of(args.db)
    try:
        h = headroom(engine, args.experiment, args.draws)
        steps = steps_probe(engine, h, args.steps or args.experiment + STEPS_SUFFIX)
        remake = commands(args.configs, plan_of(h, args.from_scenario), db=args.db or "$ENVLAB_DB",
                          out=str(args.out))
    except (ExperimentError, HeadroomError) as err:
        raise UsageError(f"report: {err}") from None
    written = write_report(h, args.out, remake, steps)
    print(verdict(h))
    for what, where in written.items():
        print(f"{what}: {where}")


def _study_plan(args: argparse.Namespace) -> None:
    from lab.study.comparison import points
    from lab.study.experiments import ExperimentError
    from lab.study.headroom import (
        SCHEDULE_FILE,
        STATIC_FILE,
        STUDY_EFFECT,
        HeadroomError,
        StudyDesign,
        compute_text,
        headroom,
        stage_minutes,
        study_plan,
        write_study,
    )

    engine = engine_of(args.db)
    try:
        design = StudyDesign(tuple(a.strip() for a in args.arms.split(",") if a.strip()), args.stages,
                             args.match_compute, args.workers, args.instances)
        h = headroom(engine, args.experiment, args.draws)
        plan = study_plan(h, design.stages, stage_minutes(engine, h))
        lines = write_study(plan, h, args.out, args.configs, db=args.db or "$ENVLAB_DB", name=args.name,
                            design=design)
    except (ExperimentError, HeadroomError) as err:
        raise UsageError(f"study-plan: {err}") from None
    spread = "no config with 2 seeds" if plan.seed_sd is None else f"a seed spread of {points(plan.seed_sd)} points"
    print(f"best config {plan.best.arm} ({points(plan.best.valid.mean, signed=True)} points); {spread}: "
          f"{plan.seeds} seeds for 80% power at {points(STUDY_EFFECT)} points")
    print(compute_text(plan, design))
    print(f"{STATIC_FILE}, {SCHEDULE_FILE} in {args.out}")
    print("\n".join(lines))


def _headroom_commands(sub: argparse._SubParsersAction) -> None:
    from lab.study.headroom import (
        INITIAL,
        NAME,
        SCENARIO,
        SCHEDULE_FILE,
        STATIC_FILE,
        STEPS_SUFFIX,
        STUDY_ARMS,
        STUDY_NAME,
        STUDY_STAGES,
    )

    p = sub.add_parser("headroom", help="the headroom screen: how much a stage's gain depends on its environment "
                                        "(docs/experiments.md)")
    verbs = p.add_subparsers(dest="verb", required=True)
    _make_configs_command(verbs, "write the screen's configs and print its commands", _headroom_configs)
    s = verbs.add_parser("report", help="each config's gain, the random draws' and the headroom")
    s.add_argument("experiment", help=f"the configs' experiment (the screen's name, {NAME} by default)")
    s.add_argument("--draws", help="the random arm's experiment (default: EXPERIMENT-random)")
    s.add_argument("--db", help=DB_HELP)
    s.add_argument("--out", type=Path, required=True, help="folder for report.md and gains.csv")
    s.add_argument("--configs", type=Path, default=Path("configs"),
                   help="where make-configs wrote the configs (for the commands at the report's top)")
    s.add_argument("--from-scenario", default=SCENARIO, help="the scenario make-configs read (for the commands)")
    s.add_argument("--steps", help="the more-steps probe's experiment, reported where it exists "
                                   f"(default: EXPERIMENT{STEPS_SUFFIX}, as scripts/headroom-steps.sh names it)")
    s.set_defaults(fn=_headroom_report)
    s = verbs.add_parser("study-plan", help="the study of engineers the screen sizes: its configs and commands")
    s.add_argument("experiment", help=f"the configs' experiment (the screen's name, {NAME} by default)")
    s.add_argument("--draws", help="the random arm's experiment (default: EXPERIMENT-random)")
    s.add_argument("--db", help=DB_HELP)
    s.add_argument("--out", type=Path, required=True, help=f"folder for {STATIC_FILE} and {SCHEDULE_FILE}")
    s.add_argument("--configs", type=Path, default=Path("configs"), help=f"where make-configs wrote {INITIAL}")
    s.add_argument("--name", default=STUDY_NAME, help=f"the study's experiment name (default {STUDY_NAME})")
    s.add_argument("--arms", default=",".join(STUDY_ARMS),
                   help=f"the study's arms, comma-separated, of {', '.join(STUDY_ARMS)} (default all)")
    s.add_argument("--stages", type=int, default=STUDY_STAGES, help=f"trained stages (default {STUDY_STAGES})")
    s.add_argument("--match-compute", choices=MATCH_MODES, default="extra",
                   help="how a probing arm's compute is matched: extra GRPO steps for the others, or its stage "
                        "trimmed (default extra; unused without a probing arm)")
    s.add_argument("--workers", type=int, default=2, help="workers that run the study (default 2)")
    s.add_argument("--instances", type=int, help="training boards per stage, so GRPO steps (default: the screen's)")
    s.set_defaults(fn=_study_plan)


# ---------------------------------------------------------------- the gate


def _gate_engine(db: str | None, folder: Path):
    """The gate's database read from a copy in `folder`, where it is a SQLite file: the gate runs on a fixed commit,
    and opening its database here would migrate it past what that commit knows (its next process would then refuse
    it). A server URL is read as it is."""
    import sqlite3

    from storage.db import database_url

    url = database_url(db)
    if not url.startswith("sqlite:///"):
        return engine_of(db)
    path = Path(url.removeprefix("sqlite:///"))
    if not path.is_file():
        raise UsageError(f"no gate database at {path}")
    copy = folder / "gate-copy.db"
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as source, sqlite3.connect(copy) as target:
        source.backup(target)
    return engine_of(str(copy))



def _gate_configs(args: argparse.Namespace) -> None:
    from lab.study.experiments import ExperimentError
    from lab.study.gate import INITIAL, write_configs

    try:
        files = write_configs(args.out, args.from_scenario)
    except ExperimentError as err:
        raise UsageError(f"make-configs: {err}") from None
    print(f"{len(files)} configs and {INITIAL} in {args.out}")


def _gate_checkpoint(args: argparse.Namespace) -> None:
    from lab.study.gate import GateError, final_checkpoint

    try:
        print(final_checkpoint(engine_of(args.db), args.experiment))
    except GateError as err:
        raise UsageError(f"checkpoint: {err}") from None


def _gate_report(args: argparse.Namespace) -> None:
    import tempfile

    from lab.study.gate import STARTS, read_start, verdict, write_report

    with tempfile.TemporaryDirectory() as folder:
        engine = _gate_engine(args.db, Path(folder))
        starts = [s for name in STARTS if (s := read_start(engine, name)) is not None]
        engine.dispose()
    if not starts:
        raise UsageError(f"report: no gate experiment ({', '.join(f'gate-{n}' for n in STARTS)}) in the database")
    remake = ["bash scripts/gate.sh   # resumable; again after any stop",
              f"envlab gate report --db {args.db or '$ENVLAB_DB'} --out {args.out}"]
    written = write_report(starts, args.out, remake)
    print(verdict(starts))
    for what, where in written.items():
        print(f"{what}: {where}")


def _gate_study_plan(args: argparse.Namespace) -> None:
    import tempfile

    from lab.study.comparison import points
    from lab.study.gate import (
        STARTS,
        STUDY_ARMS,
        STUDY_SEEDS,
        STUDY_STAGES,
        GateError,
        read_start,
        stage_minutes,
        study_choice,
        study_commands,
    )

    with tempfile.TemporaryDirectory() as folder:
        engine = _gate_engine(args.db, Path(folder))
        starts = [s for name in STARTS if (s := read_start(engine, name)) is not None]
        minutes = stage_minutes(engine)
        engine.dispose()
    try:
        choice = study_choice(starts)
    except GateError as err:
        raise UsageError(f"study-plan: {err}") from None
    lines = study_commands(choice, configs=args.configs, starts=args.starts, out=args.out, db=str(args.study_db),
                           workers=args.workers)
    print(f"start {choice.start}, static config {choice.config}: {choice.why}")
    if choice.spread is not None:
        plain, holm = choice.detectable()
        print(f"seed spread there {points(choice.spread)} points: {STUDY_SEEDS} seeds detect {points(plain)} points "
              f"with 80% power at 0.05, {points(holm)} at Holm's first step (0.05 / {len(STUDY_ARMS) - 1})")
    stages = len(STUDY_ARMS) * STUDY_SEEDS * STUDY_STAGES
    pace = "" if minutes is None else (f"; at the gate's median stage job of {minutes:.1f} min on {args.workers} "
                                       f"workers, about {stages * minutes / args.workers / 60:.1f} hours")
    print(f"{len(STUDY_ARMS)} arms x {STUDY_SEEDS} seeds x {STUDY_STAGES} stages: {stages} trained stages{pace}")
    print("\n".join(lines))


def _gate_commands(sub: argparse._SubParsersAction) -> None:

    p = sub.add_parser("gate", help="the gate: does the best environment move as the policy learns? "
                                    "(docs/results/README.md)")
    verbs = p.add_subparsers(dest="verb", required=True)
    _make_configs_command(verbs, "write the gate's configs", _gate_configs)
    s = verbs.add_parser("checkpoint", help="the policy an experiment's single run ended on (a start)")
    s.add_argument("experiment")
    s.add_argument("--db", help=DB_HELP)
    s.set_defaults(fn=_gate_checkpoint)
    s = verbs.add_parser("report", help="per start the configs' ranking; between starts, whether the best moves")
    s.add_argument("--db", help=DB_HELP)
    s.add_argument("--out", type=Path, required=True, help="folder for report.md and gains.csv")
    s.set_defaults(fn=_gate_report)
    s = verbs.add_parser("study-plan", help="the study the gate calls for: its start, its static config, its commands")
    s.add_argument("--db", help="the gate's database (read from a copy), " + DB_HELP.removeprefix("database "))
    s.add_argument("--out", type=Path, required=True, help="folder for static.json and the study's report")
    s.add_argument("--configs", type=Path, default=Path("configs"), help="where make-configs wrote the configs")
    s.add_argument("--starts", type=Path, default=Path("starts"), help="the folder of the weak and static starts")
    s.add_argument("--workers", type=int, default=2, help="workers that run the study (default 2)")
    s.add_argument("--study-db", type=Path, default=Path("adapt.db"),
                   help="the study's own database, in its commands (default adapt.db)")
    s.set_defaults(fn=_gate_study_plan)


def _make_configs_command(verbs: argparse._SubParsersAction, help_text: str, fn: Any) -> None:
    """`make-configs`, the headroom screen's or the gate's (both write into `--out` from a scenario's sizes)."""
    from lab.study.headroom import SCENARIO

    s = verbs.add_parser("make-configs", help=help_text)
    s.add_argument("--out", type=Path, required=True, help="folder for initial.json and the configs")
    s.add_argument("--from-scenario", default=SCENARIO, help=f"the scenario whose sizes they use (default {SCENARIO})")
    s.set_defaults(fn=fn)


def add_commands(sub: argparse._SubParsersAction) -> None:
    """`envlab headroom ...` and `envlab gate ...`."""
    _headroom_commands(sub)
    _gate_commands(sub)
