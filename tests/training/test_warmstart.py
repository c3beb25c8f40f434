"""The warm start, run end to end for a handful of steps on real labels: it never trains on a held-out board, it
learns (the loss falls), it is a pure function of its seed, it resumes to the run an unbroken one makes, and it
writes a checkpoint that `load_policy` reads back as a compact policy."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
import torch

from envsim.prompts import compact_answer
from envsim.suite import DEV_PER_SIZE, Split, build_cell, cells, dev_entries, validation_cells
from training.labels import Args as LabelArgs
from training.labels import Shard, open_folder, plan, run, write_shard
from training.policy import load_policy
from training.tokenizer import compact_text
from training.warmstart import (
    HELD_OUT_RECIPE,
    Args,
    cell_weights,
    held_out_ids,
    load_labels,
    step_batch,
    train,
)

SHAPE = ("hidden_size=32,intermediate_size=64,num_hidden_layers=2,num_attention_heads=2,num_key_value_heads=2,"
         "head_dim=16")


@pytest.fixture(scope="module")
def labels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("labels") / "labels"
    run(LabelArgs(out=str(folder), boards=29 * 8, shard_boards=8, workers=2))
    # these tests' boards are checked against the real sets below: a cache of today's recipe that holds none
    (folder / "held-out.json").write_text(json.dumps({"recipe": {**HELD_OUT_RECIPE, "sizes": None}, "ids": []}))
    return folder


@pytest.fixture(scope="module")
def held_out_3(tmp_path_factory: pytest.TempPathFactory) -> tuple[frozenset[str], Path]:
    """The held-out set at size 3 (the tests' cheap subset), made once, through a stale cache: the older bare list,
    which is made anew whatever it holds."""
    cache = tmp_path_factory.mktemp("held-out") / "held-out.json"
    cache.write_text(json.dumps(["a-board-id"]))
    return held_out_ids(cache, sizes={3}), cache


def test_no_held_out_board_is_trained_on(tmp_path: Path, held_out_3) -> None:
    held_out, _ = held_out_3
    benchmark = [e.instance for c in cells(Split.BENCHMARK) if c.size == 3 for e in build_cell(c)[0]]
    validation = [e.instance for c in cells(Split.VALIDATION, agents=(2, 3)) if c.size == 3
                  for e in build_cell(c)[0]]
    paper = [e.instance for c in validation_cells(120, (3, 4, 5)) if c.size == 3 for e in build_cell(c)[0]]
    assert len(paper) == 120  # `--validation-agents 3,4,5` at 120 per size: at 3x3 only 3 agents fit
    assert {b.id for b in benchmark + validation + paper} <= held_out
    folder = tmp_path / "labels"
    args = LabelArgs(out=str(folder), boards=29 * 60, shard_boards=60)
    run_cells = [s for s in plan(args.boards, args.shard_boards) if s.size == 3]
    open_folder(args)
    for shard in run_cells:
        write_shard(folder, shard, args.shard_boards, args.seed)
    planted = Shard(agents=3, size=3, index=0)
    with gzip.open(folder / planted.name, "at") as f:  # a benchmark board among the labels
        f.write(benchmark[0].model_dump_json() + "\n")
    data, dropped = load_labels(folder, held_out)
    kept = {b.id for boards in data.values() for b in boards}
    assert not kept & held_out
    assert dropped >= 2  # the planted board and at least one real draw: 3x3 boards repeat, the filter is needed


def test_each_seed_s_own_dev_boards_are_held_out_and_a_stale_cache_is_made_anew(held_out_3) -> None:
    held_out, cache = held_out_3
    beside = [e.instance for c in validation_cells(30, (2,)) for e in build_cell(c)[0]]
    own = {e.instance.id for e in dev_entries(DEV_PER_SIZE, beside, agents=(2,), draw=7) if e.instance.size == 3}
    assert len(own) == DEV_PER_SIZE and own <= held_out and "a-board-id" not in held_out
    assert json.loads(cache.read_text()) == {"recipe": {**HELD_OUT_RECIPE, "sizes": [3]}, "ids": sorted(held_out)}
    cache.write_text(json.dumps({"recipe": {**HELD_OUT_RECIPE, "sizes": [3]}, "ids": ["x"]}))
    assert held_out_ids(cache, sizes={3}) == frozenset({"x"})  # a cache of this recipe is read as it is
    # another recipe (here no size at all, so that it is made at once): made anew, and cached in its own recipe
    assert held_out_ids(cache, sizes=set()) == frozenset()
    assert json.loads(cache.read_text()) == {"recipe": {**HELD_OUT_RECIPE, "sizes": []}, "ids": []}


def test_the_curriculum_opens_agents_and_sizes(labels: Path) -> None:
    data, _ = load_labels(labels, frozenset())
    start = cell_weights(data, 0.0, open_at=0.3)
    assert set(start) == {(k, s) for k in (2, 3) for s in (3, 4, 5)}
    assert set(cell_weights(data, 0.3, open_at=0.3)) == set(data)
    assert abs(sum(start.values()) - 1) < 1e-12
    args = Args(labels=str(labels), batch_size=4, steps=100)
    cell, boards = step_batch(data, args, 7)
    assert (cell, boards) == step_batch(data, args, 7)
    assert {(b.num_agents, b.size) for b in boards} == {cell} and len(boards) == 4


def test_a_few_steps_lower_the_loss_resume_exactly_and_write_a_checkpoint(labels: Path, tmp_path: Path) -> None:
    args = Args(labels=str(labels), out=str(tmp_path / "tiny"), steps=6, batch_size=8, lr=3e-3, warmup=1,
                eval_every=0, shape=SHAPE, open_at=0.0)
    policy, losses = train(args)
    assert len(losses) == 6
    assert losses[0] > 6.5 and losses[-1] < losses[0] - 0.5  # ln(1057) = 6.96 at the start
    shutil.rmtree(f"{args.out}.state")
    again = Args(**{**vars(args), "out": str(tmp_path / "again"), "minutes": 1e-9})
    assert len(train(again)[1]) == 1  # stopped after one step, its state saved
    _, resumed = train(Args(**{**vars(again), "minutes": 0.0}))
    assert resumed == losses  # the same seed, the same run, stopped or not
    kept = Args(**{**vars(args), "out": str(tmp_path / "kept"), "stop_at": 4})
    assert len(train(kept)[1]) == 4  # a checkpoint on the way, kept: the run stops after step 4, its state saved
    assert train(Args(**{**vars(kept), "stop_at": 0}))[1] == losses
    first, second = load_policy(args.out), load_policy(again.out)
    assert all(torch.equal(a, b) for a, b in zip(first.model.parameters(), second.model.parameters(), strict=True))
    assert first.prompt_style == "compact"
    data, _ = load_labels(labels, frozenset())
    board = data[(5, 10)][0]
    answer = compact_text(compact_answer(board.reference_plan, board))
    assert first.tokenizer.decode(first.tokenizer(answer)["input_ids"]) == answer


def test_a_warm_start_on_some_agent_counts_trains_and_says_only_those(labels: Path, tmp_path: Path) -> None:
    args = Args(labels=str(labels), out=str(tmp_path / "two-three"), steps=3, batch_size=4, warmup=1, eval_every=0,
                shape=SHAPE, open_at=0.0, agents="2,3")
    policy, losses = train(args)
    assert len(losses) == 3 and policy.trained_agents == (2, 3)
    assert load_policy(args.out).trained_agents == (2, 3)
