"""`envlab experiment new|run|status|cancel|add-arm|adopt|list|report|ship|benchmark` (docs/experiments.md)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tqdm import tqdm

from envsim.suite import Split, boards_in
from lab.cli.common import WORKERS, UsageError, config_file, engine_of, grpo_overrides
from lab.cli.runs import stage_line
from lab.engineers import names as engineer_names
from lab.llm import LLMError, allow_server
from lab.settings import MAX_BOARDS, Count, counts_text, settings_arguments, settings_file, settings_from_args
from storage.settings import MATCH_MODES, PRIMARY_RATES, PROCESSES, Held

SEEDS = Count(1, 100, "every seed is one more run of every arm", "an experiment runs at least 1 seed")
THREADS = Count(1, 1024, "more torch threads than a machine has cores only slows it down", "at least 1 thread")


def cmd_experiment_new(args: argparse.Namespace) -> None:
    from lab.study.experiments import ExperimentError, create_experiment, experiment_runs
    from storage.settings import SettingsError

    if args.base_url:
        try:
            allow_server(args.base_url)  # given on this machine's command line
        except LLMError as err:  # a password in it: never echoed, never stored
            raise UsageError(str(err)) from None
    engine = engine_of(args.db)
    try:
        experiment = create_experiment(
            engine, name=args.name, arms=[a for a in args.arms.split(",") if a.strip()], seeds=args.seeds,
            settings=settings_from_args(args, auto_apply=True, grpo=grpo_overrides(args.grpo)),
            config=config_file(args.config) if args.config else None, scenario=args.scenario,
            instances=args.instances, policy=args.policy, description=args.description, primary=args.primary,
            match=args.match_compute, processes=args.processes)
    except SettingsError as err:
        raise UsageError(str(err)) from err
    except ExperimentError as err:  # a GRPO override TRL refuses: named in the settings file too
        file = settings_file(args)
        raise UsageError(file.located(err, grpo_flags=set(grpo_overrides(args.grpo))) if file
                         else str(err)) from err
    settings = experiment.settings
    runs = experiment_runs(engine, experiment.id)
    print(f"experiment {experiment.id} {experiment.name!r}: {len(runs)} runs queued ({len(experiment.arms)} arms x "
          f"{experiment.seeds} seeds), runs {runs[0].id}..{runs[-1].id}")
    agents = settings.validation_agents
    dev = boards_in(Split.DEV, settings.run.dev_per_size, agents) if settings.run.dev_per_size else 0
    at = f", agents {counts_text(agents)}"
    print(f"each run: {settings.stages} stages x {settings.instances} boards x {settings.steps_per_stage} "
          f"GRPO steps; {settings.validation_boards:,} validation boards (the score) and {dev:,} dev boards (what the "
          f"engineer reads{', each seed its own' if settings.run.dev_per_seed else ''}) per stage{at}; the report "
          f"leads with the {settings.primary} rate")
    if (matched := match_line(settings)) is not None:
        print(matched)
    print(f"run it: envlab experiment run {experiment.name} [--workers K]")


def match_line(settings) -> str | None:
    """What `--match-compute` gave each arm, in one line (None where the experiment was not matched)."""
    from lab.study.experiments import match_text

    return None if settings.matched is None else f"compute matched ({settings.matched.mode}): {match_text(settings)}"


def _progress_printer(engine, args: argparse.Namespace, bar: tqdm, say):
    """`on_progress` for `run_experiment`: moves the bar, says each stage that finished since the last call."""
    from lab.cli.common import start_bar_at
    from lab.loop import stages_of
    from lab.study.experiments import time_left
    from storage.db import session
    from storage.models import RunStatus, StageStatus

    shown: dict[int, int] | None = None

    def on_progress(p) -> None:
        nonlocal shown
        bar.total = p.total + (len(p.runs) if args.benchmark else 0)
        done = p.done + (p.benchmarks_done if args.benchmark else 0)
        if shown is None:
            start_bar_at(bar, done)
        bar.update(done - bar.n)
        failed = p.count(RunStatus.FAILED) + p.count(RunStatus.CANCELLED)
        bar.set_postfix_str(f"{p.count(RunStatus.DONE)}/{len(p.runs)} runs done" + (f", {failed} stopped" if failed
                                                                                     else ""))
        if shown is None:
            shown = dict(p.stages_done)
            left = time_left(engine, p) if p.done else ""
            say(f"experiment {p.experiment.name}: {p.done} of {p.total} stages done already"
                + (f"; {left}" if left.startswith("time left: about") else ""))
            return
        for run in p.runs:
            if p.stages_done[run.id] <= shown.get(run.id, 0):
                continue
            with session(engine) as s:
                done = [stage for stage in stages_of(s, run.id) if stage.status == StageStatus.DONE]
                for stage in done[shown.get(run.id, 0):]:
                    say(f"run {run.id} ({run.arm}, seed {run.seed}) {stage_line(s, stage, run.settings.stages)}")
            shown[run.id] = len(done)

    return on_progress


def cmd_experiment_run(args: argparse.Namespace) -> None:
    """One progress bar over runs x stages in a terminal; one line per finished stage otherwise."""
    from lab.study.experiments import ExperimentError, find_experiment, log_dir, run_experiment
    from storage.models import RunStatus

    quiet = not sys.stdout.isatty()
    engine = engine_of(args.db)
    try:
        experiment = find_experiment(engine, args.experiment)
    except ExperimentError as err:
        raise UsageError(str(err)) from err
    if args.slurm:
        ended = _experiment_on_slurm(engine, args, experiment, quiet)
    else:
        print(f"experiment {experiment.name}: {args.workers} worker(s), logs in {log_dir(engine, experiment)}",
              flush=True)
        with tqdm(desc=f"experiment {experiment.name}", unit="stage", disable=quiet) as bar, _sigterm_as_ctrl_c():
            say = (lambda line: print(line, flush=True)) if quiet else bar.write
            try:
                ended = run_experiment(engine, args.db, experiment.id, workers=args.workers,
                                       benchmark=args.benchmark, on_progress=_progress_printer(engine, args, bar, say),
                                       say=say, threads=args.threads)
            except ExperimentError as err:
                raise UsageError(str(err)) from err
    stopped = [r for r in ended.runs if r.status != RunStatus.DONE]
    print(f"experiment {experiment.name}: {ended.count(RunStatus.DONE)} of {len(ended.runs)} runs done", flush=True)
    for run in stopped:
        print(f"  run {run.id} ({run.arm}, seed {run.seed}) {run.status}: {run.status_reason}", flush=True)
    if stopped:
        raise UsageError(f"{len(stopped)} run(s) stopped; fix the cause and run `envlab experiment run "
                         f"{experiment.name}` again: it resumes them")
    print(f"report: envlab experiment report {experiment.name}")


@contextmanager
def _sigterm_as_ctrl_c() -> Iterator[None]:
    """SIGTERM (`kill`, `timeout`, a service manager) stops the command as Ctrl+C does: its workers hand the jobs in
    their hands back, saved. Python's own SIGTERM would end it at once and leave those jobs to the stale reaper."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set a handler
        yield
        return
    before = signal.signal(signal.SIGTERM, _as_ctrl_c)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _as_ctrl_c(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _experiment_on_slurm(engine, args: argparse.Namespace, experiment, quiet: bool):
    """`envlab experiment run NAME --slurm`: the workers are the tasks of a Slurm job array (lab.study.slurm)."""
    from lab.study.experiments import ExperimentError
    from lab.study.slurm import SlurmError, options_from_args, run_on_slurm
    from storage.db import RunsRootUnusable, database_url

    if args.benchmark:
        raise UsageError("--benchmark is not run on Slurm yet: run `envlab experiment benchmark NAME` and a worker")
    if engine.dialect.name == "sqlite":
        raise UsageError("--slurm needs a database every node's tasks can share: PostgreSQL (--db "
                         "postgresql+psycopg://user@host/envlab); a SQLite file is not safe there (docs/worker.md)")
    try:
        options = options_from_args(args)
    except SlurmError as err:
        raise UsageError(str(err)) from None
    print(f"experiment {experiment.name}: workers on slurm ({options.describe()})", flush=True)
    with tqdm(desc=f"experiment {experiment.name}", unit="stage", disable=quiet) as bar:
        say = (lambda line: print(line, flush=True)) if quiet else bar.write
        try:
            return run_on_slurm(engine, database_url(args.db), experiment.id, options,
                                on_progress=_progress_printer(engine, args, bar, say), say=say)
        except (ExperimentError, SlurmError, RunsRootUnusable) as err:
            raise UsageError(str(err)) from err


def cmd_experiment_status(args: argparse.Namespace) -> None:
    """Each run and stage of an experiment, the job that ran it and the Slurm job (id, node, state, log)."""
    from lab.study.experiments import ExperimentError
    from lab.study.slurm import status_lines

    try:
        print("\n".join(status_lines(engine_of(args.db), args.experiment)))
    except ExperimentError as err:
        raise UsageError(str(err)) from err


def cmd_experiment_cancel(args: argparse.Namespace) -> None:
    """Cancel every run of an experiment that has not ended, and its Slurm arrays."""
    from lab.study.experiments import ExperimentError
    from lab.study.slurm import cancel_experiment

    try:
        lines = cancel_experiment(engine_of(args.db), args.experiment)
    except ExperimentError as err:
        raise UsageError(str(err)) from err
    print("\n".join(lines) or f"experiment {args.experiment}: nothing to cancel, every run has ended")
    print(f"resume it: envlab experiment run {args.experiment}")


def cmd_experiment_add_arm(args: argparse.Namespace) -> None:
    from lab.study.experiments import ExperimentError, add_arms

    try:
        runs = add_arms(engine_of(args.db), args.experiment, [a for a in args.arms.split(",") if a.strip()])
    except ExperimentError as err:
        raise UsageError(str(err)) from err
    print(f"experiment {args.experiment}: {len(runs)} runs queued ({', '.join(r.name for r in runs)})")
    print(f"run them: envlab experiment run {args.experiment} (runs only what is not done)")


def _seeds(text: str) -> list[int]:
    """`0,1,2` or `0-2` (or both: `0-2,5`) as seeds."""
    seeds = []
    try:
        for part in (p.strip() for p in text.split(",") if p.strip()):
            low, dash, high = part.partition("-")
            seeds += range(int(low), int(high) + 1) if dash else [int(part)]
    except ValueError:
        raise UsageError(f"--seeds {text!r}: seeds as 0,1,2 or 0-2") from None
    return seeds


def cmd_experiment_adopt(args: argparse.Namespace) -> None:
    from lab.study.experiments import ExperimentError, adopt_runs

    try:
        adopted = adopt_runs(engine_of(args.db), args.experiment, args.source, args.arm, _seeds(args.seeds),
                             args.source_experiment)
    except ExperimentError as err:
        raise UsageError(str(err)) from err
    for theirs, run in adopted:
        print(f"{args.source} run {theirs} -> run {run.id}: {run.name}, arm {run.arm}, seed {run.seed}")
    print(f"experiment {args.experiment}: {len(adopted)} run(s) adopted as arm {args.arm!r}")


def cmd_experiment_list(args: argparse.Namespace) -> None:
    from lab.study.experiments import arm_names, list_experiments
    from storage.models import RunStatus

    found = list_experiments(engine_of(args.db))
    if not found:
        print("no experiments yet: envlab experiment new --name N --arms fixed,heuristic --seeds 3 --stages 3")
    for p in found:
        e = p.experiment
        states = ", ".join(f"{p.count(status)} {status}" for status in RunStatus if p.count(status))
        print(f"{e.id:>3} {e.name}: arms {', '.join(arm_names(e))}; {e.seeds} seeds; "
              f"{e.settings.stages} stages; runs {states}; {p.done}/{p.total} stages done; "
              f"created {e.created_at:%Y-%m-%d %H:%M} UTC")
        if (matched := match_line(e.settings)) is not None:
            print(f"    {matched}")


def cmd_experiment_report(args: argparse.Namespace) -> None:
    from lab.study.comparison import comparison, report_markdown, write_report
    from lab.study.experiments import ExperimentError, log_dir

    engine = engine_of(args.db)
    try:
        compared = comparison(engine, args.experiment)
    except ExperimentError as err:
        raise UsageError(str(err)) from err
    print(report_markdown(compared))
    written = write_report(compared, args.out or log_dir(engine, compared.experiment) / "report")
    for what, where in written.items():
        print(f"{what}: {where}")


def cmd_experiment_ship(args: argparse.Namespace) -> None:
    """The experiment's database packed (`study.db.gz`, episodes left out) and its report from that copy, in one
    folder: what docs/results ships and a new lab imports."""
    from lab.study.experiments import ExperimentError
    from lab.study.ship import ship

    try:
        written = ship(engine_of(args.db), args.experiment, args.out, partial=args.partial)
    except ExperimentError as err:
        raise UsageError(str(err)) from err
    for what, where in written.items():
        print(f"{what}: {where}")
    packed = written["database"]
    print(f"the report again from what is shipped: gunzip -k {packed} && envlab experiment report {args.experiment} "
          f"--db {packed.with_suffix('')} --out {args.out}")


def cmd_experiment_benchmark(args: argparse.Namespace) -> None:
    from lab.study.experiments import ExperimentError, find_experiment, queue_benchmarks

    engine = engine_of(args.db)
    try:
        lines = queue_benchmarks(engine, find_experiment(engine, args.experiment).id)
    except ExperimentError as err:
        raise UsageError(str(err)) from err
    print("\n".join(lines))
    print("a worker runs them (envlab worker, or envlab experiment run NAME --benchmark); the Leaderboard shows them")


DB_HELP = "database path or URL (default: $ENVLAB_DB or runs/envlab.db)"


def add_commands(sub: argparse._SubParsersAction) -> None:
    """`envlab experiment new|add-arm|run|list|report|ship|benchmark` (docs/experiments.md)."""
    p = sub.add_parser("experiment", help="engineers compared at equal compute, with seeds (docs/experiments.md)")
    verbs = p.add_subparsers(dest="verb", required=True)
    _new_command(verbs)
    _other_commands(verbs)


def _new_command(verbs: argparse._SubParsersAction) -> None:
    """`envlab experiment new`: its arms, seeds and the settings every run shares."""
    s = verbs.add_parser("new", help="store an experiment and queue its runs (arms x seeds, auto-apply)")
    s.add_argument("--name", required=True)
    plain = ", ".join(n for n in engineer_names() if n not in ("llm", *Held))
    s.add_argument("--arms", required=True, help=f"comma-separated: {plain}, "
                                                 "llm:BACKEND@PRESET (e.g. llm:openai:MODEL@paper-best), "
                                                 "static:FILE (one config for every stage), schedule:FILE (a JSON "
                                                 "list, a config per stage); NAME=SPEC names one")
    s.add_argument("--seeds", type=SEEDS, default=3, help="seeds 0..N-1 for every arm (default 3)")
    settings_arguments(s, experiment=True)
    s.add_argument("--instances", type=MAX_BOARDS, help="training boards per stage (default: the scenario's, 512)")
    s.add_argument("--config", type=Path, help="initial EnvConfig JSON (default: the scenario's)")
    s.add_argument("--scenario", help="assets/scenarios/NAME.json: initial config and GRPO overrides "
                                      "(default: default, the round-0 config)")
    s.add_argument("--grpo", action="append", default=[], metavar="KEY=VALUE", help="a GRPOConfig field, for every run")
    s.add_argument("--policy", default="tiny")
    s.add_argument("--description", default="")
    s.add_argument("--primary", choices=PRIMARY_RATES, default="valid",
                   help="the rate the report and the Compare tab lead with (default valid)")
    s.add_argument("--match-compute", nargs="?", const="extra", choices=MATCH_MODES, metavar="extra|trim",
                   help="even the answers the arms generate per stage where an arm probes configs (learnability): "
                        "extra (the default) gives the arms that probe less extra GRPO steps per trained stage whose "
                        "rollouts equal the probe answers; trim takes steps off the probing arm's stages instead")
    s.add_argument("--processes", type=PROCESSES, default=1, metavar="N",
                   help="the processes each stage is launched on (the GPUs of each worker that trains it; default 1): "
                        "a stage's steps are counted, its GRPO settings checked and its compute matched for them")
    s.add_argument("--db", help=DB_HELP)
    s.set_defaults(fn=cmd_experiment_new)


def _other_commands(verbs: argparse._SubParsersAction) -> None:
    """`envlab experiment run|status|cancel|add-arm|adopt|list|report|ship|benchmark`."""
    db = dict(help=DB_HELP)
    s = verbs.add_parser("run", help="run (or resume) every run of an experiment until all are done")
    s.add_argument("experiment", help="name (or id)")
    s.add_argument("--workers", type=WORKERS, default=1, help="worker processes to start (default 1)")
    s.add_argument("--benchmark", action="store_true", help="then evaluate each run's last stage on the benchmark")
    s.add_argument("--threads", type=THREADS, metavar="N",
                   help="torch threads per worker (default: torch's choice; 1 is fastest for the tiny policy on a "
                        "busy small CPU)")
    s.add_argument("--db", **db)
    from lab.study.slurm import add_arguments as slurm_arguments

    slurm_arguments(s)
    s.set_defaults(fn=cmd_experiment_run)
    s = verbs.add_parser("status", help="each run and stage, the job and the Slurm job that ran it (node, state, log)")
    s.add_argument("experiment", help="name (or id)")
    s.add_argument("--db", **db)
    s.set_defaults(fn=cmd_experiment_status)
    s = verbs.add_parser("cancel", help="cancel every run of an experiment that has not ended, and its Slurm jobs")
    s.add_argument("experiment", help="name (or id)")
    s.add_argument("--db", **db)
    s.set_defaults(fn=cmd_experiment_cancel)
    s = verbs.add_parser("add-arm", help="add arms to an experiment: their runs, every seed, at equal compute")
    s.add_argument("experiment", help="name (or id)")
    s.add_argument("--arms", required=True, help="comma-separated arm specs, as for `new`")
    s.add_argument("--db", **db)
    s.set_defaults(fn=cmd_experiment_add_arm)
    s = verbs.add_parser("adopt", help="take done runs of another database's experiment at the same compute in as "
                                       "an arm's seeds (each run there must reproduce: docs/experiments.md)")
    s.add_argument("experiment", help="name (or id)")
    s.add_argument("--from", dest="source", required=True, type=Path, help="the other database (a SQLite file)")
    s.add_argument("--arm", required=True, help="the arm, named as in both experiments")
    s.add_argument("--seeds", required=True, help="which seeds: 0,1,2 or 0-2")
    s.add_argument("--from-experiment", dest="source_experiment",
                   help="the experiment there (default: the one named as here)")
    s.add_argument("--db", **db)
    s.set_defaults(fn=cmd_experiment_adopt)
    s = verbs.add_parser("list", help="every experiment and how far it got")
    s.add_argument("--db", **db)
    s.set_defaults(fn=cmd_experiment_list)
    s = verbs.add_parser("report", help="print the comparison (Markdown) and write CSV files and a PNG figure")
    s.add_argument("experiment", help="name (or id)")
    s.add_argument("--out", type=Path, help="folder for report.md, runs.csv, summary.csv, curves.png "
                                            "(default: <runs root>/experiments/<id>/report)")
    s.add_argument("--db", **db)
    s.set_defaults(fn=cmd_experiment_report)
    s = verbs.add_parser("ship", help="pack the database (study.db.gz, episodes left out) and write the report from "
                                      "that copy, into one folder (docs/results/NAME: a new lab imports it)")
    s.add_argument("experiment", help="name (or id)")
    s.add_argument("--out", type=Path, required=True, help="the folder (made if missing)")
    s.add_argument("--partial", action="store_true", help="ship it although some runs have not ended")
    s.add_argument("--db", **db)
    s.set_defaults(fn=cmd_experiment_ship)
    s = verbs.add_parser("benchmark", help="queue the 3,150-board benchmark for each run's last stage")
    s.add_argument("experiment", help="name (or id)")
    s.add_argument("--db", **db)
    s.set_defaults(fn=cmd_experiment_benchmark)

