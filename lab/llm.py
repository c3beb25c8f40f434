"""LLM backends for the engineer: one function per backend, chosen by the prefix of a spec string.

    hf:policy          the run's current policy checkpoint (`policy_path`), in this process
    hf:gemma3-270m     Gemma 3 270M base, offline (training.gemma builds the checkpoint once)
    hf:<path or name>  any Hugging Face causal LM, in this process
    openai:<model>     any OpenAI-compatible server (vLLM, `transformers serve`, a hosted API) at `base_url`

In-process models are cached per process (a proposal per stage must not reload the weights). A model
without a chat template (a base model) gets the messages as plain text. The HTTP backend speaks
`POST {base_url}/chat/completions` with httpx, reads its key from `ENVLAB_OPENAI_API_KEY` or
`OPENAI_API_KEY` only (never stored, never in a message), and turns every way a server can fail (down,
slow, an error status, a body that is not JSON or not a completion) into an `LLMError` naming the URL
and the problem.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from functools import lru_cache
from typing import Any

Messages = list[dict[str, str]]

KEY_SETTINGS = ("ENVLAB_OPENAI_API_KEY", "OPENAI_API_KEY")
BASE_URL_SETTING = "ENVLAB_OPENAI_BASE_URL"
TIMEOUT_S = 120.0
GEMMA = "gemma3-270m"
POLICY = "policy"


class LLMError(RuntimeError):
    """A backend could not produce a completion; the message says which backend and why."""


def complete(spec: str, messages: Messages, *, max_tokens: int, temperature: float, seed: int,
             base_url: str | None = None, policy_path: str | None = None, timeout: float = TIMEOUT_S) -> str:
    """The model's answer to `messages` (`[{"role": ..., "content": ...}, ...]`), as text.

    Raises `LLMError` for an unknown spec, a model that cannot be loaded, or a server that fails.
    """
    kind, sep, name = spec.partition(":")
    if not sep or not name or kind not in BACKENDS:
        raise LLMError(f"unknown engineer backend {spec!r}: use one of {', '.join(f'{k}:<model>' for k in BACKENDS)}")
    return BACKENDS[kind](name, messages, max_tokens=max_tokens, temperature=temperature, seed=seed,
                          base_url=base_url, policy_path=policy_path, timeout=timeout)


NEXT_TURNS = ("\nUser:", "\nAssistant:")


def plain_text(messages: Messages) -> str:
    """Messages as one text for a model without a chat template; it ends where the answer begins.

    A base model continuing it often writes the next turn itself, so generation stops at `NEXT_TURNS`."""
    turns = [f"{m['role'].capitalize()}:\n{m['content']}" for m in messages]
    return "\n\n".join([*turns, "Assistant:\n"])


# ---------------------------------------------------------------- in process (transformers)


def _hf(name: str, messages: Messages, *, max_tokens: int, temperature: float, seed: int,
        policy_path: str | None, **_: Any) -> str:
    import torch
    from transformers import StoppingCriteriaList

    if name == POLICY:
        if not policy_path:
            raise LLMError("hf:policy needs the run's current checkpoint (policy_path), and none was given")
        path = str(policy_path)
    elif name == GEMMA:
        from training.gemma import GemmaUnavailable, gemma_checkpoint

        try:
            path = str(gemma_checkpoint())
        except GemmaUnavailable as err:
            raise LLMError(str(err)) from err
    else:
        path = name
    model, tokenizer = _load(path)
    options: dict[str, Any] = {"do_sample": True, "temperature": temperature} if temperature > 0 else {
        "do_sample": False}
    if tokenizer.chat_template:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                            return_dict=True)["input_ids"]
    else:
        ids = tokenizer(plain_text(messages), return_tensors="pt")["input_ids"]
        # A base model goes on to write the next turn itself: stop there.
        options["stopping_criteria"] = StoppingCriteriaList([_StopAt(NEXT_TURNS, tokenizer, ids.shape[1])])
    torch.manual_seed(seed)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                             pad_token_id=pad, **options)
    text = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    if not tokenizer.chat_template:
        for marker in NEXT_TURNS:
            text = text.split(marker)[0]
    return text


class _StopAt:
    """Stop generating once the last few new tokens contain one of `texts` (asked after every token).
    transformers' own `stop_strings` builds tables over the whole vocabulary on every call: seconds for
    Gemma's 262k tokens."""

    def __init__(self, texts: tuple[str, ...], tokenizer: Any, prompt_length: int):
        self.texts, self.tokenizer, self.start = texts, tokenizer, prompt_length

    def __call__(self, input_ids: Any, scores: Any, **_: Any) -> Any:
        import torch

        tail = self.tokenizer.decode(input_ids[0, max(self.start, input_ids.shape[1] - 8):])
        return torch.full((input_ids.shape[0],), any(t in tail for t in self.texts), dtype=torch.bool)


@lru_cache(maxsize=2)  # the policy checkpoint changes every stage: keep the last two, not all of them
def _load(path: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise LLMError(f"could not load the model {path!r}: {str(err).splitlines()[0]}") from err
    model.eval()
    return model, tokenizer


# ---------------------------------------------------------------- over HTTP (OpenAI-compatible)


def _openai(name: str, messages: Messages, *, max_tokens: int, temperature: float, seed: int,
            base_url: str | None, timeout: float, **_: Any) -> str:
    import httpx

    base = base_url or os.environ.get(BASE_URL_SETTING)
    if not base:
        raise LLMError(f"openai:{name} needs a base URL (e.g. http://127.0.0.1:8000/v1) or ${BASE_URL_SETTING}")
    url = base.rstrip("/") + "/chat/completions"
    headers = {"Content-Type": "application/json"}
    key = next((os.environ[k] for k in KEY_SETTINGS if os.environ.get(k)), None)
    if key:
        headers["Authorization"] = f"Bearer {key}"
    body = {"model": name, "messages": messages, "max_tokens": max_tokens, "temperature": temperature, "seed": seed}
    try:
        response = httpx.post(url, json=body, headers=headers, timeout=timeout)
    except httpx.TimeoutException as err:
        raise LLMError(f"{url} timed out after {timeout:g} s ({type(err).__name__})") from err
    except httpx.HTTPError as err:
        raise LLMError(f"could not reach {url}: {err or type(err).__name__}") from err
    if response.status_code != 200:
        raise LLMError(f"{url} answered HTTP {response.status_code}: {_snippet(response.text)}")
    try:
        data = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise LLMError(f"{url} answered with a body that is not JSON: {_snippet(response.text)}") from err
    content = _content(data)
    if content is None:
        raise LLMError(f"{url} answered JSON that is not a chat completion (no choices[0].message.content "
                       f"string): {_snippet(json.dumps(data))}")
    return content


def _content(data: Any) -> str | None:
    try:
        content = data["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        return None
    return content if isinstance(content, str) else None


def _snippet(text: str, n: int = 200) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= n else text[:n] + "...")


BACKENDS: dict[str, Callable[..., str]] = {"hf": _hf, "openai": _openai}
