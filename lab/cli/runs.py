"""`envlab run`, `worker`, `export`, `push`, `import` and `serve`: a run headless, the workers, a run as a file (or a
stage on the Hugging Face Hub), the page."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from tqdm import tqdm

from envsim.config import EnvConfig
from lab.cli.common import UsageError, config_file, engine_of, grpo_overrides, start_bar_at
from lab.engineers import names as engineer_names
from lab.engineers import names_text as engineer_names_text
from lab.llm import LLMError, allow_server
from lab.settings import MAX_BOARDS, SEED, settings_arguments, settings_file, settings_from_args, settings_yaml

if TYPE_CHECKING:
    from sqlmodel import Session

    from lab.loop import Step
    from storage.models import Run, Stage
    from storage.settings import RunSettings


def quiet_libraries() -> None:
    """For a run whose output goes to a file or a pipe: no progress bars from the libraries (transformers'
    weight loading and saving, datasets' maps) and no FutureWarning or DeprecationWarning that a library
    raises about itself or another library (ours still show)."""
    import datasets
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    datasets.disable_progress_bars()
    for category in (FutureWarning, DeprecationWarning):
        warnings.filterwarnings("ignore", category=category, module=r"(?!(envsim|lab|training|storage)\b)")


def duration(seconds: float) -> str:
    """`42s`, `1m 42s`, `2h 05m`."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    return f"{s // 60}m {s % 60:02d}s" if s < 3600 else f"{s // 3600}h {s % 3600 // 60:02d}m"


def stage_line(s: Session, stage: Stage, stages: int) -> str:
    """One line for a finished stage: its validation rates, how long it took, the valid rate per size (and per agent
    count, where its boards have several)."""
    from lab.results import stage_summaries

    summary = stage_summaries(s, stage.run_id, stage_index=stage.index)[stage.index]
    total = summary.pooled
    took = (duration((stage.finished_at - stage.started_at).total_seconds())
            if stage.started_at and stage.finished_at else "time unknown")
    sizes = " ".join(f"{size}:{t.valid_rate:.0%}" for size, t in sorted(summary.by_size.items()))
    counts = " ".join(f"{k}:{t.valid_rate:.0%}" for k, t in summary.by_agents.items())
    return (f"stage {stage.index}/{stages} done: validation valid {total.valid_rate:.1%} "
            f"optimal {total.optimal_rate:.1%} ({took}; {total.episodes} boards, valid by size {sizes}"
            + (f", by agent count {counts}" if len(summary.by_agents) > 1 else "") + ")")


def _initial(args: argparse.Namespace) -> tuple[EnvConfig, dict]:
    """The initial config of `--scenario`, `--config` and `--instances` (each on top of the one before), and the
    scenario's GRPO overrides (a settings file's and `--grpo`'s go on top: `settings_from_args`)."""
    from lab.study.experiments import ExperimentError, load_scenario

    try:
        scenario = load_scenario(args.scenario or "default")
    except ExperimentError as err:
        raise UsageError(str(err)) from err
    config = config_file(args.config) if args.config else scenario.config
    if args.instances is not None:
        config = config.model_copy(update={"num_instances": args.instances})
    return config, scenario.grpo


def run_gpus(visible: Sequence[str], processes: int) -> list[str]:
    """The GPUs `envlab run` trains a run planned for `processes` processes on (`RunSettings.processes`): the first
    `processes` of the `visible` ones, a process on each (its other GPUs stay idle: the stage's steps were counted for
    `processes`); none for one process on a machine without a GPU (the CPU trains it).

    Raises:
        UsageError: fewer GPUs are visible than the run's processes, before anything is stored or trained.
    """
    if processes == 1 and not visible:
        return []
    if len(visible) < processes:
        shown = f"only {len(visible)} ({','.join(visible)})" if visible else "none"
        raise UsageError(f"--processes {processes}: a stage of this run is launched on {processes} processes, one per "
                         f"GPU, and this machine shows {shown} (CUDA_VISIBLE_DEVICES); give --processes "
                         f"{max(1, len(visible))}, or run it on a machine of {processes} GPUs")
    return list(visible[:processes])


def _new_settings(args: argparse.Namespace) -> tuple[EnvConfig, RunSettings]:
    """The initial config and the settings these flags give a new run, checked: a bad value is refused here, before
    a database is opened or a child process started."""
    from storage.settings import SettingsError

    config, scenario_grpo = _initial(args)
    try:
        return config, settings_from_args(args, grpo=grpo_overrides(args.grpo), grpo_under=scenario_grpo)
    except SettingsError as err:
        raise UsageError(str(err)) from err


def _new_run(s: Session, args: argparse.Namespace, made: tuple[EnvConfig, RunSettings],
             visible: Sequence[str] = ()) -> Run:
    """The run of `made` (`_new_settings`), refused before it is stored where its processes find too few of the
    `visible` GPUs (`run_gpus`) or the training stack refuses its GRPO overrides."""
    from lab.loop import LoopError, create_run
    from storage.settings import SettingsError

    config, settings = made
    try:
        run_gpus(visible, settings.processes or 1)
        return create_run(s, name=args.name, config=config, settings=settings, policy=args.policy,
                          engineer=args.engineer or "heuristic", engineer_backend=args.backend or "", seed=args.seed)
    except SettingsError as err:
        raise UsageError(str(err)) from err
    except LoopError as err:  # what only the training stack checks (the GRPO overrides): named in the file too
        file = settings_file(args)
        raise UsageError(file.located(err, grpo_flags=set(grpo_overrides(args.grpo))) if file
                         else str(err)) from err


def _print_settings(args: argparse.Namespace) -> None:
    """`--print-settings`: the settings file of the run `--resume` names, else of the run these flags would make."""
    from storage.db import session
    from storage.models import Run

    if args.resume is not None:
        with session(engine_of(args.db)) as s:
            run = s.get(Run, args.resume)
        if run is None:
            raise UsageError(f"--resume {args.resume}: no such run")
        settings = run.settings
    else:
        settings = _new_settings(args)[1]
    print(settings_yaml(settings), end="")


def cmd_run(args: argparse.Namespace) -> None:
    """Without a terminal (a file, a pipe, a job scheduler's log) a run writes one line per stage and no
    progress bars; in a terminal a progress bar of stages runs below those lines."""
    from lab.jobs.worker import WorkerOptions, handlers, run_worker, visible_gpus, warm_children
    from lab.loop import LoopError, after_job, drive, resume, stages_of, switch_engineer
    from storage.db import session
    from storage.models import Run, RunStatus, StageStatus

    if args.print_settings:
        _print_settings(args)
        return
    quiet = not sys.stdout.isatty()
    if quiet:
        quiet_libraries()
    if args.base_url:
        try:
            allow_server(args.base_url)  # given on this machine's command line
        except LLMError as err:  # a password in it: never echoed, never stored
            raise UsageError(str(err)) from None
    made = None if args.resume is not None else _new_settings(args)  # a bad setting: nothing opened or started
    engine = engine_of(args.db)
    visible = visible_gpus()
    warm_children(engine, visible)  # its imports beside this process's own (a new run's settings import TRL here)
    with session(engine) as s:
        if made is None:
            run = s.get(Run, args.resume)
            if run is None:
                raise UsageError(f"--resume {args.resume}: no such run")
        else:
            run = _new_run(s, args, made, visible)
        stages, auto_apply = run.settings.stages, run.settings.auto_apply
    gpus = run_gpus(visible, run.settings.processes or 1)  # its worker launches as many as its stages were planned for
    if args.resume is not None:
        try:
            requeued = (switch_engineer(engine, run.id, args.engineer, args.backend or "") if args.engineer
                        else resume(engine, run.id))
        except LoopError as err:
            raise UsageError(str(err)) from err
        print(f"run {run.id}: resumed ({len(requeued)} jobs queued again)", flush=True)
    lab_handlers = handlers()  # only this run's jobs, each that loads a model in a child
    shown: set[int] = set()
    started, last = False, ""
    with tqdm(total=stages + 1, desc=f"run {run.id}", unit="stage", disable=quiet) as bar:
        say = (lambda line: print(line, flush=True)) if quiet else bar.write

        def on_state(state: Step) -> None:
            nonlocal started, last
            with session(engine) as s:
                done = [stage for stage in stages_of(s, run.id) if stage.status == StageStatus.DONE]
                lines = [stage_line(s, stage, stages) for stage in done if stage.index not in shown]
            if not started:  # a resumed run's stages done before are the bar's start
                start_bar_at(bar, len(done))
                started = True
            shown.update(stage.index for stage in done)
            for line in lines:
                say(line)
            bar.update(len(done) - bar.n)
            bar.set_postfix_str(state.text[:60])
            if state.status == RunStatus.WAITING and not auto_apply and state.text != last:
                say(f"{state.text}: decide in the web lab (envlab serve), or rerun with --auto-apply")
            last = state.text

        options = WorkerOptions(once=True, after=after_job, gpus=gpus, run_id=run.id)
        state = drive(engine, run.id, lambda: run_worker(engine, lab_handlers, options) > 0, on_state=on_state)
    print(f"run {run.id}: {state.text}", flush=True)
    if state.status in (RunStatus.FAILED, RunStatus.CANCELLED):
        raise UsageError(f"run {run.id} {state.text}; resume it with: envlab run --resume {run.id} "
                         "(add --engineer NAME to switch its engineer)")


def cmd_worker(args: argparse.Namespace) -> None:
    from lab.jobs.worker import run_from_args

    if args.slurm:
        cmd_worker_slurm(args)
        return
    raise SystemExit(run_from_args(args))


def cmd_worker_slurm(args: argparse.Namespace) -> None:
    """`envlab worker --slurm`: submit the workers as a Slurm job array and return (docs/worker.md)."""
    from lab.study.slurm import SlurmError, options_from_args, submit_workers
    from storage.db import RunsRootUnusable, database_url

    engine = engine_of(args.db)
    try:
        options = options_from_args(args)
        arrays, folder = submit_workers(engine, database_url(args.db), options)
    except (SlurmError, RunsRootUnusable) as err:
        raise UsageError(str(err)) from None
    print(f"slurm array {', '.join(arrays)}: {options.tasks or 1} worker task(s) ({options.describe()}); they exit "
          f"after {options.idle_exit:g} s with nothing to claim; logs in {folder}")


def cmd_export(args: argparse.Namespace) -> None:
    from lab.archive import ArchiveError, export_run

    try:
        out = export_run(engine_of(args.db), args.run, args.out, checkpoints=args.checkpoints)
    except ArchiveError as err:
        raise UsageError(str(err)) from err
    print(f"run {args.run} -> {out} ({out.stat().st_size / 1e6:.1f} MB)")


def cmd_import(args: argparse.Namespace) -> None:
    from lab.archive import ArchiveError, import_archive, read_manifest

    try:
        run = read_manifest(args.file)["run"]
        imported = import_archive(engine_of(args.db), args.file)
    except ArchiveError as err:
        raise UsageError(str(err)) from err
    print(f"{args.file}: run {run['uuid']} ({run['name']}) -> run {imported.run_id}{imported.note()}")


def cmd_push(args: argparse.Namespace) -> None:
    """`envlab push`: a trained stage's policy and its model card to the Hub (docs/archive.md), or, with --dry-run,
    only the folder that would go there."""
    from lab.archive.hub import PushError, commit_plan, upload, write_folder

    try:
        folder = write_folder(engine_of(args.db), args.run, args.stage, args.repo, args.with_notes, args.license)
        if args.dry_run:
            print(f"{folder}\n{commit_plan(folder, args.repo)}")
            return
        url = upload(folder, args.repo)
    except PushError as err:
        raise UsageError(str(err)) from None
    print(f"run {args.run} -> {url} (from {folder})")


def hub_repo(value: str) -> str:
    """ORG/NAME, as the Hub spells a model repo."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(value)
    except HFValidationError as err:
        raise argparse.ArgumentTypeError(str(err).splitlines()[0]) from None
    if value.count("/") != 1:
        raise argparse.ArgumentTypeError(f"{value!r}: expected ORG/NAME (a user or organisation, then the repo's name)")
    return value


def serve(argv: list[str]) -> NoReturn:
    """`envlab serve`: this process becomes `python -m lab.pages.web` (the web lab, which parses its own options:
    --host, --port, --auth-file, --db, --no-worker, --no-example). The page sits above the lab, so the lab starts it
    as a program, as the page starts `envlab worker`, instead of importing it; the process keeps its id, so
    signals reach the page. A taken port, a bad option and `--help` are answered here, before the page's imports."""
    from lab.cli.serve import EXAMPLE_PID, address, arguments, example_beside, logins, port_free, taken_message

    args = arguments().parse_args(argv)
    logins(args)  # a password on the command line, or a logins file others may read, is refused before the imports
    host, port = address(args.host, args.port)
    if not port_free(host, port):
        print(taken_message(port), file=sys.stderr)
        raise SystemExit(2)
    # The first line at once, whatever the output is (a terminal or a log file): the page's imports take seconds
    print(f"envlab serve: starting the web lab for http://{host}:{port} (loading its libraries; a new lab imports "
          "the example run meanwhile)", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    if not args.no_example:
        os.environ[EXAMPLE_PID] = str(example_beside(args.db))
    os.execv(sys.executable, [sys.executable, "-m", "lab.pages.web", *argv])


def run_arguments(sub: argparse._SubParsersAction) -> None:
    """`envlab run`'s options."""
    s = sub.add_parser("run", help="run stages headless: train, evaluate, propose, decide, repeat")
    settings_arguments(s)
    held = [name for name in engineer_names() if name not in engineer_names(alone=True)]
    s.add_argument("--engineer", help=f"{engineer_names_text(alone=True)} (default heuristic; with --resume: switch "
                                      "the run's engineer, e.g. after the llm engineer failed; "
                                      f"{' and '.join(held)} run as an experiment's arms only)")
    s.add_argument("--backend", help="the llm engineer's backend: hf:policy, hf:gemma3-270m, openai:<model>")
    s.add_argument("--policy", default="tiny", help="tiny, gemma3-270m, a checkpoint folder or a model name")
    s.add_argument("--config", type=Path, help="initial EnvConfig JSON (default: the round-0 config)")
    s.add_argument("--instances", type=MAX_BOARDS, help="training instances per stage")
    s.add_argument("--grpo", action="append", default=[], metavar="KEY=VALUE", help="a GRPOConfig field")
    s.add_argument("--scenario", help="a named start, assets/scenarios/NAME.json (default: the round-0 config)")
    s.add_argument("--name", default="run")
    s.add_argument("--seed", type=SEED, default=0)
    s.add_argument("--resume", type=int, metavar="RUN_ID", help="continue a run that was interrupted")
    s.add_argument("--print-settings", action="store_true",
                   help="write the run's settings as a settings file (--settings reads it back) and start nothing: "
                        "the run --resume names, else the one these flags would make")
    s.add_argument("--db", help="database path or URL (default: $ENVLAB_DB or runs/envlab.db)")
    s.set_defaults(fn=cmd_run)


def add_commands(sub: argparse._SubParsersAction) -> None:
    """`envlab run`, `worker`, `export`, `push` and `import` (`serve` is the page's: `main` hands it over unparsed)."""
    run_arguments(sub)

    s = sub.add_parser("worker", help="run queued jobs (training stages, evaluations, proposals)")
    from lab.jobs.worker import add_arguments

    add_arguments(s)
    from lab.study.slurm import add_arguments as slurm_arguments

    slurm_arguments(s)
    s.set_defaults(fn=cmd_worker)

    s = sub.add_parser("export", help="write a run (its rows, optionally its checkpoints) to one file")
    s.add_argument("run", type=int, metavar="RUN_ID")
    s.add_argument("--out", type=Path, required=True, help="the file to write, e.g. run-3.zip")
    s.add_argument("--checkpoints", action="store_true", help="include the checkpoint folders of its stages")
    s.add_argument("--db", help="database path or URL (default: $ENVLAB_DB or runs/envlab.db)")
    s.set_defaults(fn=cmd_export)

    s = sub.add_parser("push", help="upload a trained stage's policy, with a model card, to the Hugging Face Hub")
    s.add_argument("run", type=int, metavar="RUN_ID")
    s.add_argument("--stage", type=int, metavar="N", help="the stage to push (default: the run's last trained stage)")
    s.add_argument("--repo", type=hub_repo, required=True, metavar="ORG/NAME",
                   help="the Hub model repo (made if missing)")
    s.add_argument("--dry-run", action="store_true",
                   help="write the folder (checkpoint and README.md) and the commit that would upload it "
                        "(stage-N.commit.json beside it), print both paths, upload nothing")
    s.add_argument("--license", metavar="ID", help="the model card's license, a Hub license id such as apache-2.0 "
                                                    "(default: the base model's where the lab knows it, else other)")
    s.add_argument("--with-notes", action="store_true",
                   help="put who decided each proposal, their notes and this machine's paths in the model card (left "
                        "out by default: the card is public)")
    s.add_argument("--db", help="database path or URL (default: $ENVLAB_DB or runs/envlab.db)")
    s.set_defaults(fn=cmd_push)

    s = sub.add_parser("import", help="load a run exported by `envlab export` into this database, with new ids")
    s.add_argument("file", type=Path)
    s.add_argument("--db", help="database path or URL (default: $ENVLAB_DB or runs/envlab.db)")
    s.set_defaults(fn=cmd_import)
