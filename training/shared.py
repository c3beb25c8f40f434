"""Shared evaluations: where several runs would answer the same boards with the same checkpoint in the same way,
one of them generates the answers and the others copy its episodes and stage metrics into their own stage.

Every run of an experiment starts from the same stage-0 checkpoint and evaluates it on the same validation and
dev boards; generating those answers once per run is the same work done again. An evaluation's `key` is a hash of
everything that determines its answers: the policy (its spec, and the size and modification time of every file
of its folder), the boards themselves (their JSON: so their agent counts, and a run whose `validation_agents`
differ evaluates other boards under another key), the settings that change how the policy answers
(`ANSWER_SETTINGS`), the seed where decoding samples (greedy decoding draws no random number), and where it runs
(vLLM or transformers, CPU or GPU: the same maths in another order can round a logit the other way). A key that
differs in anything is simply another evaluation. So the validation boards, every seed's, are answered once for
the whole experiment; a run whose dev boards are drawn per seed (`RunSettings.dev_per_seed`) shares its stage-0
dev evaluation only with the runs of its own seed (the other arms'), since another seed's dev boards hash to another
key; a run of an earlier version, whose dev boards every seed shares, shares them as it shares the validation set.

The `evaluations` table holds the claim: the first stage to insert a key's row without a source generates its
answers; a second one with the same key copies them once they are stored, and waits (heartbeating, cancellable)
while the first is alive (its stage running, its job's heartbeat fresh). A claim whose stage is dead is taken
over with one conditional UPDATE, so two waiters never both take it. A stage only waits while it holds no claim
it has not finished, so two workers never wait on each other. A claim whose episodes are gone (a snapshot that left
them out, keeping its per-size metrics: docs/results/study-6seed) is taken over the same way and generated again:
copying it would copy the metrics and no episode, and an engineer would read no dev board.

The copies are the episodes and per-size metrics as stored, row for row, so every page and report that reads a
run's stage 0 reads what it would have read had the run generated them itself.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path

from sqlalchemy import Engine, delete, func, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from envsim.instance import Instance
from envsim.suite import Split
from storage.db import session, stage_at
from storage.models import Episode, Evaluation, Job, JobKind, JobStatus, StageMetric, StageStatus, utcnow
from storage.queue import db_now, stale_after_s
from storage.settings import RunSettings
from training.progress import Cancelled, Progress

# A run's settings that change the answers of an evaluation (`storage.settings.RunSettings`): the chat template's
# thinking flag, the answer budget, greedy or sampled decoding. The boards are in the key as themselves.
ANSWER_SETTINGS = ("thinking", "completion_length", "validation_decoding")
WAIT_S = 1.0  # how often a stage waiting for another's evaluation looks again
FINGERPRINT_FILES = 10_000  # a policy folder of more files than this is fingerprinted by its spec alone


def policy_files(spec: str) -> str | None:
    """The folder that holds policy `spec` where it is one on disk (`training.resolve.resolve_policy`, which
    converts nothing and reads no weight); None for a hub name or a policy this machine cannot find."""
    from training.resolve import PolicyUnavailable, resolve_policy

    try:
        where = resolve_policy(spec)
    except PolicyUnavailable:
        return None
    return where if Path(where).is_dir() else None


def policy_fingerprint(folder: str | None) -> list[tuple[str, int, int]]:
    """Every file of a policy folder as (relative path, size, modification time in ns): a checkpoint saved again
    into the same folder is another policy. Empty for a hub name (no folder)."""
    if folder is None or not Path(folder).is_dir():
        return []
    root = Path(folder)
    files = sorted(p for p in root.rglob("*") if p.is_file())[:FINGERPRINT_FILES]
    return [(str(p.relative_to(root)), (st := p.stat()).st_size, st.st_mtime_ns) for p in files]


def answer_key(*, policy: str, folder: str | None, split: Split, boards: Sequence[Instance],
               settings: RunSettings | None, seed: int, engine: str, device: str) -> str:
    """The key of an evaluation: a hash of the canonical JSON of everything its answers depend on.

    `policy` is the spec the run names, `folder` where it lies on disk (None: a hub name), `seed` the seed
    sampled decoding draws from (left out of the key for greedy decoding, which draws none), `engine` the
    generator ("vllm" or "transformers") and `device` where it runs ("cpu", "cuda")."""
    answers = {k: getattr(settings, k) if settings is not None else RunSettings.model_fields[k].default
               for k in ANSWER_SETTINGS}
    sampled = answers["validation_decoding"] == "sampled"
    boards_hash = hashlib.sha256("\n".join(b.to_json() for b in boards).encode()).hexdigest()
    text = json.dumps({"policy": policy, "files": policy_fingerprint(folder), "split": str(split),
                       "boards": boards_hash, "answers": answers,
                       "seed": seed if sampled else None, "engine": engine, "device": device.split(":")[0]},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _owner(engine: Engine, key: str) -> Evaluation | None:
    with session(engine) as s:
        return s.exec(select(Evaluation).where(Evaluation.key == key, Evaluation.source_run_id.is_(None))).first()


def _claim(engine: Engine, key: str, run_id: int, stage_index: int, split: Split) -> bool:
    """Insert the key's generating row for this stage; False when another stage holds it already."""
    with session(engine) as s:
        s.add(Evaluation(key=key, run_id=run_id, stage_index=stage_index, split=split))
        try:
            s.commit()
            return True
        except IntegrityError:
            s.rollback()
            return False


def _forget_other_claims(engine: Engine, key: str, run_id: int, stage_index: int, split: Split) -> None:
    """Drop this stage's claims on `split` under another key: an earlier attempt's, made before something that
    determines the answers changed (the policy's files saved again). Nothing was stored under them."""
    with session(engine) as s:
        s.exec(delete(Evaluation).where(Evaluation.run_id == run_id, Evaluation.stage_index == stage_index,
                                        Evaluation.split == split, Evaluation.key != key))
        s.commit()


def _take_over(engine: Engine, dead: Evaluation, run_id: int, stage_index: int) -> bool:
    """Make a dead stage's claim this stage's; False when someone else took it (or it moved) first."""
    with session(engine) as s:
        moved = s.exec(update(Evaluation).where(
            Evaluation.id == dead.id, Evaluation.run_id == dead.run_id, Evaluation.stage_index == dead.stage_index,
            Evaluation.source_run_id.is_(None)).values(run_id=run_id, stage_index=stage_index, created_at=utcnow()))
        s.commit()
        return moved.rowcount == 1


def stored(engine: Engine, run_id: int, stage_index: int, split: Split) -> tuple[int, int]:
    """That stage's evaluation on `split` as stored: (the episodes its per-size metrics count, the episodes there).
    Its episodes commit batch by batch as they are scored and its metrics once every board is, so no metrics is one
    not stored whole yet (under way, or stopped part-way), and fewer episodes than the metrics count are episodes
    deleted since."""
    with session(engine) as s:
        counted = s.exec(select(func.sum(StageMetric.episodes)).where(
            StageMetric.run_id == run_id, StageMetric.stage_index == stage_index, StageMetric.split == split)).one()
        held = s.exec(select(func.count(Episode.id)).where(
            Episode.run_id == run_id, Episode.stage_index == stage_index, Episode.split == split)).one()
    return counted or 0, held


def alive(engine: Engine, run_id: int, stage_index: int) -> bool:
    """Whether that stage is being worked on: its row running and its stage job running with a fresh heartbeat
    (`storage.queue.stale_after_s`, the rule that reaps a dead worker's job)."""
    with session(engine) as s:
        stage = stage_at(s, run_id, stage_index)
        if stage is None or stage.status != StageStatus.RUNNING:
            return False
        job = s.exec(select(Job).where(Job.run_id == run_id, Job.kind == JobKind.STAGE, Job.target == stage_index,
                                       Job.status == JobStatus.RUNNING)).first()
        return job is not None and job.heartbeat_at is not None \
            and db_now(s) - job.heartbeat_at < timedelta(seconds=stale_after_s())


_OWN = {"id", "run_id", "stage_index"}  # the columns a copied row takes from the stage it is copied into


def copy_evaluation(engine: Engine, key: str, source: Evaluation, run_id: int, stage_index: int,
                    split: Split) -> int:
    """Copy the source's episodes and stage metrics on `split` into this stage, row for row, and record where
    they came from, in place of any episodes an earlier attempt of this stage stored part-way; one transaction.
    Returns the episodes copied."""
    with session(engine) as s:
        _drop_part_stored(s, run_id, stage_index, split)
        episodes = s.exec(select(Episode).where(Episode.run_id == source.run_id,
                                                Episode.stage_index == source.stage_index, Episode.split == split)
                          .order_by(Episode.id)).all()
        metrics = s.exec(select(StageMetric).where(StageMetric.run_id == source.run_id,
                                                   StageMetric.stage_index == source.stage_index,
                                                   StageMetric.split == split).order_by(StageMetric.size)).all()
        for row in [*episodes, *metrics]:
            s.add(type(row)(**{name: getattr(row, name) for name in type(row).model_fields if name not in _OWN},
                            run_id=run_id, stage_index=stage_index))
        s.add(Evaluation(key=key, run_id=run_id, stage_index=stage_index, split=split, source_run_id=source.run_id,
                         source_stage_index=source.stage_index))
        s.commit()
        return len(episodes)


def _drop_part_stored(s: Session, run_id: int, stage_index: int, split: Split) -> None:
    """Delete the episodes of that stage's evaluation on `split` stored part-way (no metrics yet), uncommitted."""
    if s.exec(select(StageMetric.id).where(StageMetric.run_id == run_id, StageMetric.stage_index == stage_index,
                                           StageMetric.split == split)).first() is None:
        s.exec(delete(Episode).where(Episode.run_id == run_id, Episode.stage_index == stage_index,
                                     Episode.split == split))


def evaluate_once(engine: Engine, key: str, run_id: int, stage_index: int, split: Split,
                  generate: Callable[[], None], progress: Progress, wait_s: float = WAIT_S) -> Evaluation | None:
    """Store this stage's evaluation on `split`: generated here (`generate()` answers the boards and stores them;
    returns None), or copied from the stage that evaluated the same key (returns that stage's claim). Waits while
    another live stage is generating the same answers; raises `Cancelled` when the job is cancelled meanwhile.

    Where this stage's earlier attempt held the key's claim, `generate` goes on from the episodes it stored; where
    this stage claims the key anew (or takes it over), episodes it stored part-way under another claim are dropped
    first: they may answer in another way."""
    _forget_other_claims(engine, key, run_id, stage_index, split)
    said, lost = False, 0
    while True:
        owner = _owner(engine, key)
        if owner is None:
            if _claim(engine, key, run_id, stage_index, split):
                _forget_part_stored(engine, run_id, stage_index, split)
                break
            lost += 1  # another stage claimed it between the two reads: the next read finds it
            if lost > 3:
                raise RuntimeError(f"cannot claim the {split} evaluation {key[:12]} of run {run_id}'s stage "
                                   f"{stage_index}, and no stage holds it")
            continue
        if (owner.run_id, owner.stage_index) == (run_id, stage_index):
            break  # an earlier attempt of this stage claimed it and died before storing
        counted, held = stored(engine, owner.run_id, owner.stage_index, split)
        if counted and held == counted:
            copy_evaluation(engine, key, owner, run_id, stage_index, split)
            return owner
        if counted or not alive(engine, owner.run_id, owner.stage_index):  # its episodes gone, or its stage dead
            if _take_over(engine, owner, run_id, stage_index):
                why = (f"evaluated the same {split} boards, but {held} of its {counted} episodes are stored (left out "
                       "of a snapshot?)" if counted else f"had claimed the same {split} evaluation and stopped")
                progress(0, None, f"run {owner.run_id}'s stage {owner.stage_index} {why}: generating it here")
                _forget_part_stored(engine, run_id, stage_index, split)
                break
            continue
        line = None if said else (f"waiting for run {owner.run_id}'s stage {owner.stage_index}, which is "
                                  f"evaluating the same policy on the same {split} boards: its answers are copied")
        said = True
        if progress(0, None, line):
            raise Cancelled(f"cancelled while waiting for run {owner.run_id}'s {split} evaluation")
        time.sleep(wait_s)
    generate()
    return None


def _forget_part_stored(engine: Engine, run_id: int, stage_index: int, split: Split) -> None:
    with session(engine) as s:
        _drop_part_stored(s, run_id, stage_index, split)
        s.commit()
