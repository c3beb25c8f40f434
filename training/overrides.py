"""Which GRPOConfig fields a run's `settings["grpo"]` may not set: the lab owns them.

A run's settings can come from another lab's archive. Fields that name a place to write (the trainer's
folder, its logs), a place to read (a checkpoint to resume from) or somewhere to send the weights (the Hub)
would let those settings reach outside the run's own folder, so the stage sets them itself and an override
of any of them is refused, when a run is created, when an archive is imported and when a stage starts.
Kept apart from `training.stage` so that checking settings loads no torch.
"""

from __future__ import annotations

from typing import Any

LAB_OWNED = frozenset({
    "output_dir", "logging_dir", "resume_from_checkpoint", "push_to_hub", "hub_model_id", "hub_token",
    "hub_strategy", "hub_private_repo", "hub_always_push", "hub_revision", "deepspeed", "fsdp_config",
})


def lab_owned(overrides: dict[str, Any]) -> list[str]:
    """The keys of `overrides` that the lab sets itself (sorted); empty when the overrides may be used."""
    return sorted(set(overrides) & LAB_OWNED)
