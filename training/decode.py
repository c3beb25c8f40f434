"""Token generation for small models on a CPU: a decode loop over the model's own KV cache that drops each row
from the batch once it has written eos.

Why not transformers' `generate`: its batch runs as long as its longest answer, and every row pays for every
step. On the tiny policy's validation boards a batch of 64 answers of 24 to 100 tokens runs 170 steps when one
answer babbles on, so most of its work is for rows that have ended (docs/worker.md measures it). Here a row that
has ended leaves the batch (its cache rows go too), and the steps that remain cost what the rows still writing
cost.

Nothing changes but the time: the loop feeds the model the same inputs as `generate` (left padding, positions
counted from the attention mask, pad after eos), picks tokens as `generate` does (argmax; or the softmax of
`logits / temperature` through `torch.multinomial` over the whole batch, the ended rows included, so the random
stream is consumed alike), and stops at the same step. `tests/training/test_decode.py` checks the answers equal
`generate`'s, token for token, greedy and sampled.

For the compact answer format, whose cells and line starts its board decides, `decode_drafted` writes those tokens in
the forward of the token before them (`CompactDraft`, docs/worker.md "Drafts"): greedy answers are the same, token for
token; sampled ones come from the same distribution through other draws.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers import DynamicCache, GenerationConfig

from envsim.prompts import COMPACT_VOCAB, SHORT_OF
from envsim.rules import ACTION_CODE, ACTIONS, DELTAS


def cache_argument(model: Any) -> str:
    """The name the model's forward takes its KV cache by: `cache` in newer transformers (5.25), `past_key_values`
    in older ones (5.17, where an unknown keyword is swallowed by `**kwargs` and the model would see one token a
    step). A peft wrapper passes it on to the model it wraps, so that model's forward is read."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(inner.forward).parameters else "past_key_values"


@torch.no_grad()
def decode(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int, eos_id: int,
           pad_id: int, temperature: float | None = None) -> torch.Tensor:
    """The new tokens for each row of `input_ids` (left padded; `attention_mask` 1 on the prompt's tokens): a
    (rows, steps) tensor, each row its answer up to and including eos, then `pad_id`; `steps` is the step at which
    the last row wrote eos, or `max_new_tokens`. Greedy with `temperature` None, else sampled from
    `softmax(logits / temperature)` (no top-k or top-p)."""
    rows, width = input_ids.shape
    device = input_ids.device
    mask = torch.cat([attention_mask, attention_mask.new_ones((rows, max_new_tokens))], dim=1)
    positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)
    cache = DynamicCache(config=model.config)
    cached = {cache_argument(model): cache}
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, **cached,
                use_cache=True, logits_to_keep=1)
    live = torch.arange(rows, device=device)  # the batch row each row of the shrinking batch is
    last = positions[:, -1:]
    tokens = torch.full((rows, max_new_tokens), pad_id, dtype=torch.long, device=device)
    scores = None
    steps = 0
    for step in range(max_new_tokens):
        logits = out.logits[:, -1].to(dtype=torch.float32)
        if temperature is None:
            chosen = logits.argmax(dim=-1)
        else:
            if temperature != 1.0:
                logits = logits / temperature
            if scores is None:  # every row's scores, the ended ones too: the random stream is drawn for all
                scores = torch.zeros((rows, logits.shape[-1]), dtype=torch.float32, device=device)
            scores[live] = logits
            chosen = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)[live]
        tokens[live, step] = chosen
        steps = step + 1
        writing = chosen != eos_id
        if step == max_new_tokens - 1 or not bool(writing.any()):
            break
        if not bool(writing.all()):
            keep = writing.nonzero().squeeze(1)
            cache.batch_select_indices(keep)
            live, chosen, mask, last = live[keep], chosen[keep], mask[keep], last[keep]
        last = last + 1
        out = model(input_ids=chosen[:, None], attention_mask=mask[:, :width + step + 1], position_ids=last,
                    **cached, use_cache=True, logits_to_keep=1)
    return tokens[:, :steps]


class CompactDraft:
    """What a row of the compact answer format (`envsim.prompts.compact_answer`) will write next where its own prompt
    decides it: after a move, the cell it leads to; after a line break (or the answer's first `Agent`), the next
    agent's `Agent k : (start)`. Nothing elsewhere. Fed every token the row writes (`feed`); `draft` is the tokens
    it expects next, which `decode` checks in the same forward as the token before them."""

    WORDS = {word: i for i, word in enumerate(COMPACT_VOCAB)}
    MOVES = {SHORT_OF[a]: DELTAS[ACTION_CODE[a]] for a in ACTIONS}

    def __init__(self, prompt_ids: list[int]):
        words = [COMPACT_VOCAB[i] for i in prompt_ids if 0 <= i < len(COMPACT_VOCAB)]
        digits = words[words.index("size") + 1:words.index("agents")] if "size" in words and "agents" in words else []
        # a prompt that is not a compact board's (no size, or starts that are not cells) is drafted nothing
        self.size = int("".join(digits)) if digits and all(d.isdigit() for d in digits) else 0
        self.starts = [words[i + 1] for i, w in enumerate(words[:-1])
                       if w == "start" and words[i + 1].startswith("(")] if self.size else []
        self.cell: tuple[int, int] | None = None  # the last cell the row wrote
        self.line = 0  # the agent whose line the row writes
        self.last = ""

    def feed(self, token: int) -> None:
        word = COMPACT_VOCAB[token] if 0 <= token < len(COMPACT_VOCAB) else ""
        if word.startswith("("):
            r, c = word[1:-1].split(",")
            self.cell = (int(r), int(c))
        elif word == "<nl>":
            self.line, self.cell = self.line + 1, None
        self.last = word

    def draft(self) -> list[int]:
        words: list[str] = []
        if self.last in ("<nl>", "Agent") and self.line < len(self.starts):
            words = ["Agent"] * (self.last == "<nl>") + [*str(self.line), ":", self.starts[self.line]]
        elif self.last in self.MOVES and self.cell is not None and self.size:
            dr, dc = self.MOVES[self.last]
            r, c = self.cell[0] + dr, self.cell[1] + dc
            words = [f"({r},{c})" if 0 <= r < self.size and 0 <= c < self.size else f"({self.cell[0]},{self.cell[1]})"]
        return [self.WORDS[w] for w in words if w in self.WORDS]


@torch.no_grad()
def decode_drafted(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
                   eos_id: int, pad_id: int, drafts: list[CompactDraft],
                   temperature: float | None = None) -> torch.Tensor:
    """`decode`'s answers in fewer forwards: each step feeds every row its chosen token and then the tokens its
    `drafts` row expects next, and keeps the run of them that decoding one token a step would have written too.

    Greedy (`temperature` None): the longest run of drafted tokens the argmax of the step's logits agrees with, then
    the argmax after it: the answers are greedy decoding's, token for token (`tests/training/test_decode.py`).
    Sampled: speculative sampling with the draft as a proposal of probability 1 (Leviathan et al., 2023): a drafted
    token t is kept with probability p(t) under `softmax(logits / temperature)`; at the first one refused, the token
    is drawn from p with t's probability removed, renormalized; after a run kept whole, from p after it. Every
    token is so distributed exactly as when sampled one a step, though from another draw of the random stream than
    `decode`'s, so a seed gives other answers (the same distribution: the test compares them).

    A row's refused draft tokens stay in the KV cache as columns its attention mask hides (cache columns no row
    kept are cropped), and every token gets its position explicitly, so what the kept tokens see is what they saw
    one at a time."""
    rows, width = input_ids.shape
    device = input_ids.device
    positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)
    cache = DynamicCache(config=model.config)
    cached = {cache_argument(model): cache}
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, **cached,
                use_cache=True, logits_to_keep=1)
    mask = attention_mask.clone()
    live = list(range(rows))  # the batch row each row of the shrinking batch is
    last = positions[:, -1].tolist()  # each live row's position of its last token fed
    chosen = _pick(out.logits[:, -1], temperature).tolist()
    written: list[list[int]] = [[] for _ in range(rows)]
    while True:
        # write each row's chosen token; a row ends at eos or its budget
        feeds, keep = [], []
        for k, row in enumerate(live):
            written[row].append(chosen[k])
            drafts[row].feed(chosen[k])
            if chosen[k] != eos_id and len(written[row]) < max_new_tokens:
                keep.append(k)
                feeds.append([chosen[k], *drafts[row].draft()[:max_new_tokens - len(written[row]) - 1]])
        if not keep:
            break
        if len(keep) < len(live):
            index = torch.tensor(keep, device=device)
            cache.batch_select_indices(index)
            mask = mask[index]
            live, last = [live[k] for k in keep], [last[k] for k in keep]
        span = max(map(len, feeds))
        fed = torch.tensor([f + [pad_id] * (span - len(f)) for f in feeds], device=device)
        new_mask = torch.tensor([[1] * len(f) + [0] * (span - len(f)) for f in feeds], device=device,
                                dtype=mask.dtype)
        mask = torch.cat([mask, new_mask], dim=1)
        fed_positions = torch.tensor(last, device=device)[:, None] + 1 + torch.arange(span, device=device)
        out = model(input_ids=fed, attention_mask=mask, position_ids=fed_positions, **cached, use_cache=True,
                    logits_to_keep=span)
        agreed, chosen = _verify(out.logits, [f[1:] for f in feeds], temperature)
        for k, row in enumerate(live):
            for token in feeds[k][1:1 + agreed[k]]:
                written[row].append(token)
                drafts[row].feed(token)
            mask[k, mask.shape[1] - span + 1 + agreed[k]:] = 0
            last[k] += 1 + agreed[k]
        unused = span - 1 - max(agreed)
        if unused:  # cache columns no row kept
            cache.crop(-unused)
            mask = mask[:, :mask.shape[1] - unused]
    steps = max(map(len, written))
    tokens = torch.full((rows, steps), pad_id, dtype=torch.long, device=device)
    for row, answer in enumerate(written):
        tokens[row, :len(answer)] = torch.tensor(answer, device=device)
    return tokens


def _pick(logits: torch.Tensor, temperature: float | None) -> torch.Tensor:
    """A token per row of `logits` (rows, vocabulary): the argmax, or drawn from `softmax(logits / temperature)`."""
    logits = logits.to(dtype=torch.float32)
    if temperature is None:
        return logits.argmax(dim=-1)
    return torch.multinomial(torch.softmax(logits / temperature, dim=-1), num_samples=1).squeeze(1)


def _verify(logits: torch.Tensor, drafted: list[list[int]], temperature: float | None) -> tuple[list[int], list[int]]:
    """For each row of `logits` (rows, span, vocabulary: after its chosen token and after each of its `drafted`
    tokens), how many drafted tokens it keeps and the token it writes after them (`decode_drafted`'s rule)."""
    logits = logits.to(dtype=torch.float32)
    if temperature is None:
        best = logits.argmax(dim=-1).tolist()
        agreed = []
        for k, draft in enumerate(drafted):
            n = 0
            while n < len(draft) and best[k][n] == draft[n]:
                n += 1
            agreed.append(n)
        return agreed, [best[k][n] for k, n in enumerate(agreed)]
    probs = torch.softmax(logits / temperature, dim=-1)
    span = probs.shape[1]
    draws = torch.rand((len(drafted), span), device=logits.device).tolist()
    agreed, refused_rows, refused = [], [], []
    for k, draft in enumerate(drafted):
        n = 0
        while n < len(draft) and draws[k][n] < float(probs[k, n, draft[n]]):
            n += 1
        agreed.append(n)
        if n < len(draft):
            refused_rows.append(k)
            refused.append(draft[n])
    rest = probs[torch.arange(len(drafted)), torch.tensor(agreed)]  # p after each row's kept run
    if refused_rows:  # the refused token's probability removed
        rest[refused_rows, refused] = 0.0
    chosen = torch.multinomial(rest, num_samples=1).squeeze(1).tolist()
    return agreed, chosen


# What a `GenerationConfig` may set for the loop to answer as `generate` does, each with the values that leave the
# logits as they are (no processor of transformers' runs); any other field set sends the call to `generate`.
PLAIN = {"top_k": (0,), "top_p": (1.0, None), "repetition_penalty": (1.0, None), "min_p": (None,),
         "disable_compile": (True, False), "cache_implementation": (None,)}
FREE = {"max_new_tokens", "do_sample", "temperature", "pad_token_id", "eos_token_id", "bos_token_id",
        "transformers_version"}
SAMPLING_ONLY = {"temperature", "top_k", "top_p", "min_p", "top_h", "typical_p", "epsilon_cutoff", "eta_cutoff"}


def fits(config: GenerationConfig) -> bool:
    """Whether `decode` answers as `generate` does under `config`: greedy, or sampled at a temperature alone, with
    one eos token, a pad token and a budget of new tokens."""
    for name, value in config.to_diff_dict().items():
        if name in FREE or not config.do_sample and name in SAMPLING_ONLY:
            continue
        if name not in PLAIN or value not in PLAIN[name]:
            return False
    if config.do_sample and config.top_k != 0:  # unset, `generate` keeps the 50 likeliest tokens
        return False
    eos = config.eos_token_id
    eos = eos[0] if isinstance(eos, list) and len(eos) == 1 else eos
    return isinstance(eos, int) and config.pad_token_id is not None and config.max_new_tokens is not None


def answer(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, config: GenerationConfig,
           drafts: list[CompactDraft] | None = None) -> torch.Tensor:
    """`decode` under a `config` that `fits`: the new tokens of each row; through `decode_drafted` where each row has
    its `drafts`."""
    eos = config.eos_token_id
    temperature = (1.0 if config.temperature is None else float(config.temperature)) if config.do_sample else None
    if drafts is not None:
        return decode_drafted(model, input_ids, attention_mask, config.max_new_tokens,
                              eos[0] if isinstance(eos, list) else eos, config.pad_token_id, drafts, temperature)
    return decode(model, input_ids, attention_mask, config.max_new_tokens, eos[0] if isinstance(eos, list) else eos,
                  config.pad_token_id, temperature=temperature)


@contextmanager
def looped(model: Any, drafted: bool = False) -> Iterator[None]:
    """`model.generate` answers through `decode` meanwhile (`drafted`: through `decode_drafted`, each row drafted
    from its own prompt, for a model of the compact format), for the calls it can serve as `generate` would (input
    ids and their mask, left padded, and a `generation_config` that `fits`); any other call goes to transformers'
    `generate` as before. Put back after."""
    original = model.generate

    def generate(input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                 generation_config: GenerationConfig | None = None, **kwargs: Any) -> Any:
        if kwargs or input_ids is None or attention_mask is None or generation_config is None \
                or not fits(generation_config):
            return original(input_ids=input_ids, attention_mask=attention_mask,
                            generation_config=generation_config, **kwargs)
        drafts = None if not drafted else \
            [CompactDraft(ids[keep.bool()].tolist()) for ids, keep in zip(input_ids, attention_mask, strict=True)]
        return torch.cat([input_ids, answer(model, input_ids, attention_mask, generation_config, drafts)], dim=1)

    model.generate = generate
    try:
        yield
    finally:
        del model.generate
