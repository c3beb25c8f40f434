"""Policies: the compact tokenizer's exact ids, the tiny model's shape, checkpoints that round-trip or fail
with a message that says why, batched generation equal to one-at-a-time, and the shipped checkpoint."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from envsim.generator import random_board
from envsim.instance import Instance
from envsim.parser import parse
from envsim.prompts import COMPACT_VOCAB, compact_answer, compact_prompt
from envsim.scoring import score_answer
from envsim.solver import Unsolved, label
from envsim.suite import SuiteCell, build_cell
from tests.boards import CROSSING, OPEN
from training.policy import TINY_DIR, PolicyError, build_tiny, load_policy, with_lora
from training.tokenizer import build_tokenizer, compact_text

SMALL = Instance.from_str("..H\n...\nH..\nA0 (0,0) -> (2,2)\nA1 (1,0) -> (0,1)")
SMALL_SHAPE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                   num_key_value_heads=2, head_dim=16)


def _labelled_boards(n: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        size = int(rng.integers(3, 8))
        board = random_board(size, int(rng.integers(0, size)), 2, rng)
        labelled = label(board) if board is not None else None
        if labelled is not None and not isinstance(labelled, Unsolved):
            out.append(labelled)
    return out


def test_tokenizer_ids_of_a_small_example() -> None:
    tok = build_tokenizer()
    assert len(tok) == len(COMPACT_VOCAB) == 33 + 32 * 32
    assert (tok.pad_token_id, tok.unk_token_id, tok.eos_token_id) == (0, 1, 2)
    prompt = compact_text(compact_prompt(SMALL))
    assert prompt == ("size 3 agents 2 | holes (0,2) (2,0) | agent 0 start (0,0) goal (2,2) | "
                      "agent 1 start (1,0) goal (0,1) | plan")
    # a cell (r,c) is word 33 + 32 r + c
    assert tok(prompt)["input_ids"] == [
        14, 7, 15, 6, 16, 31, 35, 97, 16, 19, 4, 20, 33, 22, 99, 16, 19, 5, 20, 65, 22, 34, 16, 23]
    answer = compact_text(compact_answer((("RIGHT", "DOWN"), ("UP",)), SMALL))
    assert answer == "Agent 0 : (0,0) R (0,1) D (1,1) <nl> Agent 1 : (1,0) U (0,0)"
    assert tok(answer)["input_ids"] == [24, 4, 25, 33, 29, 34, 27, 66, 3, 24, 5, 25, 65, 26, 33]


def test_tokenizer_round_trip_on_random_boards() -> None:
    tok = build_tokenizer()
    for board in _labelled_boards(12, seed=3):
        prompt = compact_text(compact_prompt(board))
        assert tok.decode(tok(prompt)["input_ids"]) == prompt
        answer = compact_text(compact_answer(board.reference_plan, board))
        ids = tok(answer)["input_ids"] + [tok.eos_token_id]
        assert tok.unk_token_id not in ids
        decoded = tok.decode(ids, skip_special_tokens=True)
        assert parse(decoded, 2).plan == board.reference_plan
        assert score_answer(board, decoded).valid


def test_tiny_policy_shape_and_prompt() -> None:
    policy = build_tiny(seed=0)
    assert sum(p.numel() for p in policy.model.parameters()) == 1_415_296
    assert policy.model.config.tie_word_embeddings
    assert policy.prompt(CROSSING) == compact_text(compact_prompt(CROSSING))
    again = build_tiny(seed=0)
    assert torch.equal(policy.model.lm_head.weight, again.model.lm_head.weight)


def test_save_and_load_give_identical_logits(tmp_path: Path) -> None:
    policy = build_tiny(seed=1, **SMALL_SHAPE)
    policy.save(tmp_path / "ckpt")
    assert json.loads((tmp_path / "ckpt" / "envlab.json").read_text()) == {"name": "tiny", "prompt_style": "compact"}
    loaded = load_policy(str(tmp_path / "ckpt"))
    assert loaded.prompt_style == "compact" and loaded.trained_agents is None
    loaded.trained_agents = (2, 3, 4, 5)  # a warm start says which agent counts it imitated
    loaded.save(tmp_path / "warm")
    assert json.loads((tmp_path / "warm" / "envlab.json").read_text())["trained_agents"] == [2, 3, 4, 5]
    assert load_policy(str(tmp_path / "warm")).trained_agents == (2, 3, 4, 5)
    (tmp_path / "warm" / "envlab.json").write_text('{"prompt_style": "compact", "trained_agents": [2, 9]}')
    with pytest.raises(PolicyError, match=r"trained_agents \[2, 9\] is not a list of agent counts 1..8"):
        load_policy(str(tmp_path / "warm"))
    batch = policy.tokenizer([policy.prompt(CROSSING), policy.prompt(OPEN)], return_tensors="pt", padding=True)
    with torch.no_grad():
        assert torch.equal(policy.model(**batch).logits, loaded.model(**batch).logits)


def test_broken_checkpoints_fail_with_a_clear_message(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="no checkpoint folder there"):
        load_policy(str(tmp_path / "nowhere"))
    good = build_tiny(seed=1, **SMALL_SHAPE).save(tmp_path / "good")

    no_config = tmp_path / "no-config"
    shutil.copytree(good, no_config)
    (no_config / "config.json").unlink()
    with pytest.raises(PolicyError, match=r"no-config: no config.json, so this is not a Hugging Face checkpoint"):
        load_policy(str(no_config))

    truncated = tmp_path / "truncated"
    shutil.copytree(good, truncated)
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    with pytest.raises(PolicyError, match=r"model.safetensors: truncated safetensors file"):
        load_policy(str(truncated))

    wrong_tok = tmp_path / "wrong-tokenizer"
    shutil.copytree(good, wrong_tok)
    config = json.loads((wrong_tok / "tokenizer.json").read_text())
    config["model"]["vocab"] = {"<pad>": 0, "<unk>": 1, "<eos>": 2, "x": 3}
    (wrong_tok / "tokenizer.json").write_text(json.dumps(config))
    with pytest.raises(PolicyError, match=r"says compact prompts but the tokenizer is not the envlab compact"):
        load_policy(str(wrong_tok))


def test_batched_generation_equals_one_at_a_time() -> None:
    policy = build_tiny(seed=2, **SMALL_SHAPE)
    prompts = [policy.prompt(b) for b in _labelled_boards(6, seed=5)]
    batched = policy.generate(prompts, max_new_tokens=12, batch_size=4)
    assert batched == [policy.generate([p], max_new_tokens=12)[0] for p in prompts]
    assert len({len(p.split()) for p in prompts}) > 1  # the batch really mixed lengths (left padding)


def test_sampling_is_seeded() -> None:
    policy = build_tiny(seed=2, **SMALL_SHAPE)
    prompts = [policy.prompt(CROSSING)] * 3
    first = policy.generate(prompts, max_new_tokens=10, do_sample=True, seed=7)
    assert first == policy.generate(prompts, max_new_tokens=10, do_sample=True, seed=7)


def test_lora_wraps_the_linear_layers() -> None:
    policy = with_lora(build_tiny(seed=0, **SMALL_SHAPE), r=4)
    trainable = sum(p.numel() for p in policy.model.parameters() if p.requires_grad)
    # r * (in + out) per linear layer: q, k, v, o (32/32/32/32 wide) and gate, up, down (32 <-> 64), 2 layers.
    assert trainable == 2 * 4 * (4 * (32 + 32) + 3 * (32 + 64))
    assert len(policy.generate([policy.prompt(OPEN)], max_new_tokens=3)) == 1


@pytest.mark.skipif(not (TINY_DIR / "config.json").exists(), reason="no shipped tiny checkpoint")
def test_shipped_tiny_policy_solves_validation_boards() -> None:
    policy = load_policy("tiny")
    assert (policy.name, policy.prompt_style) == ("tiny", "compact")
    boards = [e.instance for size in (3, 4, 5, 6)
              for e in build_cell(SuiteCell("validation", 2, size, 0.5, 10))[0][:5]]
    answers = policy.generate([policy.prompt(b) for b in boards], max_new_tokens=100)
    valid = [score_answer(b, a).valid for b, a in zip(boards, answers, strict=True)]
    assert sum(valid) == 17  # of these 20 boards, greedy, deterministic on a CPU


def test_lora_without_peft_names_the_missing_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "peft", None)  # as if it were not installed: importing it fails
    with pytest.raises(PolicyError, match=r"^LoRA needs the peft package: pip install peft$"):
        with_lora(build_tiny(seed=0, **SMALL_SHAPE))
