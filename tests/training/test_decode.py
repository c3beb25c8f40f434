"""The decode loop (`training.decode`) against transformers' `generate` on the shipped tiny policy: the same answers,
token for token, greedy on validation boards of 2 to 5 agents and sampled with a seed; the rollouts TRL asks for go
through it only where it answers as `generate` would."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

from envsim.config import EnvConfig
from envsim.generator import generate
from training import decode
from training.evaluate import evaluate
from training.policy import load_policy

SIZES = (4, 5, 6, 7, 8)


@pytest.fixture(scope="module")
def policy():
    return load_policy("tiny")


@pytest.fixture(scope="module")
def boards():
    """36 boards: 2 to 5 agents in equal shares on sizes 4 to 8, as the validation sets mix them."""
    config = EnvConfig.default(sizes=SIZES, num_instances=36).model_copy(
        update={"agent_ratio": {2: 0.25, 3: 0.25, 4: 0.25, 5: 0.25}})
    return generate(config, 36, seed=11)


def test_greedy_validation_answers_are_the_same_answer_for_answer(policy, boards):
    policy.decoder = "transformers"
    before = evaluate(policy, boards, batch_size=16)
    policy.decoder = "loop"
    after = evaluate(policy, boards, batch_size=16)
    assert [r.instance.id for r in after] == [b.id for b in boards]
    assert [r.completion for r in after] == [r.completion for r in before]
    assert [r.outcome for r in after] == [r.outcome for r in before]
    lengths = {len(policy.tokenizer(r.completion)["input_ids"]) for r in after}
    assert len(lengths) > 10  # rows ended at many different steps: the batch shrank as they did
    assert sum(r.outcome.valid for r in after) > 0


def test_sampled_answers_are_the_same_for_the_same_seed(policy, boards):
    prompts = [policy.prompt(b) for b in boards[:12] for _ in range(3)]
    policy.decoder = "transformers"
    before = policy.generate(prompts, max_new_tokens=120, batch_size=12, do_sample=True, temperature=1.0, seed=5)
    policy.decoder = "loop"
    after = policy.generate(prompts, max_new_tokens=120, batch_size=12, do_sample=True, temperature=1.0, seed=5)
    hot = policy.generate(prompts, max_new_tokens=120, batch_size=12, do_sample=True, temperature=1.5, seed=5)
    policy.decoder = "transformers"
    hot_before = policy.generate(prompts, max_new_tokens=120, batch_size=12, do_sample=True, temperature=1.5, seed=5)
    policy.decoder = "loop"
    assert after == before and hot == hot_before
    assert len(set(after)) > 20 and hot != after  # sampled: the three answers to a board differ


def test_a_budget_cuts_every_row_at_the_same_step(policy, boards):
    prompts = [policy.prompt(b) for b in boards[:8]]
    policy.decoder = "transformers"
    before = policy.generate(prompts, max_new_tokens=9)
    policy.decoder = "loop"
    assert policy.generate(prompts, max_new_tokens=9) == before
    assert all(len(policy.tokenizer(text)["input_ids"]) == 9 for text in before)


def test_trl_rollouts_go_through_the_loop_with_the_same_tokens(policy, boards):
    """The generation config TRL's GRPO trainer builds (sampling at temperature 1, top-k 0, top-p 1, a list of one
    eos), on left-padded prompts: the loop's tokens equal `generate`'s for the same seed, and `generate` is the
    model's own again after."""
    model, tok = policy.model, policy.tokenizer
    config = GenerationConfig(max_new_tokens=60, do_sample=True, pad_token_id=tok.pad_token_id, bos_token_id=None,
                              eos_token_id=[tok.eos_token_id], temperature=1.0, top_p=1.0, top_k=0, min_p=None,
                              repetition_penalty=1.0, cache_implementation=None, disable_compile=True)
    ids = [policy.token_ids(policy.prompt(b)) for b in boards[:8] for _ in range(2)]
    width = max(map(len, ids))
    input_ids = torch.tensor([[tok.pad_token_id] * (width - len(i)) + i for i in ids])
    mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])
    model.eval()
    torch.manual_seed(3)
    before = model.generate(input_ids=input_ids, attention_mask=mask, generation_config=config)
    with decode.looped(model):
        assert "generate" in vars(model)
        torch.manual_seed(3)
        after = model.generate(input_ids=input_ids, attention_mask=mask, generation_config=config)
    assert "generate" not in vars(model)
    assert torch.equal(after, before)


@pytest.mark.parametrize(("fields", "fits"), [
    (dict(do_sample=False), True),
    (dict(do_sample=False, top_k=20, temperature=0.6), True),  # sampling fields do not touch a greedy answer
    (dict(do_sample=True, temperature=0.7, top_k=0, top_p=1.0), True),
    (dict(do_sample=True), False),  # transformers' default top-k of 50
    (dict(do_sample=True, top_k=0, top_p=0.9), False),
    (dict(do_sample=False, repetition_penalty=1.1), False),
    (dict(do_sample=False, min_new_tokens=4), False),
    (dict(do_sample=False, eos_token_id=[2, 3]), False),
])
def test_the_loop_takes_only_what_it_answers_as_generate_does(fields, fits):
    config = GenerationConfig(**{"max_new_tokens": 10, "pad_token_id": 0, "eos_token_id": 2, **fields})
    assert decode.fits(config) is fits
