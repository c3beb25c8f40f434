"""The decode loop (`training.decode`) against transformers' `generate` on the shipped tiny policy: the same answers,
token for token, greedy on validation boards of 2 to 5 agents and sampled with a seed; the rollouts TRL asks for go
through it only where it answers as `generate` would."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

from envsim.config import EnvConfig
from envsim.generator import generate
from envsim.instance import Instance
from envsim.prompts import COMPACT_VOCAB, compact_prompt
from training import decode
from training.evaluate import _by_length, answer_budget, evaluate
from training.policy import load_policy
from training.tokenizer import build_tokenizer, compact_text

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


@pytest.mark.parametrize("decoder", ["loop", "drafted"])
def test_greedy_validation_answers_are_the_same_answer_for_answer(policy, boards, decoder, monkeypatch):
    policy.decoder = "transformers"
    before = evaluate(policy, boards, batch_size=16)
    forwards = []
    monkeypatch.setattr(policy.model, "forward", lambda *a, _f=policy.model.forward, **kw: forwards.append(1) or
                        _f(*a, **kw))
    policy.decoder = decoder
    after = evaluate(policy, boards, batch_size=16)
    assert [r.instance.id for r in after] == [b.id for b in boards]
    assert [r.completion for r in after] == [r.completion for r in before]
    assert [r.outcome for r in after] == [r.outcome for r in before]
    lengths = {len(policy.tokenizer(r.completion)["input_ids"]) for r in after}
    assert len(lengths) > 10  # rows ended at many different steps: the batch shrank as they did
    assert sum(r.outcome.valid for r in after) > 0
    # a forward per token of a batch's longest answer, and its prompt's; the drafts write about half the tokens
    longest = [max(lengths) for lengths in _batch_lengths(policy, boards, after, 16)]
    if decoder == "loop":
        assert len(forwards) == sum(longest)
    else:
        assert len(forwards) < 0.6 * sum(longest)


def _batch_lengths(policy, boards, results, batch):
    """The tokens each answer wrote (its eos included unless the budget cut it), in the batches `evaluate` made."""
    prompts = [policy.prompt(b) for b in boards]
    order = _by_length(prompts)
    written = [len(policy.tokenizer(r.completion)["input_ids"]) + 1 for r in results]
    budget = [answer_budget(policy, b) for b in boards]
    chunks = [order[i:i + batch] for i in range(0, len(order), batch)]
    return [[min(written[i], max(budget[j] for j in chunk)) for i in chunk] for chunk in chunks]


def test_the_drafts_are_the_cells_and_line_starts_the_board_decides():
    """`CompactDraft` on a 3x3 board of two agents: after `Agent` the agent's number and start, after a move the
    cell it leads to (the same cell off the grid), after a line break the next agent's line start; nothing after a
    cell, nor after the last agent's line."""
    board = Instance(size=3, holes=((0, 2),), starts=((0, 0), (1, 0)), goals=((2, 2), (0, 1)))
    tok = build_tokenizer()
    draft = decode.CompactDraft(tok(compact_text(compact_prompt(board)))["input_ids"])
    words = {w: i for i, w in enumerate(COMPACT_VOCAB)}
    seen = []
    answer = "Agent 0 : (0,0) R (0,1) U (0,1) D (1,1) <nl> Agent 1 : (1,0) L (1,0) W (1,0) <nl>"
    for word in answer.split(" "):
        draft.feed(words[word])
        seen.append(" ".join(COMPACT_VOCAB[i] for i in draft.draft()))
    assert seen == ["0 : (0,0)", "", "", "", "(0,1)", "", "(0,1)", "", "(1,1)", "", "Agent 1 : (1,0)", "1 : (1,0)",
                    "", "", "", "(1,0)", "", "(1,0)", "", ""]
    # a prompt that is not a compact board's (a chat text in the compact vocabulary: unknown words) drafts nothing
    other = decode.CompactDraft(tok(compact_text("Plan the moves of 2 agents : start (0,0) <nl>"))["input_ids"])
    for word in ["Agent", "(0,0)", "R", "<nl>"]:
        other.feed(words[word])
        assert other.draft() == []


def test_a_drafted_budget_cuts_every_row_at_the_same_token(policy, boards):
    """Budgets that end inside a draft (a line start of four tokens, a move's cell): the drafted answers stop where
    one token a step stops."""
    prompts = [policy.prompt(b) for b in boards[:12]]
    for budget in (2, 3, 5, 9, 14):
        policy.decoder = "transformers"
        before = policy.generate(prompts, max_new_tokens=budget)
        policy.decoder = "drafted"
        assert policy.generate(prompts, max_new_tokens=budget) == before
        assert all(len(policy.tokenizer(text)["input_ids"]) == budget for text in before)


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


def test_drafted_samples_are_drawn_from_the_distribution_one_token_a_step_draws_from(policy, boards):
    """Sampled, `decode_drafted` keeps a drafted token with its probability and draws another from the rest: 3,000
    answers to one board at temperature 2 (where the policy often writes a cell its move does not lead to, so drafts
    are refused often), drawn one token a step and drafted, have the same distribution of tokens at each of their
    first 12 positions (chi-square tests of the two samples' counts, Bonferroni over the positions; fixed seeds).
    Keeping every drafted token instead would fail it: the answers drawn one token a step write the draft's cell in
    only part of the places a draft covers."""
    from scipy.stats import chi2_contingency

    rows, budget, temperature = 3000, 12, 2.0
    ids = policy.token_ids(policy.prompt(boards[3]))
    input_ids, mask = torch.tensor([ids] * rows), torch.ones((rows, len(ids)), dtype=torch.long)
    tok = policy.tokenizer
    policy.model.eval()
    torch.manual_seed(1)
    plain = decode.decode(policy.model, input_ids, mask, budget, tok.eos_token_id, tok.pad_token_id, temperature)
    torch.manual_seed(2)
    drafted = decode.decode_drafted(policy.model, input_ids, mask, budget, tok.eos_token_id, tok.pad_token_id,
                                    [decode.CompactDraft(ids) for _ in range(rows)], temperature)
    assert plain.shape == drafted.shape == (rows, budget)
    p_values = []
    for position in range(budget):
        counts = torch.stack([torch.bincount(t[:, position], minlength=len(COMPACT_VOCAB)) for t in (plain, drafted)])
        counts = counts[:, counts.sum(0) >= 10]  # tokens seen often enough for the test
        p_values.append(chi2_contingency(counts.numpy())[1] if counts.shape[1] > 1 else 1.0)
    assert min(p_values) > 0.001 / budget, p_values

    def off_draft(tokens):  # places a draft covers where the answer wrote another token than the draft
        n = 0
        for row in tokens.tolist():
            draft = decode.CompactDraft(ids)
            for token in row:
                expected = draft.draft()
                n += bool(expected) and token != expected[0]
                draft.feed(token)
        return n

    assert off_draft(plain) > 100 and off_draft(drafted) > 100


class _Wrong(decode.CompactDraft):
    """Drafts two tokens after every token, right or wrong: `(0,0) Agent`."""

    def draft(self):
        return [COMPACT_VOCAB.index("(0,0)"), COMPACT_VOCAB.index("Agent")]


def test_refused_drafts_leave_greedy_answers_as_they_were(policy, boards):
    """Drafts that are mostly wrong, in every row at every step: their cache columns are hidden by the mask or
    cropped, and the answers are still greedy decoding's, token for token."""
    prompts = [policy.prompt(b) for b in boards[:16]]
    ids = [policy.token_ids(p) for p in prompts]
    width = max(map(len, ids))
    input_ids = torch.tensor([[policy.tokenizer.pad_token_id] * (width - len(i)) + i for i in ids])
    mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])
    tok = policy.tokenizer
    policy.model.eval()
    plain = decode.decode(policy.model, input_ids, mask, 60, tok.eos_token_id, tok.pad_token_id)
    wrong = decode.decode_drafted(policy.model, input_ids, mask, 60, tok.eos_token_id, tok.pad_token_id,
                                  [_Wrong(i) for i in ids])
    assert torch.equal(wrong, plain)
