"""What the tests run on this machine beside themselves: free TCP ports, Debian's Chromium (its path, flags and
what is missing), a tiny random chat model that `transformers serve` and the in-process backend can load, and
the messages and evidence the engineer tests send it."""

from __future__ import annotations

import importlib.util
import random
import shutil
import socket
from pathlib import Path

from envsim.config import EnvConfig
from envsim.scoring import Tally
from lab.context import Evidence, StageResult

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--disable-sync"]
FIRST_PORT = 20_000  # the lowest port a test server is given: above the ports of well-known services
TIMEOUT_MS = 20_000  # how long a browser test waits for one thing on the page


_GIVEN: set[int] = set()  # the ports this process was given


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing holds now, drawn below the kernel's ephemeral range.

    A port the kernel hands out itself (`bind(0)`) is in that range, so between this call and the server's own
    bind any process's outgoing connection can take it: a browser test's page once failed to start that way
    ("Cannot find empty port") while a stage trained beside it. Below the range only a listener takes a port."""
    low = ephemeral_ports()[0]
    top = low if low > FIRST_PORT + 1 else 65536  # a kernel range from FIRST_PORT down: draw from every port
    draws = random.SystemRandom()
    for _ in range(200):
        port = draws.randrange(FIRST_PORT, top)
        if port in _GIVEN:  # two servers asked for at once get two ports
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # a listener has it
                continue
        _GIVEN.add(port)
        return port
    raise OSError(f"no free TCP port in {FIRST_PORT}..{top - 1} after 200 draws")


def ephemeral_ports(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> tuple[int, int]:
    """The kernel's range for outgoing connections' ports (Linux's default where it cannot be read)."""
    try:
        low, high = map(int, path.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def chromium_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is not installed (pip install -e '.[dev]')"
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        return "Chromium is not installed (apt-get install chromium)"
    return None


def chromium_path() -> str:
    return CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")


def goto(page, url: str, tries: int = 3) -> None:
    """`page.goto(url)`, asked again when Chromium aborts the load (`net::ERR_ABORTED`: seen once in hundreds
    of loads, with a stage training beside the page); any other error, or the last try's, is raised."""
    from playwright.sync_api import Error

    for left in range(tries - 1, -1, -1):
        try:
            page.goto(url)
            return
        except Error as e:
            if left == 0 or "net::ERR_ABORTED" not in str(e):
                raise


def evidence() -> Evidence:
    """The smallest evidence an engineer is asked about: stage 0 on 3x3 boards, 1 of 4 valid."""
    config = EnvConfig.default((3, 4))
    return Evidence(StageResult(0, config, {3: Tally(4, 1, 1, {"hole": 3})}), round_index=1, rounds_left=2)


MESSAGES = [{"role": "user", "content": "Propose a config."}]
CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")


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
