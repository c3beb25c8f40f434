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
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers import DynamicCache, GenerationConfig


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


def answer(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, config: GenerationConfig) -> torch.Tensor:
    """`decode` under a `config` that `fits`: the new tokens of each row."""
    eos = config.eos_token_id
    temperature = (1.0 if config.temperature is None else float(config.temperature)) if config.do_sample else None
    return decode(model, input_ids, attention_mask, config.max_new_tokens, eos[0] if isinstance(eos, list) else eos,
                  config.pad_token_id, temperature=temperature)


@contextmanager
def looped(model: Any) -> Iterator[None]:
    """`model.generate` answers through `decode` meanwhile, for the calls it can serve as `generate` would
    (input ids and their mask, left padded, and a `generation_config` that `fits`); any other call
    goes to transformers' `generate` as before. Put back after."""
    original = model.generate

    def generate(input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                 generation_config: GenerationConfig | None = None, **kwargs: Any) -> Any:
        if kwargs or input_ids is None or attention_mask is None or generation_config is None \
                or not fits(generation_config):
            return original(input_ids=input_ids, attention_mask=attention_mask,
                            generation_config=generation_config, **kwargs)
        return torch.cat([input_ids, answer(model, input_ids, attention_mask, generation_config)], dim=1)

    model.generate = generate
    try:
        yield
    finally:
        del model.generate
