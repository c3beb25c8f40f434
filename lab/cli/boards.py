"""`envlab bench-suite`, `generate`, `score` and `show`: the testbed's boards on the command line, no database."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

from envsim.config import AGENT_RATIO, ConfigError, project
from envsim.generator import boards
from envsim.instance import Instance
from envsim.scoring import Outcome, score, score_answer
from envsim.suite import SUITE_SEED, VALIDATION_AGENTS, Entry, Split, boards_hash, build, report, write_jsonl
from lab.cli.common import WORKERS, UsageError, config_file
from lab.replay import sentence
from lab.settings import Count, validation_agents

if TYPE_CHECKING:
    from huggingface_hub import DatasetCard

GIF_WIDTH = Count(120, 3840, "a 4K screen's width; a slide needs no more", "a replay narrower than that is unreadable")
GENERATED = Count(1, 10_000_000, "about 10 hours of generating on one core at a few ms a board; split a larger "
                                 "set over several --seed values", "generate at least 1 board")


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


FORMATS = ("jsonl", "datasets")
DATASETS_DIR = "datasets"  # the `datasets` format's folder under --out
DATASET_CARD = "README.md"  # in that folder: its `huggingface_hub.DatasetCard`, each split's hash in its data


def cmd_bench_suite(args: argparse.Namespace) -> None:
    """Each split built and said with its boards' hash; written as it is built (`jsonl`), or all into one
    `datasets` folder at the end."""
    built: dict[str, list[Entry]] = {}
    for split in args.split:
        entries, stats = build(split, seed=args.seed, workers=args.workers, progress=True,
                               agents=args.validation_agents)
        built[split] = entries
        where = ""
        if args.format == "jsonl":
            write_jsonl(entries, args.out / f"{split}.jsonl")
            where = f" -> {args.out / f'{split}.jsonl'}"
        print(f"{split}: {stats['boards']} boards in {stats['seconds']:.1f} s{where} "
              f"(slowest board {stats['slowest_board']}: {stats['slowest_seconds'] * 1000:.0f} ms; "
              f"sha256 {boards_hash(entries)})")
    if args.format == "datasets":
        folder = save_datasets(built, args.out / DATASETS_DIR, seed=args.seed, agents=args.validation_agents)
        print(f"{', '.join(built)} -> {folder} (datasets.load_from_disk)")


def save_datasets(splits: dict[str, list[Entry]], folder: Path, *, seed: int = SUITE_SEED,
                  agents: tuple[int, ...] = VALIDATION_AGENTS) -> Path:
    """The splits as one Hugging Face `DatasetDict` saved to `folder` (a split a row per board, in table order:
    `split`, `subset` and the `instance` as a struct, `Entry.model_validate` reads a row back), with its dataset card
    beside it (`dataset_card`, in `DATASET_CARD`)."""
    try:
        from datasets import Dataset, DatasetDict
    except ImportError:
        raise UsageError("--format datasets needs the `datasets` library: pip install 'envlab[datasets]'") from None
    data = DatasetDict({split: Dataset.from_list([e.model_dump(mode="json") for e in entries])
                        for split, entries in splits.items()})
    data.save_to_disk(str(folder))
    dataset_card(splits, seed, agents).save(folder / DATASET_CARD)
    return folder


def _size_category(boards: int) -> str:
    """The Hub's size category of a dataset of `boards` rows."""
    bounds = [(1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K")]
    return next((name for bound, name in bounds if boards < bound), "100K<n<1M")


def dataset_card(splits: dict[str, list[Entry]], seed: int, agents: tuple[int, ...]) -> DatasetCard:
    """The boards' `huggingface_hub.DatasetCard`: its data names each split's boards hash (`boards_sha256`,
    `envsim.suite.boards_hash`: the sha256 of the split's JSONL in table order), the suite's seed and the validation
    set's agent counts, so the folder says which boards it holds wherever it is copied."""
    from huggingface_hub import DatasetCard, DatasetCardData

    hashes = {str(split): boards_hash(entries) for split, entries in splits.items()}
    data = DatasetCardData(pretty_name="MAPF-FrozenLake benchmark suite", task_categories=["text-generation"],
                           size_categories=[_size_category(sum(map(len, splits.values())))],
                           tags=["envlab", "mapf-frozenlake"], boards_sha256=hashes, suite_seed=seed,
                           validation_agents=list(agents))
    rows = [f"| {split} | {len(entries):,} | `{hashes[str(split)]}` |" for split, entries in splits.items()]
    text = "\n".join([
        "# MAPF-FrozenLake benchmark suite", "",
        "The boards of `envlab bench-suite`: a row per board in table order, its `split`, its wait `subset` and the "
        "`instance` (map, agents, goals and the solver's reference plan); `datasets.load_from_disk` loads the "
        "folder and `envsim.suite.Entry.model_validate` reads a row back.", "",
        "Each split's boards hash is the sha256 of its JSONL lines in table order (the file `envlab bench-suite` "
        "writes): a result and a split with the same hash were scored on the same boards.", "",
        "| split | boards | sha256 |", "| --- | --- | --- |", *rows, ""])
    return DatasetCard(f"---\n{data.to_yaml()}\n---\n\n{text}")


def cmd_generate(args: argparse.Namespace) -> None:
    """Boards are written as they are made (one line each), never held: a file appears whole at the end
    (written beside it and renamed), or not at all."""
    config = config_file(args.config)
    if args.agent_ratio is not None:
        try:
            config = project({**config.model_dump(), AGENT_RATIO: args.agent_ratio}, strict=True).config
        except ConfigError as err:
            raise UsageError(f"--agent-ratio {args.agent_ratio}: {err}") from err
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
    for i, (goal_row, goal_col) in enumerate(inst.goals):
        grid[goal_row][goal_col] = chr(ord("a") + i)
    for i, (agent_row, agent_col) in enumerate(positions):
        grid[agent_row][agent_col] = str(i)
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
        events = [sentence(e) for e in outcome.events if e.time == t]
        print(f"\nt={t}" + (f": {'; '.join(events)}" if events else ""))
        print(render_positions(inst, positions))
    print(f"\n{outcome.message}")
    if args.gif:
        from lab.replay import replay_gif

        path = replay_gif(inst, outcome, args.gif, width_px=args.gif_width, ghost=args.ghost)
        print(f"replay: {path} ({len(outcome.positions)} frames)")


def add_commands(sub: argparse._SubParsersAction) -> None:
    """`envlab bench-suite`, `generate`, `score` and `show`."""
    s = sub.add_parser("bench-suite", help="write the benchmark (3,150 boards) and validation (630) sets as JSONL "
                                           "or as a Hugging Face datasets folder, each with its boards' sha256")
    s.add_argument("--out", type=Path, default=Path("data/suite"))
    s.add_argument("--format", choices=FORMATS, default="jsonl",
                   help=f"jsonl: SPLIT.jsonl each; datasets: one folder OUT/{DATASETS_DIR} (datasets.load_from_disk) "
                        f"with its dataset card ({DATASET_CARD}, each split's hash in its data)")
    s.add_argument("--seed", type=int, default=SUITE_SEED)
    s.add_argument("--workers", type=WORKERS, default=2)
    splits = [Split.VALIDATION.value, Split.BENCHMARK.value]
    s.add_argument("--split", nargs="+", choices=splits, default=splits)
    s.add_argument("--validation-agents", type=validation_agents, default=VALIDATION_AGENTS, metavar="K,K,...",
                   help="the validation set's agent counts (default: the paper's, 3,4,5; 2 for the first set, 240 "
                        "boards)")
    s.set_defaults(fn=cmd_bench_suite)

    s = sub.add_parser("generate", help="generate labelled training boards from an EnvConfig JSON file")
    s.add_argument("--config", type=Path, help="EnvConfig JSON (default: the round-0 config)")
    s.add_argument("--n", type=GENERATED, help="number of boards (default: the config's num_instances)")
    s.add_argument("--agent-ratio", metavar="MIX", help="the agent counts' shares instead of the config's, e.g. "
                                                        "2=0.5,3=0.5 (or one count, e.g. 3)")
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
    s.add_argument("--gif-width", type=GIF_WIDTH, metavar="PX", help="the GIF about this wide (e.g. 480, 720, 960)")
    s.add_argument("--ghost", action="store_true", help="draw the solver's plan in the GIF too (rings)")
    s.set_defaults(fn=cmd_show)
