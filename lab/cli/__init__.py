"""The `envlab` command line: build the benchmark suite, generate, score and show instances; run the loop, workers
and experiments."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import sys
import warnings
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from tqdm import tqdm

from envsim.config import ConfigError, EnvConfig, project
from envsim.generator import GenerationError, boards
from envsim.instance import Instance
from envsim.scoring import Outcome, score, score_answer
from envsim.suite import SUITE_SEED, Entry, Split, build, dev_cells, report, write_jsonl
from lab.llm import allow_server
from lab.settings import MAX_BOARDS, SEED, Count, settings_arguments

if TYPE_CHECKING:
    from sqlmodel import Session

    from storage.models import Run, Stage


class UsageError(Exception):
    """Bad input on the command line or in a file; printed as one clear line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """argparse, with a bad option said in one line (`envlab run: argument --stages: ...`), exit status 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


# The bounds of the counts the command line takes beside a run's settings (lab.settings has those), each
# with why it is where it is.
GENERATED = Count(1, 10_000_000, "about 10 hours of generating on one core at a few ms a board; split a larger "
                                 "set over several --seed values", "generate at least 1 board")
SEEDS = Count(1, 100, "every seed is one more run of every arm", "an experiment runs at least 1 seed")
WORKERS = Count(1, 64, "each worker is a process that loads its own policy", "at least 1 worker")
THREADS = Count(1, 1024, "more torch threads than a machine has cores only slows it down", "at least 1 thread")


def read_instances(path: Path) -> list[Entry | Instance]:
    """JSONL rows that are suite entries (`envlab bench-suite`) or plain instances (`envlab generate`)."""
    if not path.exists():
        raise UsageError(f"{path}: no such file")
    rows: list[Entry | Instance] = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            rows.append(Entry.model_validate(data) if "instance" in data else Instance.model_validate(data))
        except (ValueError, TypeError) as err:
            raise UsageError(f"{path}:{n}: not an instance or suite row: {str(err).splitlines()[0]}") from err
    return rows


def _instance(row: Entry | Instance) -> Instance:
    return row.instance if isinstance(row, Entry) else row


def config_file(path: Path | None) -> EnvConfig:
    """The EnvConfig in a JSON file, checked strictly (the round-0 default without a file)."""
    if path is None:
        return EnvConfig.default()
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError as err:
        raise UsageError(f"{path}: no such file") from err
    except json.JSONDecodeError as err:
        raise UsageError(f"{path}: not JSON ({err})") from err
    try:
        return project(raw, strict=True).config
    except ConfigError as err:
        raise UsageError(f"{path}: {err}") from err


def cmd_bench_suite(args: argparse.Namespace) -> None:
    for split in args.split:
        entries, stats = build(split, seed=args.seed, workers=args.workers, progress=True)
        out = args.out / f"{split}.jsonl"
        write_jsonl(entries, out)
        print(f"{split}: {stats['boards']} boards in {stats['seconds']:.1f} s -> {out} "
              f"(slowest board {stats['slowest_board']}: {stats['slowest_seconds'] * 1000:.0f} ms)")


def cmd_generate(args: argparse.Namespace) -> None:
    """Boards are written as they are made (one line each), never held: a file appears whole at the end
    (written beside it and renamed), or not at all."""
    config = config_file(args.config)
    n = args.n if args.n is not None else config.num_instances
    part = args.out.with_name(args.out.name + ".part") if args.out else None
    written = 0
    try:
        if part is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
        with (part.open("w") if part is not None else contextlib.nullcontext(sys.stdout)) as out, \
                tqdm(total=n, desc="generate", unit="board") as bar:
            for board in boards(config, n, seed=args.seed):
                out.write(board.to_json() + "\n")
                written += 1
                bar.update()
        if part is not None:
            os.replace(part, args.out)
    except BaseException:
        if part is not None:
            part.unlink(missing_ok=True)
        raise
    if args.out:
        print(f"{written} boards -> {args.out}")


def read_answers(path: Path, rows: list[Entry | Instance]) -> list[str]:
    """Answers as JSONL `{"id": ..., "answer": ...}` (matched by instance id) or `{"answer": ...}` in order."""
    if not path.exists():
        raise UsageError(f"{path}: no such file")
    answers: list[dict] = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise UsageError(f"{path}:{n}: not JSON ({err})") from err
        if not isinstance(row, dict) or not isinstance(row.get("answer"), str):
            raise UsageError(f'{path}:{n}: each row needs an "answer" string')
        answers.append(row)
    if all("id" in a for a in answers):
        by_id = {a["id"]: a["answer"] for a in answers}
        missing = [_instance(r).id for r in rows if _instance(r).id not in by_id]
        if missing:
            raise UsageError(f"{path}: no answer for {len(missing)} instances (first: {missing[0]})")
        return [by_id[_instance(r).id] for r in rows]
    if len(answers) != len(rows):
        raise UsageError(f"{path}: {len(answers)} answers for {len(rows)} instances (give ids to match a subset)")
    return [a["answer"] for a in answers]


def cmd_score(args: argparse.Namespace) -> None:
    rows = read_instances(args.instances)
    answers = read_answers(args.answers, rows)
    outcomes: list[Outcome] = []
    out = args.out.open("w") if args.out else None
    for row, answer in tqdm(list(zip(rows, answers, strict=True)), desc="score", unit="episode", disable=None):
        inst = _instance(row)
        outcome = score_answer(inst, answer)
        outcomes.append(outcome)
        if out:
            out.write(json.dumps({"id": inst.id, **outcome.to_dict()}) + "\n")
    if out:
        out.close()
    n = len(outcomes)
    valid = sum(o.valid for o in outcomes)
    optimal = sum(o.optimal for o in outcomes)
    print(f"{n} episodes: valid {valid / max(n, 1):.1%}, optimal {optimal / max(n, 1):.1%}")
    for failure, n_failed in Counter(o.failure for o in outcomes if o.failure).most_common():
        print(f"  {failure}: {n_failed}")
    if rows and all(isinstance(r, Entry) for r in rows):
        print(report(rows, [o.valid for o in outcomes], [o.optimal for o in outcomes]).to_markdown())


def render_positions(inst: Instance, positions: tuple) -> str:
    """The board at one time step: agents as digits, holes `H`, goals `a, b, ...` where no agent stands."""
    grid = [list(row) for row in inst.rows()]
    for i, (r, c) in enumerate(inst.goals):
        grid[r][c] = chr(ord("a") + i)
    for i, (r, c) in enumerate(positions):
        grid[r][c] = str(i)
    return "\n".join("".join(row) for row in grid)


def cmd_show(args: argparse.Namespace) -> None:
    rows = read_instances(args.instances)
    if args.id:
        matches = [r for r in rows if _instance(r).id == args.id]
        if not matches:
            raise UsageError(f"{args.instances}: no instance with id {args.id}")
        inst = _instance(matches[0])
    else:
        if not 0 <= args.index < len(rows):
            raise UsageError(f"--index {args.index} is outside 0..{len(rows) - 1}")
        inst = _instance(rows[args.index])
    labels = (f"opt_soc {inst.opt_soc}, opt_makespan {inst.opt_makespan}, needs_wait {inst.needs_wait}"
              if inst.labelled else "unlabelled")
    print(f"instance {inst.id}: {inst.size}x{inst.size}, {inst.num_agents} agents, {len(inst.holes)} holes; {labels}")
    print(inst.picture())
    for i, (s, g) in enumerate(zip(inst.starts, inst.goals, strict=True)):
        print(f"agent {i} ({chr(ord('A') + i)} -> {chr(ord('a') + i)}): {s} -> {g}")
    if args.plan is None and not args.reference:
        if args.gif:
            raise UsageError("--gif replays a plan: give --plan or --reference")
        return
    if args.reference:
        if not inst.labelled:
            raise UsageError("this instance has no reference plan (it is unlabelled)")
        outcome = score(inst, inst.reference_plan)
    else:
        outcome = score_answer(inst, args.plan)
    for t, positions in enumerate(outcome.positions):
        events = [f"{e.type} (agents {', '.join(map(str, e.agents))})" for e in outcome.events if e.time == t]
        print(f"\nt={t}" + (f": {'; '.join(events)}" if events else ""))
        print(render_positions(inst, positions))
    print(f"\n{outcome.message}")
    if args.gif:
        from lab.replay import replay_gif

        path = replay_gif(inst, outcome, args.gif)
        print(f"replay: {path} ({len(outcome.positions)} frames)")


def _engine(db: str | None):
    """The migrated database of `--db`; a location that cannot be used is one line (exit 2), not a traceback."""
    from storage.db import DatabaseUnusable, open_database

    try:
        return open_database(db)
    except DatabaseUnusable as err:
        raise UsageError(str(err)) from None


def cmd_worker(args: argparse.Namespace) -> None:
    from lab.worker import run_from_args

    if args.slurm:
        cmd_worker_slurm(args)
        return
    raise SystemExit(run_from_args(args))


def cmd_worker_slurm(args: argparse.Namespace) -> None:
    """`envlab worker --slurm`: submit the workers as a Slurm job array and return (docs/worker.md)."""
    from lab.slurm import SlurmError, options_from_args, submit_workers
    from storage.db import RunsRootUnusable, database_url

    engine = _engine(args.db)
    try:
        options = options_from_args(args)
        arrays, folder = submit_workers(engine, database_url(args.db), options)
    except (SlurmError, RunsRootUnusable) as err:
        raise UsageError(str(err)) from None
    print(f"slurm array {', '.join(arrays)}: {options.tasks or 1} worker task(s) ({options.describe()}); they exit "
          f"after {options.idle_exit:g} s with nothing to claim; logs in {folder}")


def _grpo_overrides(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise UsageError(f"--grpo {pair!r}: give KEY=VALUE, e.g. --grpo max_steps=20")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def quiet_libraries() -> None:
    """For a run whose output goes to a file or a pipe: no progress bars from the libraries (transformers'
    weight loading and saving, datasets' maps) and no FutureWarning or DeprecationWarning that a library
    raises about itself or another library (ours still show)."""
    import datasets
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    datasets.disable_progress_bars()
    for category in (FutureWarning, DeprecationWarning):
        warnings.filterwarnings("ignore", category=category, module=r"(?!(envsim|lab|training|storage|app)\b)")


def duration(seconds: float) -> str:
    """`42s`, `1m 42s`, `2h 05m`."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    return f"{s // 60}m {s % 60:02d}s" if s < 3600 else f"{s // 3600}h {s % 3600 // 60:02d}m"


def stage_line(s: Session, stage: Stage, stages: int) -> str:
    """One line for a finished stage: its validation rates, how long it took, the valid rate per size."""
    from lab.results import stage_summaries

    summary = stage_summaries(s, stage.run_id, stage_index=stage.index)[stage.index]
    total = summary.pooled
    took = (duration((stage.finished_at - stage.started_at).total_seconds())
            if stage.started_at and stage.finished_at else "time unknown")
    sizes = " ".join(f"{size}:{t.valid_rate:.0%}" for size, t in sorted(summary.by_size.items()))
    return (f"stage {stage.index}/{stages} done: validation valid {total.valid_rate:.1%} "
            f"optimal {total.optimal_rate:.1%} ({took}; {total.episodes} boards, valid by size {sizes})")


def _initial(args: argparse.Namespace) -> tuple[EnvConfig, dict]:
    """The initial config and GRPO overrides of `--scenario`, `--config`, `--instances` and `--grpo` (each on
    top of the one before)."""
    from lab.experiments import ExperimentError, load_scenario

    try:
        scenario = load_scenario(args.scenario or "default")
    except ExperimentError as err:
        raise UsageError(str(err)) from err
    config = config_file(args.config) if args.config else scenario.config
    if args.instances is not None:
        config = config.model_copy(update={"num_instances": args.instances})
    return config, {**scenario.grpo, **_grpo_overrides(args.grpo)}


def _new_run(s: Session, args: argparse.Namespace) -> Run:
    from lab.loop import LoopError, create_run
    from lab.settings import RunSettings, SettingsError

    config, grpo = _initial(args)
    try:
        return create_run(s, name=args.name, config=config, settings=RunSettings.from_args(args, grpo=grpo),
                          policy=args.policy, engineer=args.engineer or "heuristic",
                          engineer_backend=args.backend or "", seed=args.seed)
    except (LoopError, SettingsError) as err:
        raise UsageError(str(err)) from err


def cmd_run(args: argparse.Namespace) -> None:
    """Without a terminal (a file, a pipe, a job scheduler's log) a run writes one line per stage and no
    progress bars; in a terminal a progress bar of stages runs below those lines."""
    from lab.loop import LoopError, after_job, drive, resume, stages_of, switch_engineer
    from lab.worker import handlers, run_worker, visible_gpus
    from storage.db import session
    from storage.models import Run, RunStatus, StageStatus

    quiet = not sys.stdout.isatty()
    if quiet:
        quiet_libraries()
    if args.base_url:
        allow_server(args.base_url)  # given on this machine's command line
    engine = _engine(args.db)
    with session(engine) as s:
        if args.resume is not None:
            run = s.get(Run, args.resume)
            if run is None:
                raise UsageError(f"--resume {args.resume}: no such run")
        else:
            run = _new_run(s, args)
        stages = run.settings["stages"]
    if args.resume is not None:
        try:
            requeued = (switch_engineer(engine, run.id, args.engineer, args.backend or "") if args.engineer
                        else resume(engine, run.id))
        except LoopError as err:
            raise UsageError(str(err)) from err
        print(f"run {run.id}: resumed ({len(requeued)} jobs queued again)", flush=True)
    lab_handlers, gpus = handlers(), visible_gpus()  # only this run's jobs, each that loads a model in a child
    shown: set[int] = set()
    last = ""
    with tqdm(total=stages + 1, desc=f"run {run.id}", unit="stage", disable=quiet) as bar:
        say = (lambda line: print(line, flush=True)) if quiet else bar.write

        def on_state(state: str) -> None:
            nonlocal last
            with session(engine) as s:
                done = [st for st in stages_of(s, run.id) if st.status == StageStatus.DONE]
                lines = [stage_line(s, st, stages) for st in done if st.index not in shown]
            shown.update(st.index for st in done)
            for line in lines:
                say(line)
            bar.update(len(done) - bar.n)
            bar.set_postfix_str(state[:60])
            if state.startswith(RunStatus.WAITING) and not args.auto_apply and state != last:
                say(f"{state}: decide in the web lab (envlab serve), or rerun with --auto-apply")
            last = state

        state = drive(engine, run.id, lambda: run_worker(engine, lab_handlers, once=True, after=after_job,
                                                         gpus=gpus, run_id=run.id) > 0, on_state=on_state)
    print(f"run {run.id}: {state}", flush=True)
    if state.startswith((RunStatus.FAILED, RunStatus.CANCELLED)):
        raise UsageError(f"run {run.id} {state}; resume it with: envlab run --resume {run.id} "
                         "(add --engineer NAME to switch its engineer)")


def cmd_export(args: argparse.Namespace) -> None:
    from lab.archive import ArchiveError, export_run

    try:
        out = export_run(_engine(args.db), args.run, args.out, checkpoints=args.checkpoints)
    except ArchiveError as err:
        raise UsageError(str(err)) from err
    print(f"run {args.run} -> {out} ({out.stat().st_size / 1e6:.1f} MB)")


def cmd_import(args: argparse.Namespace) -> None:
    from lab.archive import ArchiveError, import_archive, read_manifest

    try:
        run = read_manifest(args.file)["run"]
        imported = import_archive(_engine(args.db), args.file)
    except ArchiveError as err:
        raise UsageError(str(err)) from err
    print(f"{args.file}: run {run['uuid']} ({run['name']}) -> run {imported.run_id}{imported.note()}")


# ---------------------------------------------------------------- experiments


def cmd_experiment_new(args: argparse.Namespace) -> None:
    from lab.experiments import ExperimentError, create_experiment, experiment_runs
    from lab.settings import RunSettings, SettingsError

    if args.base_url:
        allow_server(args.base_url)  # given on this machine's command line
    engine = _engine(args.db)
    try:
        experiment = create_experiment(
            engine, name=args.name, arms=[a for a in args.arms.split(",") if a.strip()], seeds=args.seeds,
            settings=RunSettings.from_args(args, auto_apply=True, grpo=_grpo_overrides(args.grpo)),
            config=config_file(args.config) if args.config else None, scenario=args.scenario,
            instances=args.instances, policy=args.policy, description=args.description)
    except (ExperimentError, SettingsError) as err:
        raise UsageError(str(err)) from err
    st = experiment.settings
    runs = experiment_runs(engine, experiment.id)
    print(f"experiment {experiment.id} {experiment.name!r}: {len(runs)} runs queued ({len(experiment.arms)} arms x "
          f"{experiment.seeds} seeds), runs {runs[0].id}..{runs[-1].id}")
    dev = sum(c.count for c in dev_cells(st["dev_per_size"])) if st.get("dev_per_size") else 0
    print(f"each run: {st['stages']} stages x {st['instances']} boards x {st['steps_per_stage']} GRPO steps; "
          f"{st['validation_boards']} validation boards (the score) and {dev} dev boards (what the engineer reads) "
          "per stage")
    print(f"run it: envlab experiment run {experiment.name} [--workers K]")


def _progress_printer(engine, args: argparse.Namespace, bar: tqdm, say):
    """`on_progress` for `run_experiment`: moves the bar, says each stage that finished since the last call."""
    from lab.loop import stages_of
    from storage.db import session
    from storage.models import RunStatus, StageStatus

    shown: dict[int, int] | None = None

    def on_progress(p) -> None:
        nonlocal shown
        bar.total = p.total + (len(p.runs) if args.benchmark else 0)
        bar.update(p.done + (p.benchmarks_done if args.benchmark else 0) - bar.n)
        failed = p.count(RunStatus.FAILED) + p.count(RunStatus.CANCELLED)
        bar.set_postfix_str(f"{p.count(RunStatus.DONE)}/{len(p.runs)} runs done" + (f", {failed} stopped" if failed
                                                                                     else ""))
        if shown is None:
            shown = dict(p.stages_done)
            say(f"experiment {p.experiment.name}: {p.done} of {p.total} stages done already")
            return
        for run in p.runs:
            if p.stages_done[run.id] <= shown.get(run.id, 0):
                continue
            with session(engine) as s:
                done = [st for st in stages_of(s, run.id) if st.status == StageStatus.DONE]
                for st in done[shown.get(run.id, 0):]:
                    say(f"run {run.id} ({run.arm}, seed {run.seed}) {stage_line(s, st, run.settings['stages'])}")
            shown[run.id] = len(done)

    return on_progress


def cmd_experiment_run(args: argparse.Namespace) -> None:
    """One progress bar over runs x stages in a terminal; one line per finished stage otherwise."""
    from lab.experiments import ExperimentError, find_experiment, log_dir, run_experiment
    from storage.models import RunStatus

    quiet = not sys.stdout.isatty()
    engine = _engine(args.db)
    try:
        experiment = find_experiment(engine, args.experiment)
    except ExperimentError as err:
        raise UsageError(str(err)) from err
    if args.slurm:
        ended = _experiment_on_slurm(engine, args, experiment, quiet)
    else:
        print(f"experiment {experiment.name}: {args.workers} worker(s), logs in {log_dir(engine, experiment)}",
              flush=True)
        with tqdm(desc=f"experiment {experiment.name}", unit="stage", disable=quiet) as bar:
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


def _experiment_on_slurm(engine, args: argparse.Namespace, experiment, quiet: bool):
    """`envlab experiment run NAME --slurm`: the workers are the tasks of a Slurm job array (lab.slurm)."""
    from lab.experiments import ExperimentError
    from lab.slurm import SlurmError, options_from_args, run_on_slurm
    from storage.db import RunsRootUnusable, database_url

    if args.benchmark:
        raise UsageError("--benchmark is not run on Slurm yet: run `envlab experiment benchmark NAME` and a worker")
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
    from lab.experiments import ExperimentError
    from lab.slurm import status_lines

    try:
        print("\n".join(status_lines(_engine(args.db), args.experiment)))
    except ExperimentError as err:
        raise UsageError(str(err)) from err


def cmd_experiment_cancel(args: argparse.Namespace) -> None:
    """Cancel every run of an experiment that has not ended, and its Slurm arrays."""
    from lab.experiments import ExperimentError
    from lab.slurm import cancel_experiment

    try:
        lines = cancel_experiment(_engine(args.db), args.experiment)
    except ExperimentError as err:
        raise UsageError(str(err)) from err
    print("\n".join(lines) or f"experiment {args.experiment}: nothing to cancel, every run has ended")
    print(f"resume it: envlab experiment run {args.experiment}")


def cmd_experiment_add_arm(args: argparse.Namespace) -> None:
    from lab.experiments import ExperimentError, add_arms

    try:
        runs = add_arms(_engine(args.db), args.experiment, [a for a in args.arms.split(",") if a.strip()])
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
    from lab.experiments import ExperimentError, adopt_runs

    try:
        adopted = adopt_runs(_engine(args.db), args.experiment, args.source, args.arm, _seeds(args.seeds),
                             args.source_experiment)
    except ExperimentError as err:
        raise UsageError(str(err)) from err
    for theirs, run in adopted:
        print(f"{args.source} run {theirs} -> run {run.id}: {run.name}, arm {run.arm}, seed {run.seed}")
    print(f"experiment {args.experiment}: {len(adopted)} run(s) adopted as arm {args.arm!r}")


def cmd_experiment_list(args: argparse.Namespace) -> None:
    from lab.experiments import list_experiments
    from storage.models import RunStatus

    found = list_experiments(_engine(args.db))
    if not found:
        print("no experiments yet: envlab experiment new --name N --arms fixed,heuristic --seeds 3 --stages 3")
    for p in found:
        e = p.experiment
        states = ", ".join(f"{p.count(st)} {st}" for st in RunStatus if p.count(st))
        print(f"{e.id:>3} {e.name}: arms {', '.join(a['name'] for a in e.arms)}; {e.seeds} seeds; "
              f"{e.settings['stages']} stages; runs {states}; {p.done}/{p.total} stages done; "
              f"created {e.created_at:%Y-%m-%d %H:%M} UTC")


def cmd_experiment_report(args: argparse.Namespace) -> None:
    from lab.comparison import comparison, report_markdown, write_report
    from lab.experiments import ExperimentError, log_dir

    engine = _engine(args.db)
    try:
        c = comparison(engine, args.experiment)
    except ExperimentError as err:
        raise UsageError(str(err)) from err
    print(report_markdown(c))
    written = write_report(c, args.out or log_dir(engine, c.experiment) / "report")
    for what, where in written.items():
        print(f"{what}: {where}")


def cmd_experiment_benchmark(args: argparse.Namespace) -> None:
    from lab.experiments import ExperimentError, find_experiment, queue_benchmarks

    engine = _engine(args.db)
    try:
        lines = queue_benchmarks(engine, find_experiment(engine, args.experiment).id)
    except ExperimentError as err:
        raise UsageError(str(err)) from err
    print("\n".join(lines))
    print("a worker runs them (envlab worker, or envlab experiment run NAME --benchmark); the Leaderboard shows them")


def run_arguments(sub: argparse._SubParsersAction) -> None:
    """`envlab run`'s options."""
    s = sub.add_parser("run", help="run stages headless: train, evaluate, propose, decide, repeat")
    settings_arguments(s)
    s.add_argument("--engineer", help="fixed, random, heuristic, learnability, evidence or llm (default heuristic; "
                                      "with --resume: switch the run's engineer, e.g. after the llm engineer failed)")
    s.add_argument("--backend", help="the llm engineer's backend: hf:policy, hf:gemma3-270m, openai:<model>")
    s.add_argument("--policy", default="tiny", help="tiny, gemma3-270m, a checkpoint folder or a model name")
    s.add_argument("--config", type=Path, help="initial EnvConfig JSON (default: the round-0 config)")
    s.add_argument("--instances", type=MAX_BOARDS, help="training instances per stage")
    s.add_argument("--grpo", action="append", default=[], metavar="KEY=VALUE", help="a GRPOConfig field")
    s.add_argument("--scenario", help="a named start, assets/scenarios/NAME.json (default: the round-0 config)")
    s.add_argument("--name", default="run")
    s.add_argument("--seed", type=SEED, default=0)
    s.add_argument("--resume", type=int, metavar="RUN_ID", help="continue a run that was interrupted")
    s.add_argument("--db", help="database path or URL (default: $ENVLAB_DB or runs/envlab.db)")
    s.set_defaults(fn=cmd_run)


def experiment_arguments(sub: argparse._SubParsersAction) -> None:
    """`envlab experiment new|add-arm|run|list|report|benchmark` (docs/experiments.md)."""
    db = dict(help="database path or URL (default: $ENVLAB_DB or runs/envlab.db)")
    p = sub.add_parser("experiment", help="engineers compared at equal compute, with seeds (docs/experiments.md)")
    verbs = p.add_subparsers(dest="verb", required=True)
    s = verbs.add_parser("new", help="store an experiment and queue its runs (arms x seeds, auto-apply)")
    s.add_argument("--name", required=True)
    s.add_argument("--arms", required=True, help="comma-separated: fixed, random, heuristic, learnability, evidence, "
                                                 "llm:BACKEND@PRESET (e.g. llm:openai:MODEL@paper-best); NAME=SPEC "
                                                 "names one")
    s.add_argument("--seeds", type=SEEDS, default=3, help="seeds 0..N-1 for every arm (default 3)")
    settings_arguments(s, experiment=True)
    s.add_argument("--instances", type=MAX_BOARDS, help="training boards per stage (default: the scenario's, 512)")
    s.add_argument("--config", type=Path, help="initial EnvConfig JSON (default: the scenario's)")
    s.add_argument("--scenario", help="assets/scenarios/NAME.json: initial config and GRPO overrides "
                                      "(default: default, the round-0 config)")
    s.add_argument("--grpo", action="append", default=[], metavar="KEY=VALUE", help="a GRPOConfig field, for every run")
    s.add_argument("--policy", default="tiny")
    s.add_argument("--description", default="")
    s.add_argument("--db", **db)
    s.set_defaults(fn=cmd_experiment_new)
    s = verbs.add_parser("run", help="run (or resume) every run of an experiment until all are done")
    s.add_argument("experiment", help="name (or id)")
    s.add_argument("--workers", type=WORKERS, default=1, help="worker processes to start (default 1)")
    s.add_argument("--benchmark", action="store_true", help="then evaluate each run's last stage on the benchmark")
    s.add_argument("--threads", type=THREADS, metavar="N",
                   help="torch threads per worker (default: torch's choice; 1 is fastest for the tiny policy on a "
                        "busy small CPU)")
    s.add_argument("--db", **db)
    from lab.slurm import add_arguments as slurm_arguments

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
    s = verbs.add_parser("benchmark", help="queue the 3,150-board benchmark for each run's last stage")
    s.add_argument("experiment", help="name (or id)")
    s.add_argument("--db", **db)
    s.set_defaults(fn=cmd_experiment_benchmark)


def arguments() -> argparse.ArgumentParser:
    p = Parser(prog="envlab", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("bench-suite", help="write the benchmark (3,150 boards) and validation sets as JSONL")
    s.add_argument("--out", type=Path, default=Path("data/suite"))
    s.add_argument("--seed", type=int, default=SUITE_SEED)
    s.add_argument("--workers", type=WORKERS, default=2)
    splits = [Split.VALIDATION.value, Split.BENCHMARK.value]
    s.add_argument("--split", nargs="+", choices=splits, default=splits)
    s.set_defaults(fn=cmd_bench_suite)

    s = sub.add_parser("generate", help="generate labelled training boards from an EnvConfig JSON file")
    s.add_argument("--config", type=Path, help="EnvConfig JSON (default: the round-0 config)")
    s.add_argument("--n", type=GENERATED, help="number of boards (default: the config's num_instances)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", type=Path, help="JSONL file (default: standard output)")
    s.set_defaults(fn=cmd_generate)

    s = sub.add_parser("score", help="score answers against instances; print rates, failures and tables")
    s.add_argument("--instances", type=Path, required=True)
    s.add_argument("--answers", type=Path, required=True, help='JSONL rows {"id"?: ..., "answer": "..."}')
    s.add_argument("--out", type=Path, help="JSONL outcomes")
    s.set_defaults(fn=cmd_score)

    s = sub.add_parser("show", help="print a board, and step through a plan on it")
    s.add_argument("--instances", type=Path, required=True)
    s.add_argument("--index", type=int, default=0)
    s.add_argument("--id")
    s.add_argument("--plan", help='an answer, e.g. "Agent 0: R D\\nAgent 1: U"')
    s.add_argument("--reference", action="store_true", help="step through the solver's reference plan")
    s.add_argument("--gif", type=Path, metavar="FILE", help="also write the replay as an animated GIF (for slides)")
    s.set_defaults(fn=cmd_show)

    run_arguments(sub)

    s = sub.add_parser("worker", help="run queued jobs (training stages, evaluations, proposals)")
    from lab.worker import add_arguments

    add_arguments(s)
    from lab.slurm import add_arguments as slurm_arguments

    slurm_arguments(s)
    s.set_defaults(fn=cmd_worker)

    s = sub.add_parser("export", help="write a run (its rows, optionally its checkpoints) to one file")
    s.add_argument("run", type=int, metavar="RUN_ID")
    s.add_argument("--out", type=Path, required=True, help="the file to write, e.g. run-3.zip")
    s.add_argument("--checkpoints", action="store_true", help="include the checkpoint folders of its stages")
    s.add_argument("--db", help="database path or URL (default: $ENVLAB_DB or runs/envlab.db)")
    s.set_defaults(fn=cmd_export)

    s = sub.add_parser("import", help="load a run exported by `envlab export` into this database, with new ids")
    s.add_argument("file", type=Path)
    s.add_argument("--db", help="database path or URL (default: $ENVLAB_DB or runs/envlab.db)")
    s.set_defaults(fn=cmd_import)

    experiment_arguments(sub)

    sub.add_parser("serve", help="start the web lab and a worker beside it (envlab serve --help for options)")
    return p


def serve(argv: list[str]) -> NoReturn:
    """`envlab serve`: this process becomes `python -m app` (the web lab, which parses its own options:
    --host, --port, --auth, --db, --no-worker, --no-example). The page sits above the lab, so the lab starts it
    as a program, as the page starts `envlab worker`, instead of importing it; the process keeps its id, so
    signals reach the page."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "app", *argv])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        serve(argv[1:])
    try:
        args = arguments().parse_args(argv)
    except UsageError as err:
        print(err, file=sys.stderr)
        return 2
    try:
        args.fn(args)
    except (UsageError, GenerationError) as err:
        print(f"envlab {args.command}: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        where = f" writing {err.filename}" if err.filename else ""
        print(f"envlab {args.command}: the disk is full{where} ({err.strerror}): nothing was left half-written; "
              "free some space and run it again", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
