"""The warm start's labels: made round by round over every (agents, size) cell, a pure function of the seed, resumed
where they stopped, refused in a folder of other settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envsim.solver import solve
from training.labels import Args, Shard, cells, label_shard, open_folder, plan, read_shards, run


def test_every_cell_of_two_to_five_agents_is_labelled_and_shards_go_round_by_round() -> None:
    assert len(cells()) == 8 + 8 + 7 + 6  # K agents on sizes max(3, K)..10
    shards = plan(boards=29 * 500, shard_boards=250)
    first_round = shards[:29]
    assert {(s.agents, s.size) for s in first_round} == set(cells()) and {s.index for s in first_round} == {0}
    assert [s.index for s in shards] == sorted(s.index for s in shards)  # a cut-short set is spread over every cell
    per_agents = {k: sum(1 for s in shards if s.agents == k) for k in (2, 3, 4, 5)}
    assert per_agents[5] > per_agents[2]  # most boards at the benchmark's counts


def test_a_shard_is_a_pure_function_of_its_seed_and_holds_solver_plans() -> None:
    shard = Shard(agents=4, size=5, index=0)
    boards = label_shard(shard, 6, seed=0)
    assert boards == label_shard(shard, 6, seed=0)
    assert boards != label_shard(shard, 6, seed=1)
    assert len(boards) == 6 and sum(b.needs_wait for b in boards) == 3  # half need a wait at 3+ agents
    assert all(b.num_agents == 4 and b.size == 5 for b in boards)
    assert all(solve(b).opt_soc == b.opt_soc for b in boards)
    assert sum(b.needs_wait for b in label_shard(Shard(2, 5, 0), 6, seed=0)) == 2  # a third at 2 agents


def test_labelling_resumes_where_it_stopped_and_refuses_other_settings(tmp_path: Path) -> None:
    args = Args(out=str(tmp_path / "labels"), boards=29, shard_boards=1, workers=2)
    folder = open_folder(args)
    (folder / ".a2-s03-0000.jsonl.gz.123.tmp").write_text("cut off")  # a shard cut off mid-write
    shards = plan(args.boards, args.shard_boards)
    assert len(shards) == 33  # a cell's boards rounded up to whole shards
    first = shards[:3]
    for shard in first:  # a run that stopped after three shards
        (folder / shard.name).write_bytes(b"")
    made = run(args)
    assert made == 33 - 3  # only the shards not on disk, each of one board
    assert not list(folder.glob(".*.tmp"))
    assert run(args) == 0
    boards = {shard.name: b for shard, b in read_shards(folder)}
    assert len(boards) == 33 and all(boards[s.name] == [] for s in first)
    assert json.loads((folder / "labels.json").read_text())["shard_boards"] == 1
    with pytest.raises(SystemExit, match=r"other settings \(boards, seed\)"):
        open_folder(Args(out=args.out, boards=58, shard_boards=1, seed=3))
