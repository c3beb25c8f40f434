"""A run's GRPO overrides checked as TRL reads them, once, before a run or an experiment is stored.

`storage.settings.RunSettings` checks what needs no training stack (each field one a run may set,
`storage.settings.GRPO_FIELDS`); this checks the rest: each override by its type in `GRPOConfig`'s own
annotations, strictly (8.0 is no int, true is no number, "0.1" is no float), then the whole config built as a
stage builds it (`training.stage.grpo_config`: a field the installed TRL lacks is refused there) and a stage's
steps counted from it, so what TRL would refuse in the middle of a stage is refused before anything depends on it.
"""

from __future__ import annotations

import importlib.util
import types
import typing
from functools import cache
from typing import Any

from pydantic import TypeAdapter, ValidationError

from storage.settings import RunSettings, SettingsError


@cache
def _annotations() -> dict[str, Any]:
    from trl import GRPOConfig

    return typing.get_type_hints(GRPOConfig)


def _type_name(hint: Any) -> str:
    """`int | None` as "int", `float` as "float", `str | list[str]` as "str or list[str]"."""
    parts = typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union \
        else (hint,)
    names = [getattr(p, "__name__", None) if typing.get_origin(p) is None else str(p).replace("typing.", "")
             for p in parts if p is not type(None)]
    return " or ".join(n or str(p) for n, p in zip(names, parts, strict=False))


def check_grpo(settings: RunSettings, instances: int, policy: str, processes: int = 1) -> int:
    """The steps a stage of `instances` boards takes with `settings.grpo` on `policy`'s defaults, launched on
    `processes` processes (the GPUs of the worker that trains it), or a SettingsError naming the override TRL would
    refuse there and why (`training.stage.planned_config`: what one process refuses, two may take)."""
    from training.policy import prompt_style_of  # torch loads here, for the commands that create runs
    from training.stage import StageError, planned_steps

    hints = _annotations()
    for key, value in settings.grpo.items():
        if key not in hints:
            continue  # grpo_config names every unknown field at once
        try:
            TypeAdapter(hints[key]).validate_python(value, strict=True)
        except ValidationError:
            raise SettingsError(f"grpo {key} = {value!r}: GRPOConfig's {key} is of type "
                                f"{_type_name(hints[key])}", f"grpo.{key}") from None
    unknown = sorted(key for key in settings.grpo if key not in hints)
    try:
        return planned_steps(instances, settings.grpo, prompt_style_of(policy), processes)
    except (StageError, ValueError, TypeError, ArithmeticError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise SettingsError(first if isinstance(err, StageError) else f"grpo settings {settings.grpo}: {first}",
                            f"grpo.{unknown[0]}" if unknown else None) from None


def check_memory(settings: RunSettings, config: Any, policy: str, needs_gpu: bool = False) -> None:
    """Refuse a run whose stages cannot fit this machine's device, in one line naming a setting that would
    (`training.stage.memory_refusal`), before it is stored, instead of a stage killed by the kernel minutes into a
    run. Not checked: a shipped policy (its model is about a million parameters: any batch of its budget fits), nor
    a run whose jobs `needs_gpu` on a machine without one (they wait for a GPU worker elsewhere, whose memory is not
    known here; its stage checks itself before it trains)."""
    from training.resolve import SHIPPED

    if policy in SHIPPED:
        return
    import torch  # here, not for a shipped policy: a run of the tiny policy is made without it

    if needs_gpu and not torch.cuda.is_available():
        return
    from training.stage import memory_refusal

    if (why := memory_refusal(settings, config, policy)) is not None:
        raise SettingsError(f"{policy}: a stage {why}")


# The packages a setting needs beyond the base install, with the extra that installs each (pyproject.toml).
EXTRAS = {"peft": "lora", "vllm": "vllm", "submitit": "slurm", "trackio": "track", "wandb": "wandb"}


def check_packages(settings: RunSettings) -> None:
    """Refuse settings that need a package this install lacks, naming the extra that installs it, before a run
    depends on them (LoRA needs peft, `use_vllm` needs vLLM, `report_to` a tracker its package), instead of failing
    a stage minutes later."""
    from training.trackers import reported

    needs = [("peft", f"lora = {settings.lora} (LoRA adapters)")] if settings.lora else []
    if settings.overrides.use_vllm:
        needs.append(("vllm", "grpo use_vllm = True (vLLM generation)"))
    report_to = settings.overrides.report_to
    needs += [(tracker, f"grpo report_to = {report_to!r}") for tracker in reported(report_to)]
    for package, setting in needs:
        if not installed(package):
            raise SettingsError(f"{setting} needs the {package} package, which is not installed: "
                                f"pip install 'envlab[{EXTRAS[package]}]'")


def installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def check_slurm_package() -> None:
    """Workers on Slurm are submitted with submitit: refused in one line where it is not installed."""
    if not installed("submitit"):
        raise SettingsError("workers on Slurm need the submitit package, which is not installed: "
                            "pip install 'envlab[slurm]'")
