"""Where the policy a run names is, and whether a model hub may be asked for it: decided without loading a
weight, so a run that names a policy this machine cannot load is refused when it is created (`lab.loop.
create_run`), in one line that names it, instead of failing in a worker minutes later.

Nothing here, or in a job's process (`offline_env`), contacts a model hub unless the person allows downloads:
`ENVLAB_ALLOW_DOWNLOADS=1`, and even then never while `HF_HUB_OFFLINE` says offline. Kept light (no torch), as
the worker and `create_run` read it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

DOWNLOADS_SETTING = "ENVLAB_ALLOW_DOWNLOADS"
ASSETS = Path(__file__).resolve().parent.parent / "assets"
TINY_DIR = ASSETS / "tiny-policy"
# The policies shipped in assets/, by name: `tiny` plays 2 to 5 agents; `tiny-2agent`, the earlier `tiny`, was
# warm-started on 2 agents only (what every run stored before the 2-to-5-agent one shipped was made with).
SHIPPED = {"tiny": TINY_DIR, "tiny-2agent": ASSETS / "tiny-2agent-policy"}
GEMMA = "gemma3-270m"
GEMMA_PARAMS = 268_000_000
_TRUE = ("1", "true", "yes", "on")


class PolicyUnavailable(ValueError):
    """A policy this machine cannot load; the message names it and says what would make it loadable."""


def downloads_allowed() -> bool:
    """Whether a model hub may be asked for weights: `ENVLAB_ALLOW_DOWNLOADS=1`, and `HF_HUB_OFFLINE` not set."""
    return (os.environ.get(DOWNLOADS_SETTING, "").lower() in _TRUE
            and os.environ.get("HF_HUB_OFFLINE", "").lower() not in _TRUE)


def offline_env() -> dict[str, str]:
    """The variables that keep a job's process off every model hub, unless downloads are allowed."""
    return {} if downloads_allowed() else {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _looks_like_path(spec: str) -> bool:
    return spec.startswith((".", "/", "~")) or spec.count("/") > 1


def _cached(name: str) -> str | None:
    """The local copy of hub model `name`'s config.json in the Hugging Face cache, if one was downloaded before."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(name, "config.json")
    except ValueError:  # not a valid repository name
        return None
    return found if isinstance(found, str) else None


def resolve_policy(spec: str, *, build: bool = False) -> str:
    """The folder that holds policy `spec` (`tiny`: the shipped one; `gemma3-270m`: its converted folder, or
    the spec itself while it is not converted yet, unless `build` converts it now; a folder with config.json),
    or a hub name that loads here (in the local cache, or downloads allowed). Raises PolicyUnavailable naming
    `spec` otherwise."""
    if spec in SHIPPED:
        return str(SHIPPED[spec])
    if spec == GEMMA:
        from training.gemma import GemmaUnavailable, _require, cache_root

        folder = cache_root() / GEMMA
        if (folder / "config.json").is_file():
            return str(folder)
        try:
            if build:
                from training.gemma import gemma_checkpoint

                return str(gemma_checkpoint())
            _require()
        except GemmaUnavailable as err:
            raise PolicyUnavailable(f"policy {spec!r}: {err}") from None
        return spec  # converted from its package on first load (training.gemma)
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise PolicyUnavailable(f"policy {spec!r}: the folder {path} has no config.json (not a model checkpoint)")
        return str(path.resolve())
    if _looks_like_path(spec) or not spec.strip():
        raise PolicyUnavailable(f"policy {spec!r}: no such folder")
    if _cached(spec) is not None or downloads_allowed():
        return spec
    raise PolicyUnavailable(f"policy {spec!r}: not a local folder with config.json, and model-hub downloads are off "
                            f"(set {DOWNLOADS_SETTING}=1 to let envlab fetch it from the Hugging Face hub)")


def policy_params(spec: str) -> int | None:
    """About how many parameters policy `spec` has, read without loading it: its weight files' size over the
    bytes per weight its config names, or a size in its name (`Qwen3-4B`, `gemma3-270m`); None when unknown."""
    if spec in SHIPPED:
        return 1_400_000
    if spec == GEMMA:
        return GEMMA_PARAMS
    path = Path(spec).expanduser()
    if not path.is_dir() and (cached := _cached(spec)) is not None:
        path = Path(cached).parent
    if path.is_dir():
        files = list(path.glob("*.safetensors")) or list(path.glob("*.bin"))
        if files:
            try:
                dtype = json.loads((path / "config.json").read_text()).get("torch_dtype") or "float32"
            except (OSError, ValueError, AttributeError):
                dtype = "float32"
            width = 4 if "32" in str(dtype) else 2
            return sum(f.stat().st_size for f in files) // width
    found = re.search(r"(\d+(?:\.\d+)?)\s*([bBmM])\b", spec.replace("_", "-").split("/")[-1] + " ")
    if found:
        return int(float(found.group(1)) * (1e9 if found.group(2) in "bB" else 1e6))
    return None
