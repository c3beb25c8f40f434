"""One stage of a run: GRPO (TRL) on the stage's environment config, then evaluation on the validation set.

Reads top to bottom as the stage does: config, data, rewards, trainer, save, record.

Why it is this short: TRL's `GRPOTrainer` is the algorithm (group-relative advantages, clipping, KL,
generation, checkpoints, logging to Trackio/W&B/TensorBoard), and `GRPOConfig` is the training config.
A run's `settings.grpo` holds `GRPOConfig` field overrides that are passed straight through on top of
the few defaults below (the ones a CPU or a tiny model needs); nothing here re-declares TRL's fields. What
is ours is `StageArgs` (where the stage lives, its seed, its starting policy and its `EnvConfig`), the
data (boards from `envsim.generate` with the stage's seed, beside any boards its proposal replays as they are,
`stage_boards`, as prompts plus the board's JSON that the rewards read), the reward functions
(`training.rewards`), a callback that writes TRL's logs into the lab's database (with TRL's advantages per agent
count and map size of the boards, `training.advantage`), reports progress and stops the trainer when someone
cancels the job, and, for a run that reports to Trackio or W&B, transformers' callbacks for them logging every
stage into the run's one tracker run on one step axis (`training.trackers`).

Files of a run live in `<runs root>/<run uuid>/` (`storage.db.runs_root`: `$ENVLAB_RUNS`, else the SQLite
file's folder): stage `k`'s trained policy in `stage-<k>/policy/` (an ordinary Hugging Face folder that
`training.policy.load_policy` reads back; the stage row stores it relative to the runs root) and TRL's own
checkpoints in `stage-<k>/trl/checkpoint-<step>/`. A stage attempt that finds a TRL checkpoint there (the
worker died, or the job was cancelled and requeued) resumes from it with the optimizer, scheduler and data
order as they were, and the dead attempt's training-log rows past that step are replaced by the new ones.
`stage-<k>/trained.json` marks a finished training; it names its run and stage config, and an attempt adopts
only a marker written for its own.

Stage 0 is not trained: it evaluates the run's starting policy, once per database where several runs would
answer the same boards with it in the same way (`training.shared`: the others copy the episodes). Multi-GPU
stages run outside the worker under `accelerate launch -m training.stage` (docs/worker.md).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib.util
import json
import logging
import math
import os
import re
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from sqlalchemy import Engine
from sqlmodel import delete, select
from transformers import TrainerCallback
from transformers.integrations import TrackioCallback, WandbCallback
from transformers.integrations.integration_utils import rewrite_logs
from transformers.trainer_callback import PrinterCallback
from transformers.trainer_utils import get_last_checkpoint
from trl import GRPOConfig, GRPOTrainer

from envsim.config import EnvConfig
from envsim.generator import generate, stage_seed
from envsim.instance import Instance
from envsim.scoring import Tally
from envsim.suite import VALIDATION_AGENTS, VALIDATION_PER_SIZE, Split, build
from storage.db import RUNS_SETTING, UnsafePath, checkpoint_of, make_engine, run_folder, runs_root, session, stage_at
from storage.models import Job, Run, Stage, StageMetric, StageStatus, TrainingLog, utcnow
from storage.payloads import StagePayload
from storage.settings import RunSettings
from training import advantage, decode, memory, shared, trackers, vllm
from training import evaluate as evaluation
from training.policy import Decoder, Policy, PolicyError, load_policy, local_device, lora_config, policy_folder
from training.progress import Cancelled, Progress
from training.resolve import SHIPPED
from training.rewards import DEFAULT_WEIGHTS, REWARDS
from training.tokenizer import is_compact

log = logging.getLogger("envlab.stage")


class StageError(RuntimeError):
    """A stage cannot run as asked (missing rows, no starting checkpoint, bad settings); the message says why."""


# ---------------------------------------------------------------- config


DEFAULT_SETTINGS = RunSettings(stages=1)  # a stage outside any run (a benchmark's, a count of steps): every default


@dataclass(frozen=True)
class StageArgs:
    """What a stage needs beyond TRL's config: where it lives, its seed, where it starts, what it trains on."""

    run_id: int
    stage_index: int
    seed: int
    policy: str  # the starting checkpoint: the previous stage's, or the run's policy spec for stage 0
    config: EnvConfig
    run_dir: Path  # <runs root>/<run uuid>
    run_uuid: str
    settings: RunSettings = DEFAULT_SETTINGS  # the run's (LoRA, validation and dev sets, decoding, lengths...)
    run_seed: int = 0  # the run's seed (`seed` is the stage's): a run drawn per seed reads the dev set of this one
    replay: tuple[Instance, ...] = ()  # boards trained on as they are (`Stage.replay`), the rest drawn from `config`

    @property
    def lora(self) -> int:
        """LoRA rank for training; 0: every weight trains."""
        return self.settings.lora

    @property
    def validation_boards(self) -> int | None:
        """How many of the validation boards to evaluate on (None: every one)."""
        return self.settings.validation_boards

    @property
    def validation_per_size(self) -> int:
        """The validation set's boards per map size (30: the standard 240)."""
        return self.settings.validation_per_size or VALIDATION_PER_SIZE

    @property
    def validation_agents(self) -> tuple[int, ...]:
        """The agent counts of the validation and dev boards."""
        return self.settings.validation_agents

    @property
    def dev_per_size(self) -> int | None:
        """Dev boards per map size, the ones the engineers read (None: no dev set)."""
        return self.settings.dev_per_size

    @property
    def dev_seed(self) -> int | None:
        """The run seed its dev set is drawn for, the same at every stage (None: the dev set every seed shares)."""
        return self.run_seed if self.settings.dev_per_seed else None

    @property
    def decoding(self) -> str:
        """How validation decodes: greedy, or sampled as the model's own generation_config says."""
        return self.settings.validation_decoding

    @property
    def stage_dir(self) -> Path:
        return self.run_dir / f"stage-{self.stage_index}"

    @property
    def policy_dir(self) -> Path:
        return self.stage_dir / "policy"

    @property
    def trainer_dir(self) -> Path:
        return self.stage_dir / "trl"

    @property
    def trained_marker(self) -> Path:
        return self.stage_dir / "trained.json"

    @property
    def stored_checkpoint(self) -> str:
        """The trained policy's folder as the stage row stores it: relative to the runs root."""
        return f"{self.run_uuid}/stage-{self.stage_index}/policy"

    def marker_key(self) -> dict[str, Any]:
        """What a trained-stage marker must name for this stage to adopt it."""
        key = {"run_uuid": self.run_uuid, "stage_index": self.stage_index,
               "config": self.config.model_dump(mode="json")}
        return key | ({"replay": [board.id for board in self.replay]} if self.replay else {})

    def adoptable_marker(self) -> dict[str, Any] | None:
        """The summary an earlier attempt of this very stage left, or None (no marker, or another's)."""
        if not self.trained_marker.is_file():
            return None
        try:
            marker = json.loads(self.trained_marker.read_text())
        except ValueError:
            return None
        key = self.marker_key()
        if any(marker.get(k) != v for k, v in key.items()):
            return None
        return {k: v for k, v in marker.items() if k not in key}  # the training summary


# GRPO settings by the policy's prompt style, over TRL's defaults. For a pretrained LLM (chat): 4 generations per
# board in batches of 8 completions, TRL's learning rate for LLMs. For the tiny policy (compact), measured on
# 3-stage runs with the heuristic engineer (docs/training.md): 8 generations in batches of 32 (4 boards a
# step), rewards centred per group but not divided by the group's spread, and a small learning rate. With TRL's
# scaling, a group whose answers differ only by a little shaped reward (all invalid, one agent home in some)
# weighs as much as one that tells a valid plan from an invalid one, and at 1e-4 Adam turns that noise into
# steps of full size: the valid rate fell (53.3% -> 51.7%). These settings raised it (53.3% -> 58.3%).
STYLE_DEFAULTS: dict[str, dict[str, Any]] = {
    "chat": dict(num_generations=4, per_device_train_batch_size=8, learning_rate=1e-6),
    "compact": dict(num_generations=8, per_device_train_batch_size=32, learning_rate=2e-5, scale_rewards="none"),
}


def grpo_config(args: StageArgs, overrides: dict[str, Any], max_completion_length: int,
                prompt_style: str = "chat", tracking: trackers.Tracking | None = None,
                longest_prompt: int | None = None) -> GRPOConfig:
    """TRL's config: our defaults for this machine and task, then the run's `settings.grpo` on top.

    Defaults: CPU without CUDA; bf16 autocast only for a chat model on a bf16 GPU (the tiny policy stays in float32:
    docs/training.md says why); activation checkpointing for every chat model, on a CPU too (without it Gemma 270M's
    layers keep about 15 GB for a batch of 8 answers of 512 tokens, more than this 24 GiB machine can give it beside
    the fused head's tiles: `training.memory`, docs/training.md); one epoch over the stage's boards; generations, batch,
    learning rate and reward scaling by prompt style (`STYLE_DEFAULTS`); a completion budget from the board sizes;
    a log line per step; a TRL checkpoint every 50 steps (2 kept); the stage's seed; `training.rewards`'s weights;
    TRL's `report_to` with the lab's Trackio project (`training.trackers`); `use_vllm` honoured where vLLM imports,
    a colocated engine's context the `longest_prompt` (tokens, where known) plus the completion (`vllm.vllm_fields`).
    """
    known = {f.name for f in dataclasses.fields(GRPOConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise StageError(f"settings['grpo'] has {', '.join(map(repr, unknown))}: not GRPOConfig fields")
    cuda = torch.cuda.is_available()
    large = cuda and prompt_style == "chat"
    fields: dict[str, Any] = dict(
        output_dir=str(args.trainer_dir),
        use_cpu=not cuda,
        bf16=large and torch.cuda.is_bf16_supported(),
        activation_checkpointing=prompt_style == "chat",
        num_train_epochs=1,
        **STYLE_DEFAULTS[prompt_style],
        max_completion_length=max_completion_length,
        logging_steps=1,
        save_strategy="steps",
        save_steps=50,
        save_total_limit=2,
        seed=args.seed,
        reward_weights=list(DEFAULT_WEIGHTS),
        disable_tqdm=True,
        **(tracking.fields() if tracking is not None else {}),
    )
    fields = {**installed_fields(fields, known), **overrides}
    if fsdp_checkpoints():  # FSDP's own checkpointing does it (assets/accelerate/fsdp.yaml); both at once are refused
        fields = {**fields, **installed_fields({"activation_checkpointing": False}, known)}
    fields = vllm.vllm_fields(fields, longest_prompt=longest_prompt)
    if fields.get("use_vllm") and importlib.util.find_spec("vllm") is None:
        log.warning("use_vllm was asked for but vLLM is not installed (pip install 'envlab[vllm]'): "
                    "generating with transformers")
        fields["use_vllm"] = False
    return GRPOConfig(**fields)


def fsdp_checkpoints() -> bool:
    """Whether this process runs under an FSDP launch that checkpoints activations itself (the lab's fsdp.yaml)."""
    return os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true" \
        and os.environ.get("FSDP_ACTIVATION_CHECKPOINTING", "").lower() == "true"


# A lab default under the name an older transformers gives it (`activation_checkpointing` is new in 5.23).
OLDER_NAMES = {"activation_checkpointing": "gradient_checkpointing"}


def installed_fields(fields: dict[str, Any], known: set[str]) -> dict[str, Any]:
    """The lab's defaults as the installed `GRPOConfig` takes them: a field it lacks goes by its older name, or is
    left out when it is off (a default that is on and has no name there is an error, not a silent change)."""
    out = {}
    for name, value in fields.items():
        if name in known:
            out[name] = value
        elif OLDER_NAMES.get(name) in known:
            out[OLDER_NAMES[name]] = value
        elif value:
            raise StageError(f"the installed TRL/transformers has no {name!r} (nor an older name for it)")
    return out


def planned_config(instances: int, overrides: dict[str, Any], prompt_style: str = "chat",
                   processes: int = 1) -> GRPOConfig:
    """The `GRPOConfig` a stage of `instances` boards builds under a launch of `processes` processes, as far as its
    batches go, built here in one process.

    A config built outside a launch sees one process (`world_size` 1), and TRL derives the generation batch and
    checks its divisibility against the global batch, `per_device_train_batch_size x world_size`. N processes of
    per-device batch b batch exactly as one process of batch N x b does (the generation batch, the steps per
    generation, every check: 16 generations with a per-device batch of 8 are refused on one process and valid on
    two), so that is the config built here; per-device figures of the launch are N times smaller."""
    args = StageArgs(run_id=0, stage_index=1, seed=0, policy="", config=EnvConfig.default(num_instances=instances),
                     run_dir=Path(os.devnull), run_uuid="")
    if processes < 1:
        raise StageError(f"processes = {processes}: a stage runs on at least one process")
    if processes > 1:
        defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
        overrides = {**overrides, **{key: processes * overrides.get(key, STYLE_DEFAULTS[prompt_style].get(
            key, defaults[key])) for key in ("per_device_train_batch_size", "per_device_eval_batch_size")}}
    return grpo_config(args, overrides, max_completion_length=1, prompt_style=prompt_style)


def planned_steps(instances: int, overrides: dict[str, Any], prompt_style: str = "chat", processes: int = 1) -> int:
    """The optimizer steps a stage of `instances` boards takes on `processes` processes (`accelerate launch
    --num_processes`), counted as TRL counts them, without training.

    TRL repeats each board `num_generations` times and drops a last generation batch that is not full, so one
    epoch is `floor(instances / boards per generation batch) * boards per batch * num_generations *
    num_iterations * steps_per_generation / global batch` micro-batches, rounded up, over
    `gradient_accumulation_steps` (at least 1); times `num_train_epochs`, unless `max_steps` is set. The global batch
    is `per_device_train_batch_size x processes` (`planned_config`). With the tiny policy's defaults: 512 boards x 8
    generations / 32 completions a step = 128 steps on one process, 64 on two.
    """
    config = planned_config(instances, overrides, prompt_style, processes)
    if config.max_steps > 0:
        return config.max_steps
    per_batch = config.generation_batch_size // config.num_generations  # boards per generation batch
    samples = (instances // per_batch) * per_batch * config.num_generations * config.num_iterations \
        * config.steps_per_generation
    micro_batches = math.ceil(samples / config.per_device_train_batch_size)
    per_epoch = max(math.ceil(micro_batches / config.gradient_accumulation_steps), 1)
    return math.ceil(config.num_train_epochs * per_epoch)


def planned_rollouts(instances: int, overrides: dict[str, Any], prompt_style: str = "chat", processes: int = 1) -> int:
    """The completions a stage of `instances` boards samples for its training boards (its rollouts) on `processes`
    processes, all of them together, as TRL generates them: a generation batch of `generation_batch_size`
    completions (global) every `steps_per_generation x num_iterations` micro-batches, each optimizer step
    `gradient_accumulation_steps` micro-batches. With TRL's defaults that is the steps times the global batch (the
    tiny policy: 128 x 32 = 4,096 on one process; 64 x 64 on two)."""
    config = planned_config(instances, overrides, prompt_style, processes)
    micro_batches = planned_steps(instances, overrides, prompt_style, processes) * config.gradient_accumulation_steps
    return math.ceil(micro_batches / (config.steps_per_generation * config.num_iterations)) \
        * config.generation_batch_size


# ---------------------------------------------------------------- data


def dataset(policy: Policy, instances: Sequence[Instance]) -> Dataset:
    """One row per board: the policy's prompt as TRL is to read it (`trl_prompt`), and the board's JSON for the
    reward functions."""
    return Dataset.from_dict({"prompt": [trl_prompt(policy, i) for i in instances],
                              "instance": [i.to_json() for i in instances]})


def trl_prompt(policy: Policy, instance: Instance) -> str:
    """The policy's prompt for TRL, which tokenizes a text prompt with the tokenizer's special tokens
    (`processing_class(text=prompts)` in `GRPOTrainer._tokenize_prompts`). A chat template that writes `bos_token`
    (Gemma IT, Llama 3) put a BOS in the text already, and the tokenizer would add a second one: that BOS is left
    to the tokenizer, so training reads one BOS, as validation does (`Policy.token_ids`)."""
    text = policy.prompt(instance)
    tok = policy.tokenizer
    bos = tok.bos_token
    if bos and text.startswith(bos) and tok(text)["input_ids"][:2] == [tok.bos_token_id] * 2:
        return text.removeprefix(bos)
    return text


@lru_cache(maxsize=2)
def validation_set(per_size: int = VALIDATION_PER_SIZE, cache_dir: Path | None = None,
                   agents: tuple[int, ...] = VALIDATION_AGENTS) -> tuple[Instance, ...]:
    """The validation boards (`agents` agents, sizes max(3, K)..10, `per_size` per (count, size)), once per process:
    read from (or built once into) `cache_dir`, the runs root; built here without one."""
    if cache_dir is None:
        return tuple(entry.instance for entry in build(Split.VALIDATION, per_size=per_size, agents=agents)[0])
    return tuple(entry.instance for entry in evaluation.validation_entries(cache_dir, per_size, agents))


@lru_cache(maxsize=2)
def dev_set(per_size: int, validation_per_size: int, cache_dir: Path,
            agents: tuple[int, ...] = VALIDATION_AGENTS, draw: int | None = None) -> tuple[Instance, ...]:
    """The dev boards, `per_size` per (agent count, map size), disjoint from the validation set of
    `validation_per_size` per (count, size) of the same counts (`envsim.suite.dev_entries`), drawn for run seed `draw`
    (None: the set every seed shares), once per process: read from (or built once into) `cache_dir`, the runs root."""
    return tuple(entry.instance for entry in evaluation.dev_entries(cache_dir, per_size, validation_per_size, agents,
                                                                    draw))


def validation_boards(limit: int | None = None, per_size: int = VALIDATION_PER_SIZE,
                      cache_dir: Path | None = None, agents: tuple[int, ...] = VALIDATION_AGENTS) -> list[Instance]:
    """The validation boards, or `limit` of them spread evenly over the set: the set holds `per_size` boards per
    (agent count, map size) in table order, so every (count, size) keeps a share (one each where `limit` is their
    number)."""
    boards = validation_set(per_size, cache_dir, agents)
    if limit is None or limit >= len(boards):
        return list(boards)
    return [boards[i * len(boards) // limit] for i in range(limit)]


# ---------------------------------------------------------------- record


class Record(TrainerCallback):
    """Writes each logged step into `TrainingLog`, reports progress, records checkpoints, stops on cancel.

    Each row also holds, under `advantage.CELLS`, TRL's advantages per cell (agent count, map size) of the
    generation batches scored since the previous row (`add_cells`; an empty list for a step that generated
    nothing). Batches scored after the last logged step (a `logging_steps` above 1) go into the last step's row.
    Only the main process writes (under `accelerate launch` every process runs the callback).
    """

    def __init__(self, engine: Engine, args: StageArgs, progress: Progress):
        self.engine, self.args, self.progress = engine, args, progress
        self.cancelled = False
        self.summary: dict[str, float] = {}
        self.cells: dict[advantage.Cell, advantage.CellSignal] = {}  # scored, not yet written

    def add_cells(self, batch: dict[advantage.Cell, advantage.CellSignal]) -> None:
        self.cells = advantage.merged([self.cells, batch])

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        numbers = {k: float(v) for k, v in logs.items()
                   if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}
        if "train_runtime" in logs:  # the end-of-training summary, not a step
            self.summary = numbers
            if self.cells:
                self._write_cells(state.global_step)
            return
        cells, self.cells = self.cells, {}
        with session(self.engine) as s:
            s.exec(delete(TrainingLog).where(TrainingLog.run_id == self.args.run_id,  # a dead attempt's row
                                             TrainingLog.stage_index == self.args.stage_index,
                                             TrainingLog.step == state.global_step))
            s.add(TrainingLog(run_id=self.args.run_id, stage_index=self.args.stage_index, step=state.global_step,
                              metrics={**numbers, advantage.CELLS: advantage.records(cells)}))
            s.commit()
        line = f"step {state.global_step}/{state.max_steps}" + "".join(
            f" {k} {numbers[k]:.4g}" for k in ("reward", "loss", "kl", "completions/mean_length",
                                               "completions/clipped_ratio") if k in numbers)
        self.progress(state.global_step, state.max_steps, line)  # a stop is decided at the step's end, together

    def on_step_end(self, args, state, control, **kwargs):
        # Every process votes (the main one: its job's cancel or its own signal; the others: their own signal) and
        # all stop at the same step, or none: a process that stopped alone would leave the others waiting for it in
        # the next step's gradient exchange, and the checkpoint saved on the way out takes every process.
        if agreed(self.progress(state.global_step, state.max_steps), args.device):
            self._stop(control)

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            checkpoint = str(Path(args.output_dir) / f"checkpoint-{state.global_step}")
            self.progress(state.global_step, state.max_steps, f"saved {checkpoint}", result={"checkpoint": checkpoint})

    def _write_cells(self, step: int) -> None:
        """The cells not yet written, added to the row of `step` (made where the step logged none)."""
        with session(self.engine) as s:
            row = s.exec(select(TrainingLog).where(TrainingLog.run_id == self.args.run_id,
                                                   TrainingLog.stage_index == self.args.stage_index,
                                                   TrainingLog.step == step)).first()
            row = row or TrainingLog(run_id=self.args.run_id, stage_index=self.args.stage_index, step=step)
            written = advantage.read([row.metrics]) or {}
            row.metrics = {**row.metrics, advantage.CELLS: advantage.records(advantage.merged([written, self.cells]))}
            s.add(row)
            s.commit()
        self.cells = {}

    def _stop(self, control) -> None:
        # Save on the way out, so a requeued attempt resumes here instead of from the last periodic checkpoint.
        self.cancelled = True
        control.should_training_stop = True
        control.should_save = True


def agreed(vote: bool, device: torch.device) -> bool:
    """Whether any process of the launch voted to stop (`vote` is this one's); the vote itself outside one."""
    distributed = torch.distributed
    if not (distributed.is_available() and distributed.is_initialized()) or distributed.get_world_size() == 1:
        return vote
    flag = torch.tensor([int(vote)], device=device)
    distributed.all_reduce(flag, op=distributed.ReduceOp.MAX)
    return bool(flag.item())


# Transformers' end-of-training summary, which its tracker callbacks keep out of the curves.
SUMMARY_KEYS = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss", "total_flos")


def on_the_runs_axis(logs: dict[str, Any], state: Any, tracking: trackers.Tracking) -> tuple[dict[str, Any], int]:
    """A step's logs as the run's tracker run takes them (`training.trackers`): transformers' names, the stage's own
    step and its index as fields, and the step on the run's axis."""
    step = tracking.step(state.global_step)
    logs = rewrite_logs({k: v for k, v in logs.items() if k not in SUMMARY_KEYS})
    return {**logs, "train/global_step": step, "train/stage_step": state.global_step, "train/stage": tracking.stage}, \
        step


class TrackioOnTheRunsAxis(TrackioCallback):
    """Transformers' Trackio callback (it opens the run's tracker run, `GRPOConfig.project`/`run_name`, with
    resume="allow", records the config, finishes), logging each step at its place on the run's axis: Trackio takes
    the step it is given, where transformers' lets it count one per log."""

    def __init__(self, tracking: trackers.Tracking):
        super().__init__()
        self.tracking = tracking

    def on_log(self, args, state, control, model=None, logs=None, **kwargs):
        if not self._initialized:
            self.setup(args, state, model)
        if state.is_world_process_zero and "train_runtime" not in logs:  # the summary at the end is no step
            metrics, step = on_the_runs_axis(logs, state, self.tracking)
            self._trackio.log(metrics, step=step)


class WandbOnTheRunsAxis(WandbCallback):
    """Transformers' W&B callback in the run's W&B run (`Tracking.wandb_init`: the run's uuid as its id, resumed by
    each stage), its step metric `train/global_step` on the run's axis."""

    def __init__(self, tracking: trackers.Tracking):
        super().__init__()
        self.tracking = tracking

    def setup(self, args, state, model, **kwargs):
        if state.is_world_process_zero and self._wandb.run is None:
            self._wandb.init(**self.tracking.wandb_init())
        super().setup(args, state, model, **kwargs)

    def on_log(self, args, state, control, model=None, logs=None, **kwargs):
        shifted = copy.copy(state)
        shifted.global_step = self.tracking.step(state.global_step)
        super().on_log(args, shifted, control, model=model, logs={
            **logs, "stage_step": state.global_step, "stage": self.tracking.stage}, **kwargs)


def log_on_the_runs_axis(trainer: GRPOTrainer, tracking: trackers.Tracking) -> None:
    """Swap transformers' Trackio and W&B callbacks of `trainer` (those its `report_to` added) for ours."""
    for ours, theirs in ((TrackioOnTheRunsAxis, TrackioCallback), (WandbOnTheRunsAxis, WandbCallback)):
        if trainer.pop_callback(theirs) is not None:
            trainer.add_callback(ours(tracking))


# ---------------------------------------------------------------- the stage


class Trainer(GRPOTrainer):
    """TRL's GRPO trainer, handing the advantages of each generation batch it trains on, per cell of its boards
    (`training.advantage`), to `on_cells`.

    They are TRL's own, read where it logs them after scoring a batch (`_logs`: every process's answers, in the
    order it grouped them), so they follow whatever `scale_rewards` and `multi_objective_aggregation` the run set,
    with no extra forward pass. `cell_of` maps each prompt to its board's cell: one prompt is one board. With
    `decoder` "loop" or "drafted" its rollouts are sampled by `training.decode` where that answers as `generate`
    would ("drafted": a compact policy's through `decode.decode_drafted`, in fewer forwards)."""

    def __init__(self, *args: Any, cell_of: dict[str, advantage.Cell],
                 on_cells: Callable[[dict[advantage.Cell, advantage.CellSignal]], None], decoder: Decoder = "drafted",
                 **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.cell_of, self.on_cells, self.decoder = cell_of, on_cells, decoder

    def _generate_single_turn(self, *args: Any, **kwargs: Any) -> Any:
        if self.decoder == "transformers":
            return super()._generate_single_turn(*args, **kwargs)
        with decode.looped(self.model, drafted=self.decoder == "drafted" and is_compact(self.processing_class)):
            return super()._generate_single_turn(*args, **kwargs)

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        output = super()._generate_and_score_completions(inputs)
        if self.model.training:
            n = len(inputs) * self.accelerator.num_processes  # the batch TRL just logged, gathered
            prompts, advantages = list(self._logs["prompt"])[-n:], list(self._logs["advantages"])[-n:]
            self.on_cells(advantage.tally([self.cell_of[p] for p in prompts], advantages, self.num_generations))
        return output


def stage_boards(args: StageArgs, on_board: Callable[[Instance], None] | None = None) -> list[Instance]:
    """The stage's `num_instances` training boards: its replayed boards as they are (`args.replay`, the first
    `num_instances` of them), then the rest drawn from its config with its seed (`envsim.generate`). A stage without
    replayed boards draws every one, as it always did."""
    n = args.config.num_instances
    replayed = list(args.replay[:n])
    for board in replayed:
        if on_board is not None:
            on_board(board)
    return replayed + generate(args.config, n - len(replayed), seed=args.seed, on_board=on_board)


def trainer_for(engine: Engine, args: StageArgs, policy: Policy, progress: Progress) -> tuple[Trainer, Record, int]:
    """TRL's trainer for the stage (its boards generated, its prompts rendered as the policy is configured, its
    config the run's GRPO overrides, `args.settings.grpo`, on `grpo_config`'s defaults), the callback that records
    it, and the number of boards."""
    n = args.config.num_instances
    made: Counter[int] = Counter()  # boards kept so far, by agent count

    def on_board(board: Instance) -> None:
        made[board.num_agents] += 1
        if (done := made.total()) % 64 == 0 or done == n:
            by_count = ", ".join(f"{k} agents: {m}" for k, m in sorted(made.items()))
            progress(0, None, f"generated {done}/{n} training boards ({by_count})")

    instances = stage_boards(args, on_board)
    budget = max(evaluation.answer_budget(policy, i) for i in instances)
    data = dataset(policy, instances)
    # trainer, once its peak memory fits the device (`training.memory`): else the stage fails saying what would fit
    tracking = trackers.tracking(engine, args.run_id, args.stage_index) \
        if trackers.reported(args.settings.overrides.report_to) else None
    prompt = max(len(policy.tokenizer(p)["input_ids"]) for p in data["prompt"])  # as TRL tokenizes it
    config = grpo_config(args, args.settings.grpo, budget, policy.prompt_style, tracking, longest_prompt=prompt)
    plan = memory.plan_of(config, lora=args.lora, prompt=prompt)
    if (why := memory.refusal(policy.model, plan)) is not None:
        raise StageError(f"stage {args.stage_index} of run {args.run_id} {why}")
    if not plan.gpu:  # the estimate's allocator: freed blocks go back to the kernel (`memory.return_freed_memory`)
        memory.return_freed_memory()
    record = Record(engine, args, progress)
    cell_of = {p: (i.num_agents, i.size) for p, i in zip(data["prompt"], instances, strict=True)}
    trainer = Trainer(model=policy.model, reward_funcs=list(REWARDS), args=config, train_dataset=data,
                      processing_class=policy.tokenizer, callbacks=[record],
                      peft_config=lora_config(args.lora, args.settings.lora_alpha, args.settings.lora_dropout,
                                              args.settings.lora_target_modules) if args.lora else None,
                      cell_of=cell_of, on_cells=record.add_cells, decoder=policy.decoder)
    trainer.remove_callback(PrinterCallback)  # with tqdm off it prints every log dict; `record` reports them
    if tracking is not None:
        log_on_the_runs_axis(trainer, tracking)
        progress(0, None, trackers.announce(tracking, trackers.reported(config.report_to)))
    return trainer, record, len(instances)


def train(engine: Engine, args: StageArgs, policy: Policy, progress: Progress) -> dict[str, Any]:
    """GRPO on `args.config` from `policy` (trained in place); saves it to `args.policy_dir`; TRL's summary.

    Every process that trains ends here, the main one before it evaluates: the trainer (its optimizer, TRL's
    colocated vLLM engine) is let go and its memory given back before the policy is saved (`_let_go`), so that
    validation's own vLLM engine finds the GPU free after a large full fine-tune, and the process leaves
    torch.distributed (`_leave_process_group`): the lab's child processes of every rank call only this."""
    trainer, record, boards = trainer_for(engine, args, policy, progress)
    whole = None
    try:
        summary, bf16, main = _fit(trainer, record, engine, args, policy, boards, progress)
        if trainer.is_fsdp_enabled:  # each process holds a shard: every one gathers, the main one gets the whole
            whole = trainer.accelerator.get_state_dict(trainer.model)
    finally:
        _let_go(trainer)
        del trainer
        vllm.free_memory()
        _leave_process_group()
    if whole is not None and main:  # FSDP: the policy that is saved and evaluated is built from the gathered weights
        policy.model = _unsharded(policy.model.config, whole, torch.float32)
    # save (the marker last: its presence means the policy folder is complete), in float32: the master weights as
    # they trained (LoRA's merged into a float32 base, `_fit`), which the next stage loads as they are
    # (`start_policy`). In bf16 a stage's small updates would round away at every stage boundary.
    if main:
        policy.save(args.policy_dir)
        args.trained_marker.write_text(json.dumps({**args.marker_key(), **summary}, indent=2) + "\n")
    if bf16:  # evaluated in bf16, as the saved policy loads on a GPU (`load_policy`'s default)
        policy.model = policy.model.to(torch.bfloat16)
    if whole is not None and main:
        policy.model = policy.model.to(local_device())
    return summary


def _fit(trainer: GRPOTrainer, record: Record, engine: Engine, args: StageArgs, policy: Policy, boards: int,
         progress: Progress) -> tuple[dict[str, Any], bool, bool]:
    """Train (resuming from the stage's last TRL checkpoint); LoRA's adapters folded into `policy.model`. Returns
    TRL's summary, whether it trained under bf16 autocast and whether this is the main process."""
    config = trainer.args
    resume = get_last_checkpoint(str(args.trainer_dir)) if args.trainer_dir.is_dir() else None
    forget_logs_after(engine, args, _step_of(resume))
    if resume is not None:
        progress(0, None, f"resuming from {resume}", result={"checkpoint": resume})
    engine_name = "vLLM" if config.use_vllm else "transformers"
    progress(0, None, f"GRPO: {boards} boards, {config.num_generations} generations each, up to "
                      f"{config.max_completion_length} new tokens, {engine_name} generation on {config.device}")
    trainer.train(resume_from_checkpoint=resume)
    vllm.close_link(trainer)  # server mode: the next stage opens its own link to the worker's server
    if record.cancelled:
        raise Cancelled(f"cancelled at step {trainer.state.global_step}/{trainer.state.max_steps}; "
                        f"requeue to resume from {get_last_checkpoint(str(args.trainer_dir))}")
    if args.lora:  # fold the adapters into the weights: every stage's checkpoint is a whole model
        policy.model = merged(trainer.model)
    summary = {"steps": trainer.state.global_step, "resumed_from": resume, **record.summary}
    return summary, bool(config.bf16), trainer.accelerator.is_main_process


def merged(model: Any) -> Any:
    """A LoRA model (peft's) with its adapters folded into its base widened to float32: a base loaded in bf16 would
    round the adapters' small product away in the merge (the float32 adapters are exact; the bf16 base widens
    exactly)."""
    return model.to(torch.float32).merge_and_unload()


def _unsharded(config: Any, state: dict[str, torch.Tensor], dtype: torch.dtype) -> Any:
    """A whole model of `config` with the weights gathered whole from FSDP's shards (`get_state_dict`), on the CPU:
    an ordinary model that `Policy.save` writes as a Hugging Face checkpoint and evaluation runs as any other."""
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    with no_init_weights():  # every weight is overwritten; the buffers (rotary frequencies) are computed as built
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.load_state_dict({k: v.to(dtype) for k, v in state.items()})
    model.tie_weights()  # a tied head shares the embedding again, as `from_pretrained` would give it
    return model.eval()


def _let_go(trainer: GRPOTrainer) -> None:
    """Drop what a finished trainer holds beyond the policy's model: TRL's colocated vLLM engine, and the optimizer
    and scheduler, also from accelerate's lists, so that they go even where something still refers to the trainer."""
    vllm.stop_colocated(trainer)
    trainer.accelerator.free_memory()
    trainer.optimizer = trainer.lr_scheduler = None


def _step_of(checkpoint: str | None) -> int:
    return 0 if checkpoint is None else int(Path(checkpoint).name.rpartition("-")[2])


def forget_logs_after(engine: Engine, args: StageArgs, step: int) -> None:
    """Drop the stage's training-log rows past `step`: a dead attempt logged them, and the attempt that
    resumes from `step` logs those steps again. Each step then has one row, from the last attempt."""
    with session(engine) as s:
        s.exec(delete(TrainingLog).where(TrainingLog.run_id == args.run_id, TrainingLog.stage_index == args.stage_index,
                                         TrainingLog.step > step))
        s.commit()


def start_dtype(args: StageArgs) -> torch.dtype | None:
    """The dtype the stage loads its starting policy in (None: `load_policy`'s default, bf16 for a chat model on a
    GPU). A full fine-tune keeps float32 master weights (the optimizer updates them; bf16 autocast does the maths,
    `grpo_config`): in bf16 most updates at a learning rate of 1e-6 would round away. LoRA's frozen base is the run's
    policy as it comes at stage 1, and from stage 2 on a trained stage's float32 checkpoint (`train`), loaded in
    float32 so that the next stage starts from exactly the weights the last one trained."""
    if args.stage_index > 1 or (args.stage_index == 1 and not args.lora):
        return torch.float32
    return None


def start_policy(args: StageArgs, device: str) -> Policy:
    """Load the stage's starting policy, or fail with a message that names the stage and the checkpoint."""
    what = "the run's policy" if args.stage_index == 0 else f"stage {args.stage_index - 1}'s checkpoint"
    try:
        return load_policy(args.policy, device=device, dtype=start_dtype(args)).configured(args.settings)
    except PolicyError as err:
        raise StageError(f"cannot load the starting policy of stage {args.stage_index} ({what} "
                         f"{args.policy!r}): {err}") from err


def checkpoint_path(spec: str) -> str:
    """Where a policy spec lives on disk when it does (`tiny` is the shipped folder); else the spec itself."""
    if spec in SHIPPED:
        return str(SHIPPED[spec])
    path = Path(spec).expanduser()
    return str(path.resolve()) if path.exists() else spec


def stage_args(engine: Engine, run_id: int, stage_index: int) -> StageArgs:
    """The stage's arguments, read from the Run and Stage rows; the run's settings in them carry its GRPO overrides
    (`args.settings.grpo`, the typed ones the lab reads itself `args.settings.overrides`)."""
    with session(engine) as s:
        run = s.get(Run, run_id)
        if run is None:
            raise StageError(f"no run {run_id}")
        stages = {st.index: st for st in s.exec(select(Stage).where(Stage.run_id == run_id))}
    if stage_index not in stages:
        raise StageError(f"run {run_id} has no stage {stage_index}")
    if stage_index == 0:
        start = run.policy
    else:
        previous = stages.get(stage_index - 1)
        if previous is None or previous.checkpoint is None:
            status = "missing" if previous is None else previous.status
            raise StageError(f"cannot load the starting policy of stage {stage_index}: stage {stage_index - 1} "
                             f"of run {run_id} has no checkpoint (it is {status}); run it first")
        try:
            start = checkpoint_of(engine, previous)
        except UnsafePath as err:
            raise StageError(f"cannot load the starting policy of stage {stage_index}: {err}") from None
        if stage_index > 1 and not Path(start).is_dir():  # a trained stage's folder (stage 0's is the run's spec)
            raise StageError(f"cannot load the starting policy of stage {stage_index}: stage {stage_index - 1}'s "
                             f"checkpoint {start} is missing (runs root {runs_root(engine)}: set {RUNS_SETTING} "
                             f"to the folder that holds run {run.uuid})")
    try:
        folder = run_folder(engine, run.uuid)
    except UnsafePath as err:
        raise StageError(f"run {run_id} has no safe folder to train into: {err}") from None
    replay = stages[stage_index].replay
    try:  # a stored replay is read back checked (`storage.models.Replay`): one that does not read stops the stage
        replayed = () if replay is None else replay.boards
    except ValueError as err:
        raise StageError(f"stage {stage_index} of run {run_id} cannot read the boards it replays: {err}; it trains "
                         "on no other boards in their place") from None
    return StageArgs(run_id=run_id, stage_index=stage_index, seed=stage_seed(run.seed, stage_index), policy=start,
                     config=stages[stage_index].config,
                     run_dir=folder, run_uuid=run.uuid, settings=run.settings, run_seed=run.seed, replay=replayed)


def _set_stage(engine: Engine, args: StageArgs, **values: Any) -> None:
    with session(engine) as s:
        stage = stage_at(s, args.run_id, args.stage_index)
        for key, value in values.items():
            setattr(stage, key, value)
        s.add(stage)
        s.commit()


def run_stage(engine: Engine, args: StageArgs, progress: Progress, tail: str = "") -> dict[str, Any]:
    """Train (stage > 0), evaluate on the validation set and then on the dev set (when the run has one), store
    episodes and metrics, mark the stage done. Evaluation is greedy: it draws no random number, so the dev set
    changes nothing of what training or the validation results would be without it. `tail` is the job's log tail
    as this attempt found it: an evaluation an earlier attempt began goes on from the boards it stored (each batch is
    stored as it is scored), and its line says so (`evaluation_restarts`).

    Stage 0 evaluates the run's starting policy, which every run of an experiment shares: where another run of
    the database evaluated (or is evaluating) the same policy on the same boards in the same way, its episodes
    and metrics are copied instead of generated again (`training.shared`), and the policy is loaded only when
    something is left to generate."""
    device = local_device()
    _set_stage(engine, args, status=StageStatus.RUNNING, started_at=utcnow(), finished_at=None)
    loaded: list[Policy] = []

    def policy() -> Policy:
        if not loaded:
            progress(0, None, f"stage {args.stage_index} of run {args.run_id}: loading {args.policy}")
            loaded.append(start_policy(args, device))
        return loaded[0]

    reused: dict[str, int] = {}
    try:
        if args.stage_index > 0 and (trained := args.adoptable_marker()) is not None:
            # An earlier attempt trained and saved the policy, then died before recording its evaluation.
            progress(0, None, f"stage {args.stage_index} was trained by an earlier attempt: loading {args.policy_dir}")
            loaded.append(load_policy(str(args.policy_dir), device=device).configured(args.settings))
        elif args.stage_index > 0:
            trained = train(engine, args, policy(), progress)
        else:
            trained = {}
        checkpoint = checkpoint_path(args.policy) if args.stage_index == 0 else args.stored_checkpoint
        folder = None if not vllm.available() else \
            policy_folder(args.policy) if args.stage_index == 0 else str(args.policy_dir)
        # record: the validation set (once: an attempt that died after storing it leaves it stored)
        if not _validation_metrics(engine, args):
            counts = ", ".join(map(str, args.validation_agents))
            progress(0, None, f"reading the validation and dev boards of {counts} agents (built once on this machine, "
                              "then read from its cache)")
            evaluation.validation_entries(args.run_dir.parent, args.validation_per_size, args.validation_agents,
                                          building(progress, "validation"))
            boards = validation_boards(args.validation_boards, args.validation_per_size, args.run_dir.parent,
                                       args.validation_agents)
            if (source := _evaluate(engine, args, Split.VALIDATION, boards, policy, folder, progress, tail)
                    ) is not None:
                reused[Split.VALIDATION] = source
        else:
            progress(0, None, "the validation results of an earlier attempt are stored already: kept")
        if args.dev_per_size and not _metrics(engine, args, Split.DEV):
            evaluation.dev_entries(args.run_dir.parent, args.dev_per_size, args.validation_per_size,
                                   args.validation_agents, args.dev_seed, building(progress, "dev"))
            boards = list(dev_set(args.dev_per_size, args.validation_per_size, args.run_dir.parent,
                                  args.validation_agents, args.dev_seed))
            if (source := _evaluate(engine, args, Split.DEV, boards, policy, folder, progress, tail)) is not None:
                reused[Split.DEV] = source
        _set_stage(engine, args, status=StageStatus.DONE, checkpoint=checkpoint, finished_at=utcnow())
    except BaseException:
        _set_stage(engine, args, status=StageStatus.FAILED, finished_at=utcnow())
        raise
    pooled = Tally.total(map(evaluation.tally_of, _validation_metrics(engine, args)))
    return {"run_id": args.run_id, "stage_index": args.stage_index, "checkpoint": checkpoint,
            "episodes": pooled.episodes, "valid_rate": pooled.valid_rate, "optimal_rate": pooled.optimal_rate,
            "train": trained, **({"reused_from": reused} if reused else {})}


def building(progress: Progress, what: str) -> Callable[[int, int], None]:
    """What a board set built for the first time on this machine tells the job (`on_part`): its bar follows the
    boards made, and its log says how many at each quarter, where it was silent for the minute of solver time that
    hundreds of boards of 3 to 5 agents take. A set read from its cache tells nothing."""
    said = 0

    def on_part(done: int, total: int) -> None:
        nonlocal said
        quarter = 4 * done // max(1, total)
        line = f"built {done} of {total} {what} boards (once on this machine)" if quarter > said else None
        said = max(said, quarter)
        progress(done, total, line)

    return on_part


def _evaluate(engine: Engine, args: StageArgs, split: Split, boards: list[Instance], policy: Callable[[], Policy],
              folder: str | None, progress: Progress, tail: str = "") -> int | None:
    """Evaluate the stage's policy on `split`'s boards and store it; stage 0 copies an equal evaluation of another
    run instead (`training.shared`). Returns the run it was copied from, or None where it was generated here."""
    what = "validation" if split == Split.VALIDATION else "dev"
    said = "" if split == Split.VALIDATION else " (what the engineer reads)"
    starts = f"evaluating on {len(boards)} {what} boards"

    def generate() -> None:
        """Answer the boards no earlier attempt stored, each batch stored as it is scored, then store it whole."""
        answering = policy()  # loaded first (said in the log), then the boards are answered
        with session(engine) as s:
            answered = evaluation.stored_answers(s, args.run_id, args.stage_index, split, boards,
                                                 evaluation.answer_order(answering, boards))
        progress(len(answered), len(boards),
                 f"{starts}{said}{evaluation_restarts(tail, starts, len(answered))}")

        def store(batch: list[evaluation.EpisodeResult]) -> None:
            with session(engine) as s:
                evaluation.store_episodes(s, args.run_id, args.stage_index, split, batch)

        results = evaluation.evaluate(answering, boards, progress=lambda done, total: progress(done, total),
                                      decoding=args.decoding, seed=args.seed, vllm_model=folder, answered=answered,
                                      on_batch=store)
        table = evaluation.metrics_table(evaluation.size_metrics(results))
        progress(len(boards), len(boards), table if split == Split.VALIDATION else f"dev:\n{table}")
        with session(engine) as s:
            evaluation.store_whole(s, args.run_id, args.stage_index, split, results)

    if args.stage_index > 0:  # a trained checkpoint is the run's own: nobody else evaluates it
        generate()
        return None
    key = shared.answer_key(policy=args.policy, folder=shared.policy_files(args.policy), split=split, boards=boards,
                            settings=args.settings, seed=args.seed,
                            engine="vllm" if folder is not None else "transformers", device=local_device())
    source = shared.evaluate_once(engine, key, args.run_id, args.stage_index, split, generate, progress)
    if source is None:
        return None
    copied = _metrics(engine, args, split)
    table = evaluation.metrics_table(evaluation.summed(copied))
    progress(0, None, f"stage 0 {what}: reused run {source.run_id}'s stage {source.stage_index} evaluation (the same "
                      f"policy, {len(boards)} {what} boards and decoding): {sum(m.episodes for m in copied)} "
                      f"episodes copied, nothing generated\n{table}")
    return source.run_id


def evaluation_restarts(tail: str, starts: str, stored: int) -> str:
    """What an evaluation's first line adds when an earlier attempt of its job began it: episodes are stored batch by
    batch as they are scored (`evaluation.store_episodes`), so it goes on after the `stored` boards that attempt
    stored, or from the first board where it stored none. Where the earlier attempt stopped comes from `tail` (the
    job's log tail as this attempt found it): its line `starts`, then `storage.queue.hand_back`'s line, whose step is
    the board it was at. Empty for a first attempt."""
    began = tail.rfind(starts)
    stopped = re.search(r"^-- handed back at step (\d+) of (\d+)", tail[began:], re.MULTILINE) if began >= 0 else None
    where = f" at board {stopped[1]} of {stopped[2]}" if stopped else ""
    if stored:
        return (f" from board {stored + 1} on: an earlier attempt stopped{where}, and the {stored} boards it scored "
                "are stored")
    if began < 0:
        return ""
    return (f" again from the first board: an earlier attempt stopped{where or ' before its end'}, and none of its "
            "boards are stored")


def _validation_metrics(engine: Engine, args: StageArgs) -> list[StageMetric]:
    return _metrics(engine, args, Split.VALIDATION)


def _metrics(engine: Engine, args: StageArgs, split: Split) -> list[StageMetric]:
    with session(engine) as s:
        return list(s.exec(select(StageMetric).where(StageMetric.run_id == args.run_id,
                                                     StageMetric.stage_index == args.stage_index,
                                                     StageMetric.split == split)))


def run_stage_job(engine: Engine, job: Job, progress: Progress) -> dict[str, Any]:
    """The `stage` job (docs/loop.md): payload a `StagePayload`."""
    payload = StagePayload.of(job)
    return run_stage(engine, stage_args(engine, payload.run_id, payload.stage_index), progress, job.log_tail or "")


# ---------------------------------------------------------------- how a stage starts on several GPUs


def needs_fsdp(engine: Engine, run_id: int, stage_index: int, gpus: int,
               device_bytes: int | None = None) -> tuple[bool, str]:
    """Whether stage `stage_index` of run `run_id` runs under FSDP on `gpus` GPUs (`memory.fsdp_needed`), and the
    line that says why; on this process's GPU unless `device_bytes` says otherwise.

    Read before any process of the stage loads its weights: the starting policy's architecture on the meta device
    (its config only), the stage's `GRPOConfig` as `grpo_config` builds it, the run's completion budget (its
    `completion_length`, else the chat budget, which bounds a compact policy's too) and prompts of
    `memory.PROMPT_BOUND` tokens. The stage checks its memory again with its real prompts before it trains
    (`trainer_for`). Stage 0 only evaluates: no FSDP.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    from training.policy import prompt_style_of

    args = stage_args(engine, run_id, stage_index)
    if stage_index == 0:
        return False, f"stage 0 of run {run_id} evaluates only: no FSDP"
    architecture = AutoConfig.from_pretrained(policy_folder(args.policy))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(architecture, dtype=start_dtype(args) or torch.bfloat16)
    completion = args.settings.completion_length or evaluation.CHAT_BUDGET
    config = grpo_config(args, args.settings.grpo, completion, prompt_style_of(args.policy))
    plan = memory.plan_of(config, lora=args.lora, prompt=memory.PROMPT_BOUND, device_bytes=device_bytes)
    return memory.fsdp_needed(model, plan, gpus)


def memory_refusal(settings: RunSettings, config: EnvConfig, policy: str) -> str | None:
    """Why a run of `policy` with `settings`, starting from `config`, cannot train on this process's device, in one
    line (`memory.refusal`: what it needs and a setting that would fit), or None where its stages fit; read before
    the run is stored, so that a stage that cannot fit is refused then, not killed by the kernel minutes into it.
    Per process of the `settings.processes` its stages are launched on, as the worker launches them
    (`memory.launched`: FSDP where a full fine-tune fits no GPU unsharded, else DDP's copy on each).

    Its stages as `grpo_config` builds them (the run's GRPO overrides on the policy's defaults), the run's completion
    budget (its `completion_length`, else the chat budget, which bounds a compact policy's too), prompts of its most
    agents (`memory.prompt_bound`) and LoRA's base as a later stage loads it (float32 where there is one). The
    policy's architecture is read on the meta device from its config.json, no weight; a policy whose folder is not
    on this machine yet (Gemma before its first conversion, a hub name) or whose config.json names no architecture
    transformers builds is checked by its stage only (`trainer_for`).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    from training.gemma import FOLDER, cache_root
    from training.policy import prompt_style_of

    folder = cache_root() / FOLDER if policy == "gemma3-270m" else Path(checkpoint_path(policy))
    if not (folder / "config.json").is_file():
        return None
    args = StageArgs(run_id=0, stage_index=min(settings.stages, 2), seed=0, policy=policy, config=config,
                     run_dir=Path(os.devnull), run_uuid="", settings=settings)
    style = prompt_style_of(policy)
    dtype = start_dtype(args) or (torch.bfloat16 if torch.cuda.is_available() and style == "chat" else torch.float32)
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=dtype)
    except (OSError, ValueError, KeyError, TypeError):  # no architecture transformers knows: the stage says why
        return None
    agents = max([*config.agent_ratio, *(settings.agent_counts or ())])
    trl = grpo_config(args, settings.grpo, settings.completion_length or evaluation.CHAT_BUDGET, style)
    processes = settings.processes or 1  # each with its own GPU, or its share of this machine's memory
    plan = memory.plan_of(trl, lora=settings.lora, prompt=memory.prompt_bound(agents), processes=processes)
    return memory.refusal(model, memory.launched(model, plan, processes))


# ---------------------------------------------------------------- multi-GPU entry point


def main(argv: Sequence[str] | None = None) -> int:
    """`accelerate launch -m training.stage --run R --stage K`: one stage outside the worker, on every GPU
    that accelerate gives it. Every process trains; only the main one writes rows and files."""
    parser = argparse.ArgumentParser(prog="python -m training.stage", description=main.__doc__.splitlines()[0])
    parser.add_argument("--run", type=int, required=True)
    parser.add_argument("--stage", type=int, required=True)
    parser.add_argument("--db", help="database path or URL (default: $ENVLAB_DB, else runs/envlab.db)")
    parser.add_argument("--fsdp-on", type=int, metavar="GPUS",
                        help="train nothing: print whether the stage runs under FSDP on GPUS GPUs, as JSON "
                             '{"fsdp": ..., "line": ...} (`needs_fsdp`; the worker asks before it launches a stage)')
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    engine = make_engine(opts.db)
    if opts.fsdp_on is not None:
        fsdp, line = needs_fsdp(engine, opts.run, opts.stage, opts.fsdp_on)
        print(json.dumps({"fsdp": fsdp, "line": line}))
        return 0
    main_process = int(os.environ.get("RANK", "0")) == 0

    def progress(step: int, total: int | None, line: str | None = None, result: dict | None = None) -> bool:
        if line and main_process:
            log.info("%s/%s %s", step, total, line)
        return False

    args = stage_args(engine, opts.run, opts.stage)
    try:
        if not main_process:  # the others train with it (unless it is trained); evaluation and rows are the main's
            if args.adoptable_marker() is None:
                train(engine, args, start_policy(args, local_device()), progress)
            return 0
        print(run_stage(engine, args, progress))
        return 0
    finally:
        _leave_process_group()


def _leave_process_group() -> None:
    """Leave torch.distributed once this process's collective work is done (its training, `train`; every rank
    of `main`): a group torn down at exit can abort the process ("terminate called without an active exception")
    after its work is done, and a process that evaluates next should not hold its ranks' group."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
