"""The warm start, run end to end for a handful of steps: it learns (the loss falls), it is a pure function of
its seed, and it writes a checkpoint that `load_policy` reads back as a compact policy."""

from __future__ import annotations

from pathlib import Path

from envsim.prompts import compact_answer
from training.policy import load_policy
from training.tokenizer import compact_text
from training.warmstart import Args, size_weights, step_boards, train

SHAPE = ("hidden_size=32,intermediate_size=64,num_hidden_layers=2,num_attention_heads=2,num_key_value_heads=2,"
         "head_dim=16")


def test_curriculum_opens_sizes_in_order() -> None:
    assert list(size_weights(0.0, open_at=0.3)) == [3, 4, 5]
    assert list(size_weights(0.15, open_at=0.3)) == [3, 4, 5, 6, 7]
    assert list(size_weights(0.5, open_at=0.3)) == [3, 4, 5, 6, 7, 8, 9, 10]
    assert abs(sum(size_weights(0.5, open_at=0.3).values()) - 1) < 1e-12


def test_step_boards_are_a_pure_function_of_seed_and_step() -> None:
    args = Args(batch_size=6, steps=100)
    size, boards = step_boards(args, 3, 0.5)
    assert (size, boards) == step_boards(args, 3, 0.5)
    assert {b.size for b in boards} == {size} and all(b.num_agents == 2 for b in boards)
    assert sum(b.needs_wait for b in boards) == 2  # a third of the batch needs a wait
    assert step_boards(Args(batch_size=6, steps=100, seed=1), 3, 0.5)[1] != boards


def test_a_few_steps_lower_the_loss_and_write_a_checkpoint(tmp_path: Path) -> None:
    args = Args(out=str(tmp_path / "tiny"), steps=6, batch_size=8, lr=3e-3, warmup=1, eval_every=0, shape=SHAPE)
    policy, losses = train(args)
    assert len(losses) == 6
    assert losses[0] > 3.3 and losses[-1] < losses[0] - 0.4  # ln(33) = 3.50 at the start
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False))
    assert train(args)[1] == losses  # the same seed, the same run
    loaded = load_policy(args.out)
    assert loaded.prompt_style == "compact"
    _, boards = step_boards(args, 0, 0.0)
    answer = compact_text(compact_answer(boards[0].reference_plan, boards[0]))
    assert loaded.tokenizer.decode(loaded.tokenizer(answer)["input_ids"]) == answer
