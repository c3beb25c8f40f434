"""Evaluation: a policy answers a set of boards (greedy or sampled, batched), envsim scores each answer, and the
episodes and their sums per (map size, agent count) go into the database.

Generation is the only costly part, so every board of a set is answered in length-sorted batches
(`Policy.generate`); scoring is exact and cheap. The same functions serve the per-stage validation
(called from the stage job), the warm start's progress report and the 3,150-board benchmark job.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, delete
from sqlmodel import Session, select

from envsim import suite
from envsim.instance import Instance
from envsim.parser import parse
from envsim.scoring import Outcome, Tally, score
from envsim.suite import Split
from storage.db import checkpoint_of, runs_root, session, stage_at
from storage.models import Episode, Job, Run, StageMetric
from storage.payloads import BenchmarkPayload
from storage.settings import DECODINGS
from training import vllm
from training.progress import Cancelled, Progress

if TYPE_CHECKING:  # torch loads only where a policy answers: the lab reads stored results without it
    from training.policy import Policy

BENCHMARK_FILE = "benchmark.jsonl"
# A validation set, per board count per size; a dev set (the shared one, or a run seed's), and the set it avoids. Each
# file's name is one of these and its agent counts (`set_file`): validation-120.jsonl,
# dev-30-beside-validation-120-agents-3-4-5.jsonl, dev-30-seed-2-beside-validation-120.jsonl.
VALIDATION_FILE = "validation-{per_size}"
DEV_FILE = "dev-{per_size}-beside-validation-{validation_per_size}"
SEED_DEV_FILE = "dev-{per_size}-seed-{draw}-beside-validation-{validation_per_size}"


@dataclass(frozen=True)
class EpisodeResult:
    """One board, the policy's completion and its scored outcome."""

    instance: Instance
    completion: str
    outcome: Outcome


def answer_budget(policy: Policy, instance: Instance) -> int:
    """New tokens enough for any sensible answer to `instance`.

    A compact answer line is `Agent i :`, the start cell, each action with the cell it leads to (2 tokens a
    move), then `<nl>`; solver plans on these boards stay under `3 * size` moves per agent, and generation
    stops at eos anyway, so the budget only bounds a babbling model. Chat models write words of several
    tokens and may reason first (`CHAT_BUDGET`). A run's `completion_length` (`Policy.completion_length`)
    replaces both, the same in training, validation, the benchmark and the probes.
    """
    if policy.completion_length:
        return policy.completion_length
    if policy.prompt_style == "compact":
        return instance.num_agents * (6 + 6 * instance.size)
    return CHAT_BUDGET


CHAT_BUDGET = 512  # a chat model's new tokens per answer when its run does not set `completion_length`


BATCH_SIZE = 64  # boards answered (and, in a stage, stored) together: a stop loses at most one batch's answers


def evaluate(policy: Policy, instances: Sequence[Instance], batch_size: int | None = None,
             max_new_tokens: int | None = None, progress: Callable[[int, int], bool] | None = None,
             decoding: str = "greedy", seed: int = 0, vllm_model: str | None = None,
             answered: Mapping[int, str] | None = None,
             on_batch: Callable[[list[EpisodeResult]], None] | None = None) -> list[EpisodeResult]:
    """Answers to `instances`, scored, in the same order: greedy, or `decoding="sampled"` as the model's own
    generation_config samples (its temperature, top-k and top-p; seeded by `seed`). With `vllm_model` (the
    policy's checkpoint folder) and vLLM installed on a GPU, vLLM writes the answers (`training.vllm`), from the
    same token ids; else transformers does.

    Boards are answered in full batches of similar prompt length (sorted by length, so little padding), each
    batch with the largest token budget of its boards (`BATCH_SIZE` boards unless `batch_size` says). Each batch
    answered is scored and handed to `on_batch` (a stage stores it there) before `progress(done, total)` is called;
    `progress` may return True to cancel (raises `Cancelled`).

    `answered`: completions an earlier attempt stored, by index into `instances` (`stored_answers`). The batches are
    the same whatever was answered (so are their seeds and paddings), and a batch whose every board is answered is
    skipped, so an evaluation that goes on after a stop returns exactly what one without the stop would; of a batch
    answered in part (a batch size changed since), only the boards not answered go to `on_batch`.
    """
    batch_size = batch_size or BATCH_SIZE
    answered = answered or {}
    if decoding not in DECODINGS:
        raise ValueError(f"decoding {decoding!r}: one of {', '.join(DECODINGS)}")
    sampled = decoding == "sampled"
    prompts = [policy.prompt(inst) for inst in instances]
    order = _by_length(prompts)
    completions = [answered.get(i, "") for i in range(len(instances))]
    engine = vllm.vllm_engine(vllm_model) if vllm_model is not None and vllm.available() \
        and len(answered) < len(instances) else None
    try:
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            if all(i in answered for i in chunk):  # scored and stored by an earlier attempt
                continue
            budget = max_new_tokens or max(answer_budget(policy, instances[i]) for i in chunk)
            if engine is not None:
                outs = vllm.generate_texts(engine, [policy.token_ids(prompts[i]) for i in chunk], budget,
                                           sampled=sampled, seed=seed + start,
                                           generation_config=policy.model.generation_config)
            else:
                outs = policy.generate([prompts[i] for i in chunk], max_new_tokens=budget, batch_size=batch_size,
                                       do_sample=sampled, temperature=None, seed=seed + start if sampled else None)
            for i, text in zip(chunk, outs, strict=True):
                completions[i] = answered.get(i, text)
            if on_batch is not None:
                on_batch([_scored(instances[i], completions[i]) for i in chunk if i not in answered])
            done = start + len(chunk)
            if progress is not None and progress(done, len(instances)):
                raise Cancelled(f"cancelled after {done} of {len(instances)} episodes")
    finally:  # its GPU memory goes back before training or the next evaluation starts an engine
        if engine is not None:
            vllm.stop_engine(engine)
            del engine
            vllm.free_memory()
    return [_scored(inst, text) for inst, text in zip(instances, completions, strict=True)]


def _scored(instance: Instance, completion: str) -> EpisodeResult:
    return EpisodeResult(instance, completion, score(instance, parse(completion, instance.num_agents)))


def _by_length(prompts: Sequence[str]) -> list[int]:
    return sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))


def answer_order(policy: Policy, instances: Sequence[Instance]) -> list[int]:
    """The order in which `evaluate` answers `instances` (indices): by prompt length, so that a batch pads little."""
    return _by_length([policy.prompt(inst) for inst in instances])


def size_metrics(results: Sequence[EpisodeResult]) -> dict[int, Tally]:
    """Per map size, smallest first: episodes, valid, optimal, and failures counted per type."""
    by_size: dict[int, list[Outcome]] = {}
    for r in results:
        by_size.setdefault(r.instance.size, []).append(r.outcome)
    return {size: Tally.of(outcomes) for size, outcomes in sorted(by_size.items())}


def cell_metrics(results: Sequence[EpisodeResult]) -> dict[tuple[int, int], Tally]:
    """Per (map size, agent count), in that order: what a `StageMetric` row holds."""
    by_cell: dict[tuple[int, int], list[Outcome]] = {}
    for r in results:
        by_cell.setdefault((r.instance.size, r.instance.num_agents), []).append(r.outcome)
    return {cell: Tally.of(outcomes) for cell, outcomes in sorted(by_cell.items())}


def metrics_table(metrics: dict[int, Tally]) -> str:
    """A short text table of valid and optimal rates per size (for logs)."""
    lines = ["size  n    valid  optimal  top failure"]
    for s, m in metrics.items():
        top = max(m.failures.items(), key=lambda kv: kv[1], default=("-", 0))
        lines.append(f"{s:>4} {m.episodes:>3} {m.valid_rate:>7.1%} {m.optimal_rate:>8.1%}  {top[0]} ({top[1]})")
    return "\n".join(lines)


def tally_of(metric: StageMetric) -> Tally:
    """A stored metric row (one size, one agent count) as counts (its rates are `Tally`'s, docs/results.md)."""
    return Tally(metric.episodes, metric.valid, metric.optimal, dict(metric.failures))


def summed(metrics: Iterable[StageMetric]) -> dict[int, Tally]:
    """Stored metric rows summed per map size over agent counts, smallest first; a size of one row is that row's
    tally as it is (boards of one agent count read exactly as they did when a row held a whole size)."""
    groups: dict[int, list[Tally]] = {}
    for m in metrics:
        groups.setdefault(m.size, []).append(tally_of(m))
    return {size: tallies[0] if len(tallies) == 1 else Tally.total(tallies) for size, tallies in sorted(groups.items())}


def store_evaluation(session: Session, run_id: int, stage_index: int, split: Split,
                     results: Sequence[EpisodeResult], subsets: Sequence[float] | None = None) -> None:
    """Write one Episode row per result and one StageMetric row per (size, agent count), then commit.

    `subsets` gives each benchmark board's wait subset (same order as `results`), for the leaderboard.

    An evaluation is stored once per (run, stage, split): the StageMetric rows are UNIQUE on that key, so
    storing the same evaluation twice fails instead of double-counting.
    """
    _add_episodes(session, run_id, stage_index, split, results, subsets)
    _add_metrics(session, run_id, stage_index, split, results)
    session.commit()


def store_episodes(session: Session, run_id: int, stage_index: int, split: Split,
                   results: Sequence[EpisodeResult]) -> None:
    """One batch of an evaluation's Episode rows, committed as it is scored: a stop or a full disk loses at most
    the batch under way, and the next attempt goes on from the boards stored (`stored_answers`). The evaluation is
    stored whole once every board is (`store_whole`)."""
    _add_episodes(session, run_id, stage_index, split, results)
    session.commit()


def store_whole(session: Session, run_id: int, stage_index: int, split: Split,
                results: Sequence[EpisodeResult]) -> None:
    """An evaluation whose batches `store_episodes` stored, stored whole in one transaction: its episodes again, in
    the order of its boards (`results`: every board, as `evaluate` returns them) where the batches held them in the
    order they were answered, and its metrics. An evaluation with metrics is stored whole, one without is under way
    or stopped; a reader of a whole one finds its episodes as `store_evaluation` writes them."""
    session.exec(delete(Episode).where(Episode.run_id == run_id, Episode.stage_index == stage_index,
                                       Episode.split == split))
    store_evaluation(session, run_id, stage_index, split, results)


def stored_answers(session: Session, run_id: int, stage_index: int, split: Split, boards: Sequence[Instance],
                   order: Sequence[int]) -> dict[int, str]:
    """The completions an earlier attempt stored batch by batch for `boards` on `split`, by index into `boards`
    (`evaluate`'s `answered`; `order`: `answer_order`'s). Batches are stored in the order they are answered, so the
    rows, oldest first, are the boards that order begins with; rows that are not (stored for another set of boards,
    or by a policy that orders them otherwise) are deleted, and the evaluation starts from its first board."""
    rows = session.exec(select(Episode).where(Episode.run_id == run_id, Episode.stage_index == stage_index,
                                              Episode.split == split).order_by(Episode.id)).all()
    if [row.instance_id for row in rows] == [boards[i].id for i in order[:len(rows)]]:
        return {i: row.completion for i, row in zip(order[:len(rows)], rows, strict=True)}
    for row in rows:
        session.delete(row)
    session.commit()
    return {}


def _add_episodes(session: Session, run_id: int, stage_index: int, split: Split, results: Sequence[EpisodeResult],
                  subsets: Sequence[float] | None = None) -> None:
    for i, r in enumerate(results):
        parsed = parse(r.completion, r.instance.num_agents)
        session.add(Episode(
            run_id=run_id, stage_index=stage_index, split=split, instance_id=r.instance.id,
            instance=r.instance.model_dump(mode="json"), size=r.instance.size, num_agents=r.instance.num_agents,
            completion=r.completion, plan=None if parsed.plan is None else [list(a) for a in parsed.plan],
            outcome=r.outcome.to_dict(), valid=r.outcome.valid, optimal=r.outcome.optimal,
            failure=None if r.outcome.failure is None else r.outcome.failure.value,
            subset=None if subsets is None else subsets[i]))


def _add_metrics(session: Session, run_id: int, stage_index: int, split: Split,
                 results: Sequence[EpisodeResult]) -> None:
    for (size, agents), m in cell_metrics(results).items():
        session.add(StageMetric(run_id=run_id, stage_index=stage_index, split=split, size=size, agents=agents,
                                episodes=m.episodes, valid=m.valid, optimal=m.optimal, failures=m.failures))


def validation_entries(cache_dir: Path, per_size: int, agents: Sequence[int] = suite.VALIDATION_AGENTS,
                       on_part: Callable[[int, int], None] | None = None) -> list[suite.Entry]:
    """A validation set of `per_size` boards per (agent count, map size) for the counts `agents`
    (`envsim.suite.validation_cells`), built once and cached as JSONL in `cache_dir` (the runs root): every stage's
    process reads it there (the standard 240 take seconds of solver time on a loaded machine, the file
    milliseconds). `on_part(done, total)`: told the boards made so far while it is built (not when it is read)."""
    return _cached(cache_dir / set_file(VALIDATION_FILE.format(per_size=per_size), agents),
                   lambda: suite.build(Split.VALIDATION, per_size=per_size, agents=agents, on_part=on_part)[0])


def dev_entries(cache_dir: Path, per_size: int, validation_per_size: int = suite.VALIDATION_PER_SIZE,
                agents: Sequence[int] = suite.VALIDATION_AGENTS, draw: int | None = None,
                on_part: Callable[[int, int], None] | None = None) -> list[suite.Entry]:
    """The dev boards, `per_size` per (agent count, map size), none of them among the validation set of
    `validation_per_size` per (count, size) beside them (`envsim.suite.dev_entries`), drawn for run seed `draw` (None:
    the set every seed shares), built once and cached as JSONL in `cache_dir` beside it; `on_part` as for
    `validation_entries`."""
    stem = (DEV_FILE if draw is None else SEED_DEV_FILE).format(per_size=per_size, draw=draw,
                                                                 validation_per_size=validation_per_size)
    return _cached(cache_dir / set_file(stem, agents), lambda: suite.dev_entries(
        per_size, [e.instance for e in validation_entries(cache_dir, validation_per_size, agents)], agents=agents,
        draw=draw, on_part=on_part))


def set_file(stem: str, agents: Sequence[int]) -> str:
    """A cached set's file name: `stem.jsonl` for the 2-agent sets (the names they were cached under before other
    counts existed), `stem-agents-3-4-5.jsonl` for counts 3, 4, 5: a set of other counts is never read for them."""
    counts = tuple(agents)
    return stem + ("" if counts == suite.FIRST_AGENTS else "-agents-" + "-".join(map(str, counts))) + ".jsonl"


CACHE_SETTING = "ENVLAB_CACHE"  # the machine's cache folder (default ~/.cache/envlab; empty: no machine cache)


@functools.cache
def envsim_fingerprint() -> str:
    """A hash of envsim's source: a set cached by one version of the generator and solver is never read by another."""
    digest = hashlib.sha256()
    for source in sorted(Path(suite.__file__).parent.glob("*.py")):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()[:16]


def boards_cache() -> Path | None:
    """Where this machine keeps the board sets it has built, for every runs root and every test's:
    `$ENVLAB_CACHE/boards/<envsim_fingerprint()>` (default `~/.cache/envlab`, or `$XDG_CACHE_HOME/envlab`); None
    where `$ENVLAB_CACHE` is set empty or the folder cannot be made."""
    base = os.environ.get(CACHE_SETTING)
    if base == "":
        return None
    if base is None:
        base = os.path.join(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "envlab")
    where = Path(base).expanduser() / "boards" / envsim_fingerprint()
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return where


@contextmanager
def _locked(folder: Path, name: str) -> Iterator[None]:
    """Hold `folder/name.lock` (an exclusive flock): two processes that need the same set build it once."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write(entries: list[suite.Entry], path: Path) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp")  # written whole, then renamed: no reader sees half a set
    suite.write_jsonl(entries, tmp)
    tmp.replace(path)


def _cached(path: Path, build: Callable[[], list[suite.Entry]]) -> list[suite.Entry]:
    """The set in `path` (a runs root's copy), else the machine's copy (`boards_cache`) copied there, else `build()`
    written to both. One process builds a set while the others needing it wait; a machine copy that does not read
    as suite rows is built again."""
    if path.is_file():
        return suite.read_jsonl(path)
    machine = boards_cache()
    with _locked(machine or path.parent, path.name):
        if path.is_file():  # another process made it while this one waited
            return suite.read_jsonl(path)
        entries = None
        if machine is not None and (machine / path.name).is_file():
            try:
                entries = suite.read_jsonl(machine / path.name)
            except ValueError as err:
                logging.getLogger(__name__).warning("building again: %s", err)
        if entries is None:
            entries = build()
            if machine is not None:
                _write(entries, machine / path.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        _write(entries, path)
    return entries


def benchmark_entries(run_dir: Path) -> list[suite.Entry]:
    """The 3,150 benchmark boards, built once (a few minutes of solver time) and cached as JSONL in `run_dir` and
    in the machine's cache (`_cached`)."""
    return _cached(run_dir / BENCHMARK_FILE, lambda: suite.build(Split.BENCHMARK)[0])


def run_benchmark_job(engine: Engine, job: Job, progress: Progress) -> dict[str, Any]:
    """Job `benchmark` (docs/loop.md): evaluate a stage's checkpoint on the benchmark and store the episodes.

    The stage row's `checkpoint` names the policy; a stage without one (stage 0 before it ran) falls back
    to the run's starting policy. Returns the paper's tables: valid and optimal rate per (agents, size).
    """
    payload = BenchmarkPayload.of(job)
    run_id, stage_index = payload.run_id, payload.stage_index
    with session(engine) as s:
        run = s.get(Run, run_id)
        stage = stage_at(s, run_id, stage_index)
        if run is None or stage is None:
            raise ValueError(f"run {run_id} has no stage {stage_index}")
        spec = checkpoint_of(engine, stage) or run.policy
    cache = runs_root(engine)  # the boards are the same for every run: one cache per runs root
    cache.mkdir(parents=True, exist_ok=True)
    progress(0, None, f"building or reading the benchmark boards in {cache / BENCHMARK_FILE}")
    entries = benchmark_entries(cache)
    from training.policy import load_policy, local_device, policy_folder

    policy = load_policy(spec, device=local_device()).configured(run.settings)
    progress(0, len(entries), f"evaluating {spec} on {len(entries)} benchmark boards")
    results = evaluate(policy, [e.instance for e in entries], progress=lambda done, total: progress(done, total),
                       decoding=run.settings.validation_decoding or "greedy", seed=run.seed,
                       vllm_model=policy_folder(spec) if vllm.available() else None)
    with session(engine) as s:
        store_evaluation(s, run_id, stage_index, Split.BENCHMARK, results, [e.subset for e in entries])
    table = suite.report(entries, [r.outcome.valid for r in results], [r.outcome.optimal for r in results])
    progress(len(entries), len(entries), table.to_markdown())
    return {
        "checkpoint": spec, "episodes": len(results),
        "valid": sum(r.outcome.valid for r in results), "optimal": sum(r.outcome.optimal for r in results),
        "by_size": {f"{k}x{s}": {"valid": v[0], "optimal": v[1], "n": v[2]} for (k, s), v in table.by_size.items()},
        "mean_over_sizes": {str(k): {"valid": v[0], "optimal": v[1]} for k, v in table.mean_over_sizes.items()},
    }
