"""The schema of a run's settings (`Run.settings`): one description for the code that writes them (`lab.loop.
create_run`) and the code that must vouch for them (`lab.archive`, a run from another lab). Kept light, with no
torch behind it, so an archive is checked without loading the training stack."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from training.overrides import lab_owned
from training.probe import PROBE_ANSWERS, PROBE_BOARDS


class RunSettings(BaseModel):
    """The shape of `Run.settings`, as `create_run` writes it and the loop, the stage and the pages read it.

    A run's settings can arrive in another lab's archive (lab.archive checks them with this before anything is
    stored), so every key the lab reads has its type here; a key the lab does not read travels as it is.
    """

    model_config = ConfigDict(strict=True, extra="allow")

    stages: int = Field(ge=1)
    auto_apply: bool = False
    grpo: dict[str, Any] = Field(default_factory=dict)
    lora: int = Field(default=0, ge=0)
    context: dict[str, bool] | None = None  # lab.context.ContextModules's fields (read there, with torch behind it)
    context_preset: str | None = None
    base_url: str | None = None
    validation_boards: int | None = Field(default=None, ge=1)
    validation_per_size: int | None = Field(default=None, ge=1)
    probe_boards: int | None = Field(default=None, ge=1, le=64)  # the Measure panel's and the llm engineer's probe
    probe_answers: int | None = Field(default=None, ge=2, le=64)  # (None: training.probe's defaults)
    thinking: Literal["off", "on"] = "off"  # a chat template's `enable_thinking` (Qwen3's reasoning before the answer)
    completion_length: int | None = Field(default=None, ge=1, le=32768)  # new tokens per answer (None: by board)
    validation_decoding: Literal["greedy", "sampled"] = "greedy"  # sampled: the model's own generation_config
    engineer_history: list[dict[str, Any]] = Field(default_factory=list)
    example: bool = False

    @field_validator("grpo")
    @classmethod
    def _grpo(cls, value: dict[str, Any]) -> dict[str, Any]:
        if owned := lab_owned(value):
            raise ValueError(f"sets {', '.join(owned)}: the lab sets these itself (a run's files stay in its folder)")
        return value


def probe_size(settings: dict[str, Any]) -> dict[str, int]:
    """B boards per size and K answers each for a run's probes: its settings, else `training.probe`'s defaults."""
    return {"boards": settings.get("probe_boards") or PROBE_BOARDS,
            "answers": settings.get("probe_answers") or PROBE_ANSWERS}

