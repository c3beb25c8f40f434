"""LLM backends for the engineer: one function per backend, chosen by the prefix of a spec string.

    hf:policy          the run's current policy checkpoint (`policy_path`: a stage's folder, or the run's policy
                       spec at stage 0, e.g. `gemma3-270m`), in this process, on its device and in its dtype
    hf:gemma3-270m     Gemma 3 270M base, offline (training.gemma builds the checkpoint once)
    hf:<path or name>  any Hugging Face causal LM, in this process
    openai:<model>     any OpenAI-compatible server (vLLM, `transformers serve`, a hosted API) at `base_url`

In-process models are cached per process (a proposal per stage must not reload the weights). A model
without a chat template (a base model) gets the messages as plain text. The HTTP backend speaks
`POST {base_url}/chat/completions` with httpx, reads its key from `ENVLAB_OPENAI_API_KEY` or
`OPENAI_API_KEY` only (never stored, never in a message), and turns every way a server can fail (down,
slow, an error status, a body that is not JSON or not a completion) into an `LLMError` naming the URL
and the problem. A reply is read as it streams in and refused past `REPLY_LIMIT` (1 MiB, far beyond any config
and its rationale): a 20 MB answer was read whole and stored three times over. Every backend's answer is held
to the same bound.

The key and the lab's data go only to servers this machine allows (`allowed_servers`): those listed in
`ENVLAB_ALLOWED_SERVERS` (comma separated; `http://10.0.0.5:8000` allows every path under it), the default
`ENVLAB_OPENAI_BASE_URL`, and a `--base-url` given on this machine's command line (`allow_server`). A URL from
anywhere else (a run imported from another lab, a form on the page) is refused before a byte is sent;
`check_server` is the one test, asked where a run is created and again where the request is made. A URL with a
user name or password in it (`http://user:secret@host/v1`) is refused everywhere, and said without them
(`shown_url`): the lab stores URLs and writes them in errors, and a key belongs in the environment.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import unquote, urlsplit

Messages = list[dict[str, str]]
Schema = dict[str, Any]

log = logging.getLogger("envlab.llm")

KEY_SETTINGS = ("ENVLAB_OPENAI_API_KEY", "OPENAI_API_KEY")
BASE_URL_SETTING = "ENVLAB_OPENAI_BASE_URL"
ALLOWED_SERVERS_SETTING = "ENVLAB_ALLOWED_SERVERS"
TIMEOUT_S = 120.0
POLICY = "policy"
REPLY_LIMIT = 1 << 20  # bytes of an engineer's reply read at most (a config and its rationale are a few kB)


class LLMError(RuntimeError):
    """A backend could not produce a completion; the message says which backend and why."""


def complete(spec: str, messages: Messages, *, max_tokens: int, temperature: float, seed: int,
             base_url: str | None = None, policy_path: str | None = None, timeout: float = TIMEOUT_S,
             schema: Schema | None = None, thinking: bool = False) -> str:
    """The model's answer to `messages` (`[{"role": ..., "content": ...}, ...]`), as text.

    `thinking`: the chat template's `enable_thinking` where the run's own policy answers (`hf:policy`), as the run
    trains it (`RunSettings.thinking`): a Qwen3 policy then answers at once, as it does in training.

    With `schema` (a JSON schema of an object), the answer is asked to be one JSON object of that schema:
    structured output from a server, constrained decoding in process. What comes back is still text, to be
    read and checked like any answer (a server may ignore the schema; `max_tokens` may cut the object).
    Raises `LLMError` for an unknown spec, a model that cannot be loaded, or a server that fails.
    """
    kind, sep, name = spec.partition(":")
    if not sep or not name or kind not in BACKENDS:
        raise LLMError(f"unknown engineer backend {spec!r}: use one of {', '.join(f'{k}:<model>' for k in BACKENDS)}")
    text = BACKENDS[kind](name, messages, max_tokens=max_tokens, temperature=temperature, seed=seed,
                          base_url=base_url, policy_path=policy_path, timeout=timeout, schema=schema,
                          thinking=thinking)
    if len(text.encode()) > REPLY_LIMIT:
        raise LLMError(too_big(spec))
    return text


def too_big(source: str) -> str:
    """The one line a reply over `REPLY_LIMIT` fails its proposal with."""
    return f"{source} answered more than {REPLY_LIMIT >> 20} MiB, the most the lab reads of an engineer's reply"


NEXT_TURNS = ("\nUser:", "\nAssistant:")


def plain_text(messages: Messages) -> str:
    """Messages as one text for a model without a chat template; it ends where the answer begins.

    A base model continuing it often writes the next turn itself, so generation stops at `NEXT_TURNS`."""
    turns = [f"{m['role'].capitalize()}:\n{m['content']}" for m in messages]
    return "\n\n".join([*turns, "Assistant:\n"])


# ---------------------------------------------------------------- in process (transformers)


def _hf(name: str, messages: Messages, *, max_tokens: int, temperature: float, seed: int,
        policy_path: str | None, schema: Schema | None = None, thinking: bool = False, **_: Any) -> str:
    import torch
    from transformers import LogitsProcessorList, StoppingCriteriaList

    template: dict[str, Any] = {}
    if name == POLICY:
        if not policy_path:
            raise LLMError("hf:policy needs the run's current checkpoint (policy_path), and none was given")
        path = str(policy_path)
        template["enable_thinking"] = thinking  # as the run's policy is prompted in training (`Policy.prompt`)
    else:
        path = name
    model, tokenizer = _load(path)
    options: dict[str, Any] = {"do_sample": True, "temperature": temperature} if temperature > 0 else {
        "do_sample": False}
    if tokenizer.chat_template:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                            return_dict=True, **template)["input_ids"]
    else:
        ids = tokenizer(plain_text(messages), return_tensors="pt")["input_ids"]
        if schema is None:  # held to a schema, the answer ends with its object (a raw newline cannot occur)
            # A base model goes on to write the next turn itself: stop there.
            options["stopping_criteria"] = StoppingCriteriaList([_StopAt(NEXT_TURNS, tokenizer, ids.shape[1])])
    ids = ids.to(model.device)
    if schema is not None:
        options["logits_processor"] = LogitsProcessorList([Constrain(schema, path)])
        # The grammar ends the answer with the tokenizer's end-of-sequence: generation must stop on it too.
        eos = model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos:
            eos.append(tokenizer.eos_token_id)
        options["eos_token_id"] = eos
    torch.manual_seed(seed)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                             pad_token_id=pad, **options)
    text = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    if not tokenizer.chat_template and schema is None:
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


# A JSON answer in the form the prompt shows the current config in (", " and ": "), and no other whitespace:
# a base model held to a schema would otherwise fill its token budget with spaces and newlines.
JSON_FORM = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class Constrain:
    """A logits processor that holds one generation to a JSON schema (llguidance, batch of one).

    Before every new token it feeds the grammar the token chosen last, asks which tokens may come next and
    sets every other logit to -inf; transformers applies it before temperature and top-k/top-p, so sampling
    only ever sees legal tokens. Once the object is complete only end-of-sequence remains allowed."""

    def __init__(self, schema: Schema, path: str):
        llguidance = _llguidance()
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_FORM)
        self.matcher = llguidance.LLMatcher(_grammar_tokenizer(path), grammar)
        if self.matcher.is_error():
            raise LLMError(f"the JSON schema cannot constrain decoding: {self.matcher.get_error()}")
        self.start: int | None = None

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import numpy as np
        import torch

        if self.start is None:
            self.start = input_ids.shape[1]
        elif not self.matcher.is_stopped():
            self.matcher.consume_token(int(input_ids[0, -1]))
        if self.matcher.is_error():  # cannot happen while every token is drawn from the mask; say so if it does
            raise LLMError(f"constrained decoding lost the grammar: {self.matcher.get_error()}")
        bits = np.unpackbits(np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
        allowed = np.zeros(scores.shape[-1], dtype=bool)
        n = min(len(bits), scores.shape[-1])
        allowed[:n] = bits[:n].astype(bool)
        return scores.masked_fill(~torch.from_numpy(allowed).to(scores.device), float("-inf"))


def _llguidance() -> Any:
    try:
        import llguidance
        import llguidance.hf
    except ImportError as err:
        raise LLMError("constrained decoding needs the package 'llguidance' (pip install llguidance)") from err
    return llguidance


@lru_cache(maxsize=2)
def _grammar_tokenizer(path: str) -> Any:
    """llguidance's view of a loaded model's tokenizer (a second or so for Gemma's 262k tokens: once per model)."""
    try:
        return _llguidance().hf.from_tokenizer(_load(path)[1])
    except ValueError as err:  # a slow (Python) tokenizer
        raise LLMError(f"constrained decoding needs a fast tokenizer; {path!r}: {err}") from err


@lru_cache(maxsize=2)  # the policy checkpoint changes every stage: keep the last two, not all of them
def _load(spec: str):
    """A model and its tokenizer as `training.policy.load_policy` reads a policy spec: `gemma3-270m` and `tiny` as
    the lab names them (the offline Gemma checkpoint, the shipped folder), a folder, else a hub name; on this
    process's device (`local_device`: the worker's GPU, else the CPU) in the dtype a policy loads in there."""
    from training.gemma import GemmaUnavailable
    from training.policy import PolicyError, load_policy, local_device

    try:
        policy = load_policy(spec, device=local_device())
    except (PolicyError, GemmaUnavailable, OSError, ValueError) as err:
        raise LLMError(f"could not load the model {spec!r}: {str(err).splitlines()[0]}") from err
    policy.model.eval()
    return policy.model, policy.tokenizer


# ---------------------------------------------------------------- over HTTP (OpenAI-compatible)


# (URL, model) of servers that refused `response_format` in this process: asked plainly from then on.
_NO_STRUCTURED: set[tuple[str, str]] = set()
REFUSALS = (400, 422)  # the statuses a server answers a request field it does not take with


def _server(url: str) -> tuple[str, str, int | None, str]:
    """(scheme, host, port, path) of a server URL, as two spellings of one server share them."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme.lower())
    except ValueError:  # a port that is not a number
        return ("", url, None, "")
    return parts.scheme.lower(), (parts.hostname or ""), port, _normal_path(parts.path)


def _normal_path(path: str) -> str:
    """A URL path as the server reads it: percent-escapes decoded, `.` and `..` resolved, no trailing slash, so
    `/v1/../../admin` is `/admin`, not a path under `/v1`."""
    clean = posixpath.normpath("/" + unquote(path).lstrip("/"))
    return "" if clean == "/" else clean


def _allows(entry: tuple[str, str, int | None, str], url: tuple[str, str, int | None, str]) -> bool:
    """Whether an allowed server covers `url`: same scheme, host and port, and a path at or under its path."""
    return entry[:3] == url[:3] and bool(entry[1]) and (url[3] + "/").startswith(entry[3] + "/")


def allowed_servers() -> list[tuple[str, str, int | None, str]]:
    """The servers this machine lets the lab's key and data go to: `ENVLAB_ALLOWED_SERVERS` (comma separated)
    and `ENVLAB_OPENAI_BASE_URL` (with `allow_server`'s additions, which live in the first)."""
    listed = [u for u in os.environ.get(ALLOWED_SERVERS_SETTING, "").split(",") if u.strip()]
    default = os.environ.get(BASE_URL_SETTING, "").strip()
    return [_server(u) for u in [*listed, *([default] if default else [])]]


# A URL's user information: what stands between `scheme://` (or the start) and the last `@` before its path.
_USERINFO = re.compile(r"^(\s*(?:[A-Za-z][A-Za-z0-9+.-]*:)?//)?[^/?#@]*(?:@[^/?#@]*)*@")


def shown_url(url: str) -> str:
    """`url` as the lab may write it anywhere: without its user name and password."""
    return _USERINFO.sub(lambda m: m[1] or "", url.strip())


def _no_password(url: str) -> None:
    if _USERINFO.match(url):
        raise LLMError(f"server URL {shown_url(url)!r:.120} carries a user name or password (user:...@): the lab "
                       f"never stores or sends them; give the URL without them and the key as "
                       f"${KEY_SETTINGS[0]}")


def allow_server(url: str) -> None:
    """Allow `url` for this process and the workers it starts: a `--base-url` given on this machine's command
    line is this machine's choice. A URL with a password in it is refused (`LLMError`)."""
    _no_password(url)
    if not any(_allows(entry, _server(url)) for entry in allowed_servers()):
        listed = os.environ.get(ALLOWED_SERVERS_SETTING, "").strip()
        os.environ[ALLOWED_SERVERS_SETTING] = f"{listed},{url.strip()}" if listed else url.strip()


def check_server(url: str) -> None:
    """Refuse a server URL this machine does not allow (`allowed_servers`), or one with a user name or password in
    it, in one line that says what to do instead."""
    _no_password(url)
    if not any(_allows(entry, _server(url)) for entry in allowed_servers()):
        raise LLMError(f"server URL {url.strip()!r:.120} is not one this machine allows, so the lab's API key and "
                       f"data are not sent there: list it in ${ALLOWED_SERVERS_SETTING} (comma separated), or give "
                       f"it as ${BASE_URL_SETTING} or --base-url on this machine's command line")


def _openai(name: str, messages: Messages, *, max_tokens: int, temperature: float, seed: int,
            base_url: str | None, timeout: float, schema: Schema | None = None, **_: Any) -> str:
    base = base_url or os.environ.get(BASE_URL_SETTING)
    if not base:
        raise LLMError(f"openai:{name} needs a base URL (e.g. http://127.0.0.1:8000/v1) or ${BASE_URL_SETTING}")
    check_server(base)
    url = base.rstrip("/") + "/chat/completions"
    headers = {"Content-Type": "application/json"}
    key = next((os.environ[k] for k in KEY_SETTINGS if os.environ.get(k)), None)
    if key:
        headers["Authorization"] = f"Bearer {key}"
    body: dict[str, Any] = {"model": name, "messages": messages, "max_tokens": max_tokens,
                            "temperature": temperature, "seed": seed}
    if schema is not None and (url, name) not in _NO_STRUCTURED:
        structured = {**body, "response_format": response_format(schema)}
        response = _post(url, structured, headers, timeout)
        if response.status_code in REFUSALS and "response_format" in response.text:
            _NO_STRUCTURED.add((url, name))
            log.warning("%s refused structured output for %s (HTTP %d: %s); asking without a schema from now on",
                        url, name, response.status_code, _snippet(response.text, 120))
            response = _post(url, body, headers, timeout)
    else:
        response = _post(url, body, headers, timeout)
    return _completion(url, response)


def response_format(schema: Schema) -> dict[str, Any]:
    """The OpenAI `response_format` asking for one JSON object of `schema`; strict (the server must keep to it,
    and checks the schema is in the subset it can enforce: closed objects, every property required)."""
    return {"type": "json_schema",
            "json_schema": {"name": str(schema.get("title") or "answer").replace(" ", "_")[:64], "strict": True,
                            "schema": schema}}


@dataclass(frozen=True)
class Reply:
    """What a server answered: its status and its body, read up to `REPLY_LIMIT` bytes."""

    status_code: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


def _post(url: str, body: dict[str, Any], headers: dict[str, str], timeout: float) -> Reply:
    """POST `body` and read the reply as it streams in, stopping past `REPLY_LIMIT` bytes (an `LLMError`)."""
    import httpx

    try:
        with httpx.stream("POST", url, json=body, headers=headers, timeout=timeout) as response:
            chunks, size = [], 0
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > REPLY_LIMIT:
                    raise LLMError(too_big(url))
                chunks.append(chunk)
            return Reply(response.status_code, b"".join(chunks))
    except httpx.TimeoutException as err:
        raise LLMError(f"{url} timed out after {timeout:g} s ({type(err).__name__})") from err
    except httpx.HTTPError as err:
        raise LLMError(f"could not reach {url}: {err or type(err).__name__}") from err


def _completion(url: str, response: Reply) -> str:
    if response.status_code != 200:
        raise LLMError(f"{url} answered HTTP {response.status_code}: {_snippet(response.text)}")
    try:
        data = json.loads(response.body)
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
