"""What a run and an experiment are asked to do, as typed records: `RunSettings` (a run's settings) and
`ExperimentSettings` (what every run of an experiment shares and the compute it buys).

Checked once where they are made (the page, `envlab run`, an experiment; `lab.settings` holds the command line's
flags; each count's bounds are here, a `Count`), stored whole in `Run.settings` and `Experiment.settings`, whose
column type validates them on the way in and hands them back typed on the way out (`storage.models.Typed`), and
vouched for again when a run arrives from another lab (`lab.archive`). Every layer above reads their fields,
never string keys. Kept light, with no torch behind it, so a row or an archive is checked without loading the
training stack; what only the training stack can check (the GRPO overrides, as TRL counts them) is
`training.settings.check_grpo`.

Adding a setting is one field of `RunSettings`: its type, its default and its range (a count's range is a `Count`
here, which the command line's flag and the page's box check too), and a `Setting` beside them, from which its flag
(`lab.settings.settings_arguments`), its help and what a new run takes where nothing gives it (`NEW_RUN`: the
flags' and the page form's defaults) are made.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

from envsim.config import AGENT_COUNTS, ConfigError, EnvConfig, project
from envsim.suite import (
    DEV_PER_SIZE,
    FIRST_AGENTS,
    VALIDATION_AGENTS,
    VALIDATION_PER_SIZE,
    Split,
    boards_in,
    checked_agents,
    checked_per_size,
)

# The GRPOConfig fields a run's `grpo` may set: how its policy learns (optimizer, schedule, precision, memory) and how
# it samples and scores its rollouts (GRPO's own knobs, vLLM's share of this machine's GPU), and how often it logs and
# saves. Every other field is the lab's: a run's settings can come from another lab's archive, and a field that names
# a place to write or read (the trainer's folders, a checkpoint to resume from, an accelerate, DeepSpeed or FSDP
# config), somewhere to send data (the Hub, a Trackio Space or bucket, a completions repo, a vLLM server elsewhere)
# or code to load (`trust_remote_code`, `model_init_kwargs`) would let those settings reach outside the run's folder
# and this machine. So the stage sets those itself, and any other field is refused where a run is made (the command
# line, the page, a settings file), dropped where a run arrives in an archive (`lab.archive`, saying so), and
# unreadable in a row stored by an earlier version. The tracker's project and run name are the lab's too
# (training.trackers): another name would split the run's curves or pour them into another run's.
GRPO_FIELDS = frozenset({
    # the optimizer and its schedule
    "learning_rate", "lr_scheduler_type", "warmup_steps", "weight_decay", "adam_beta1", "adam_beta2",
    "adam_epsilon", "optim", "max_grad_norm", "max_steps", "num_train_epochs", "per_device_train_batch_size",
    "gradient_accumulation_steps", "seed", "data_seed",
    # precision and memory
    "bf16", "fp16", "tf32", "activation_checkpointing", "gradient_checkpointing", "torch_compile", "use_liger_kernel",
    # GRPO: rollouts, sampling, the loss
    "num_generations", "max_completion_length", "generation_batch_size", "steps_per_generation", "shuffle_dataset",
    "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "mask_truncated_completions", "beta",
    "num_iterations", "epsilon", "epsilon_high", "delta", "importance_sampling_level", "loss_type", "scale_rewards",
    "reward_weights", "multi_objective_aggregation", "disable_dropout", "sync_ref_model", "ref_model_mixup_alpha",
    "ref_model_sync_steps", "top_entropy_quantile", "entropy_coef", "use_adaptive_entropy", "entropy_coef_min",
    "entropy_coef_max", "entropy_coef_delta", "entropy_target", "sapo_temperature_neg", "sapo_temperature_pos",
    "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg", "use_bias_correction_kl",
    "off_policy_mask_threshold",
    # vLLM on this machine (`vllm_mode` server: the worker's own server, training.vllm)
    "use_vllm", "vllm_mode", "vllm_gpu_memory_utilization", "vllm_enable_sleep_mode", "vllm_max_model_length",
    "vllm_tensor_parallel_size", "vllm_model_impl", "vllm_importance_sampling_correction",
    "vllm_importance_sampling_mode", "vllm_importance_sampling_cap", "vllm_importance_sampling_clip_min",
    "vllm_importance_sampling_clip_max",
    # logging and saving, in the run's own folder and tracker run
    "logging_steps", "logging_first_step", "logging_strategy", "log_completions", "num_completions_to_print",
    "report_to", "save_strategy", "save_steps", "save_total_limit", "save_only_model",
})
# The trackers `report_to` may name: each keeps its records on this machine (Trackio's SQLite file and W&B's offline
# folder under the runs root, TensorBoard's in the trainer's folder) unless this machine's own settings say otherwise
# (`training.trackers`); "all" would name every tracker installed, whatever it sends where.
REPORT_TO = ("none", "tensorboard", "trackio", "wandb")

Decoding = Literal["greedy", "sampled"]  # how an evaluation decodes: greedy, or as the model's generation_config
DECODINGS: tuple[str, ...] = get_args(Decoding)


def refused_grpo(overrides: dict[str, Any]) -> list[str]:
    """The fields of `overrides` a run may not set (sorted): any but `GRPO_FIELDS`, and `report_to` where it names a
    tracker outside `REPORT_TO`. Empty when the overrides may be used."""
    refused = set(overrides) - GRPO_FIELDS
    report_to = overrides.get("report_to", "none")
    names = [report_to] if isinstance(report_to, str) else report_to if isinstance(report_to, list) else [report_to]
    if not all(name in REPORT_TO for name in names):
        refused.add("report_to")
    return sorted(refused)


def allowed_grpo(overrides: dict[str, Any]) -> dict[str, Any]:
    """`overrides` without the fields a run may not set (`refused_grpo`): what an archive's run keeps."""
    refused = refused_grpo(overrides)
    return {k: v for k, v in overrides.items() if k not in refused}


class GrpoOverrides(BaseModel):
    """The GRPO overrides the lab reads itself, typed, from a run's `grpo` (`RunSettings.overrides`): the temperature
    its probes sample at, the trackers it reports to, whether it generates with vLLM and how. Every override, these
    included, goes to TRL's `GRPOConfig` as the run gave it; None here means the run leaves it to TRL's default."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    temperature: float | None = None
    report_to: str | list[str] | None = None
    use_vllm: bool = False
    vllm_mode: str | None = None  # "server": the worker's own vLLM server (training.vllm); else TRL's colocate

    @property
    def vllm_server(self) -> bool:
        """Whether the run generates with the worker's own vLLM server, on a GPU of the worker's apart from those
        it trains on."""
        return self.use_vllm and self.vllm_mode == "server"


@dataclass(frozen=True)
class Count:
    """A whole number from `low` to `high`, one bound for every way in: a `RunSettings` field holds it
    (`Annotated[int, bound]`: a settings file, a stored row, an archive), argparse calls it with the text of
    a flag (`type=`), a page's number box goes through `check`. A number out of range is refused saying why the
    bound is where it is (`why` above, `too_few` below), in the same words on each."""

    low: int
    high: int
    why: str
    too_few: str = ""

    def __call__(self, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(self._not_whole(repr(text))) from None
        if (why := self.refusal(value)) is not None:
            raise argparse.ArgumentTypeError(why)
        return value

    def check(self, value: Any) -> int:
        """A number box's value (None when it is empty; a float, since a box that rounds would hide a fraction)
        as a whole number in range; a ValueError with `refusal`'s words otherwise."""
        if isinstance(value, bool) or not isinstance(value, int | float) or value != value // 1:
            shown = "nothing" if value in (None, "") else f"{value:g}" if isinstance(value, float) else repr(value)
            raise ValueError(self._not_whole(shown))
        return self.valid(int(value))

    def valid(self, value: int) -> int:
        """`value` where it is in range; a ValueError with `refusal`'s words otherwise."""
        if (why := self.refusal(value)) is not None:
            raise ValueError(why)
        return value

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        """As a field's metadata (`Annotated[int, bound]`), the field's value checked with `valid`."""
        return core_schema.no_info_after_validator_function(self.valid, handler(source))

    def refusal(self, value: int) -> str | None:
        """Why `value` is out of range, None when it is in."""
        if value < self.low:
            return f"{value:,} is less than {self.low}" + (f": {self.too_few}" if self.too_few else "")
        if value > self.high:
            return f"{value:,} is more than {self.high:,}: {self.why}"
        return None

    def _not_whole(self, shown: str) -> str:
        return f"{shown} is not a whole number from {self.low} to {self.high:,}"


# The bounds of a run's counts, each with why it is where it is.
MAX_STAGES = Count(1, 1000, "each stage trains and evaluates the policy (minutes to hours); run again from "
                            "the last stage's checkpoint for more", "a run trains at least 1 stage")
VALIDATION_BOARDS = Count(1, 100_000, "more boards than a 2-agent validation set of 10,000 per size holds",
                          "evaluate on at least 1 board")
PER_SIZE = Count(1, 10_000, "10,000 boards per size is 80,000 boards per agent count to evaluate after every "
                            "stage",
                 "a size needs at least 1 validation board")
DEV_BOARDS = Count(3, 10_000, "10,000 boards per size is 80,000 boards to evaluate after every stage",
                   "the dev split needs at least 3 boards per size (one per wait subset)")
COMPLETION_TOKENS = Count(1, 32768, "longer than any chat model here answers; a plan needs far fewer tokens",
                          "an answer needs at least 1 token")
LORA_RANK = Count(0, 4096, "a LoRA rank above a model's width adds nothing (Gemma 3 270M: 640)")
LORA_ALPHA = Count(1, 65536, "LoRA's scale is alpha / rank: above 16 times the largest rank it only blows the adapters "
                             "up", "LoRA's scale alpha / rank is positive")
# A module LoRA adapts, by its name in the model (`q_proj`, `mlp.down_proj`), which peft matches against module names
LORA_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,127}")
PROBE_PER_SIZE = Count(1, 64, "64 boards per size is 512 boards a probe, each answered K times",
                       "a probe draws at least 1 board per size")
PROBE_GROUP = Count(2, 64, "64 answers per board is 32,768 answers a probe of 64 boards per size",
                    "a probe samples at least 2 answers per board (one says nothing of its spread)")
PROCESSES = Count(1, 64, "64 GPUs is 8 nodes of 8: more than one worker's launch runs a stage on",
                  "a stage runs on at least 1 process")


@dataclass(frozen=True)
class Counts:
    """Agent counts as a flag gives them, `2,3,4` (argparse calls it with the flag's text, `type=`), checked as the
    field is (`check`: a ValueError saying what is wrong)."""

    check: Callable[[tuple[int, ...]], tuple[int, ...]]

    def __call__(self, text: str) -> tuple[int, ...]:
        try:
            counts = tuple(int(part) for part in text.split(",") if part.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r:.40} is not agent counts separated by commas (e.g. 2,3,4)"
                                             ) from None
        try:
            return self.check(counts)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None


@dataclass(frozen=True)
class Setting:
    """How a person gives one of `RunSettings`'s fields (`Annotated[type, ..., Setting(...)]`), declared once
    beside its type: the help of its flag (None: no flag; a settings file and the page still set it; `{new_run}` in
    it reads the value below), the value a new run takes where neither a flag nor a settings file gives one
    (`new_run`; None: the field's own default, which a run stored before also reads), whether `envlab experiment
    new` takes the flag too (its runs auto-apply and take each arm's context), and the flag's name where it is not
    the field's. `lab.settings.settings_arguments` makes the flag: a `Count` in the type is its type, a bool a
    switch, a Literal its choices, `parse` anything else's."""

    help: str | None
    metavar: str | None = None
    new_run: Any = None
    experiment: bool = True
    flag: str | None = None
    parse: Callable[[str], Any] | None = None


class SettingsError(ValueError):
    """Run settings that cannot be used; the message names the setting and what is wrong with it, and `setting` is
    that setting where one is to blame (`grpo.KEY` for a GRPO override), as a settings file's lines are keyed."""

    def __init__(self, message: str, setting: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting


class Held(StrEnum):
    """The engineers that propose configs a person wrote down (`lab.engineers.held`): `static` one config for every
    stage, `schedule` one per stage."""

    STATIC = "static"
    SCHEDULE = "schedule"


class HeldConfigs(BaseModel):
    """The configs a `static` or `schedule` arm proposes, read once from a person's file when the arm was made and
    stored with each of its runs (`RunSettings.held_configs`), so a run never reads the file again (it may have
    moved). Each config is checked as strictly as a person's edit (`envsim.config.project(strict=True)`) wherever
    the record is made: from the file, from the database, from another lab's archive."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Held  # the engineer the configs were read for: a run of the other one cannot use them
    source: str = Field(min_length=1, max_length=255)  # the file's name, as the answers' rationale says it
    configs: tuple[EnvConfig, ...] = Field(min_length=1)  # a schedule's items in order; a static arm's one config

    @field_validator("configs", mode="before")
    @classmethod
    def _strict(cls, value: Any) -> Any:
        """Each item through the strict projection, the problem naming the item (counted from 1)."""
        if not isinstance(value, list | tuple):
            return value  # pydantic says what is wrong with it
        configs = []
        for n, item in enumerate(value, 1):
            try:
                configs.append(item if isinstance(item, EnvConfig) else project(item, strict=True).config)
            except ConfigError as err:
                raise ValueError(f"item {n}: {err}") from None
        return tuple(configs)

    @model_validator(mode="after")
    def _one_held(self) -> HeldConfigs:
        if self.kind == Held.STATIC and len(self.configs) != 1:
            raise ValueError(f"a static arm holds one config, not {len(self.configs)}")
        return self


class RunSettings(BaseModel):
    """Everything a run is asked to do beyond who it is (name, policy, engineer, seed: its row's columns) and
    where it starts (stage 0's config), as `Run.settings` stores it and the loop, the stage and the pages read it.

    A run's settings can arrive in another lab's archive (lab.archive checks them with this before anything is
    stored), so every key the lab reads has its type here; a key the lab does not read travels as it is.
    """

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)

    stages: Annotated[int, MAX_STAGES, Setting("training stages after stage 0 (default {new_run})", new_run=3)]
    auto_apply: Annotated[bool, Setting("apply every proposal without waiting for a person", experiment=False)] = False
    grpo: dict[str, Any] = Field(default_factory=dict)  # GRPOConfig fields, those of `GRPO_FIELDS` only
    # LoRA rank of every stage's training (0: every weight trains)
    lora: Annotated[int, LORA_RANK, Setting("train LoRA adapters of this rank (needs peft), e.g. 16 for a large "
                                            "policy; 0: every weight", "RANK")] = 0
    # LoRA's scale, dropout and the modules it adapts, by peft's own names (None: alpha twice the rank, dropout 0.05,
    # every linear layer: what every run stored before trained with); only with a rank (`lora`)
    lora_alpha: Annotated[Annotated[int, LORA_ALPHA] | None, Setting(None)] = None
    lora_dropout: Annotated[Annotated[float, Field(ge=0, lt=1)] | None, Setting(None)] = None
    lora_target_modules: Annotated[tuple[str, ...] | Literal["all-linear"] | None, Setting(None)] = None
    context: dict[str, bool] | None = None  # lab.context.ContextModules's fields (read there, with torch behind it)
    # the llm engineer's context preset (create_run resolves it into `context`; its choices are lab.context's)
    context_preset: Annotated[str | None, Setting("the llm engineer's context preset (docs/engineers.md; default "
                                                  "{default})", experiment=False, flag="context")] = None
    base_url: Annotated[str | None, Setting("base URL of an OpenAI-compatible server (openai: backends)")] = None
    # evaluate on that many of the validation boards (None: all of them)
    validation_boards: Annotated[Annotated[int, VALIDATION_BOARDS] | None, Setting(
        "evaluate each stage on N of the validation boards, spread over the (agent count, size) cells (default: "
        "all)", "N")] = None
    # a larger validation set (None: the standard 30 a size, an experiment's 120)
    validation_per_size: Annotated[Annotated[int, PER_SIZE] | None, Setting(
        f"validation boards per map size and agent count (e.g. 120: {boards_in(Split.VALIDATION, 120):,} boards at "
        f"agents 3-5, {boards_in(Split.VALIDATION, 120, FIRST_AGENTS):,} at 2 agents; 30: the standard "
        f"{boards_in(Split.VALIDATION, 30):,}; default 30, an experiment's 120)", "N")] = None
    # dev boards per map size: evaluated after each stage, what the engineers read (None: a run of an earlier
    # version, evaluated on the validation set only, whose engineers read that)
    dev_per_size: Annotated[Annotated[int, DEV_BOARDS] | None, Setting(
        "dev boards per map size, evaluated after each stage: what the engineers read, never the validation boards "
        "(a multiple of 3; default {new_run})", "N", new_run=DEV_PER_SIZE)] = None
    # the dev boards drawn from the run's seed, so each seed's engineer reads boards of its own (False: one dev set
    # for every seed, as every run made before had; the validation set is every seed's either way)
    dev_per_seed: Annotated[bool, Setting(None, new_run=True)] = False
    # the Measure panel's and the llm engineer's probe (None: training.probe's defaults)
    probe_boards: Annotated[Annotated[int, PROBE_PER_SIZE] | None, Setting(
        "boards per size in a probe (Measure, the llm engineer's measured context; default 8)", "B",
        experiment=False)] = None
    probe_answers: Annotated[Annotated[int, PROBE_GROUP] | None, Setting(
        "sampled answers per board in a probe (default 8)", "K", experiment=False)] = None
    remeasure: Annotated[bool, Setting(  # the llm engineer probes its answer and is asked once more
        "the llm engineer probes its answer on the policy and is asked once more where a size it changed measures "
        "too easy or too hard (docs/engineers.md)", experiment=False)] = False
    keep_checkpoints: Annotated[bool, Setting(  # keep TRL's intermediate checkpoints after a stage ends
        "keep TRL's intermediate checkpoints (checkpoint-*/) of every stage; by default a finished stage keeps only "
        "its final weights")] = False
    allow_cpu: Annotated[bool, Setting(  # a large pretrained policy may run on a worker without a GPU (slow)
        "let a worker without a GPU run a large pretrained policy (see ENVLAB_GPU_ABOVE)")] = False
    thinking: Annotated[Literal["off", "on"], Setting(  # a chat template's `enable_thinking`
        "a chat template's thinking mode (Qwen3's enable_thinking) in every prompt (default off)")] = "off"
    completion_length: Annotated[Annotated[int, COMPLETION_TOKENS] | None, Setting(  # None: by board
        "new tokens per answer in training, validation, the benchmark and probes (default: 512 for a chat policy, "
        "by board size for a compact one)", "TOKENS")] = None
    validation_decoding: Annotated[Decoding, Setting(  # sampled: the model's own generation_config
        "how validation and the benchmark decode: greedy, or sampled with the model's own generation_config "
        "(default greedy)")] = "greedy"
    # the agent counts an engineer may put in a stage's mix (`EnvConfig.agent_ratio`), fewest first (None: those of
    # stage 0's config, so a run that starts on 2 agents stays on 2, as every run did before the setting)
    agent_counts: Annotated[tuple[int, ...] | None, Setting(
        "the agent counts an engineer may put in a stage's agent mix, e.g. 2,3,4,5 (default: the counts of the config "
        "in force; docs/engineers.md)", "K,K,...", parse=Counts(lambda counts: checked_counts(counts)))] = None
    # the agent counts of the validation and dev boards, fewest first: `validation_per_size` and `dev_per_size` boards
    # per (count, size), on sizes max(3, K)..10 (`envsim.suite.validation_cells`); by default the paper's, 3, 4, 5 (a
    # run stored before that default says 2: storage/migrations/versions/0015_tiny_2agent.py)
    validation_agents: Annotated[tuple[int, ...], Setting(
        "the agent counts of the validation and dev boards, each on sizes max(3, K)..10, e.g. 2 (the first sets) "
        f"(default {','.join(map(str, VALIDATION_AGENTS))}, the paper's; docs/experiments.md)", "K,K,...",
        parse=Counts(lambda counts: checked_validation_agents(counts)))] = VALIDATION_AGENTS
    # the processes each training stage is launched on (`accelerate launch --num_processes`: the GPUs of the worker
    # that trains it), for which its steps are counted and its memory checked; only a worker of that many GPUs claims
    # its stages (a worker without a GPU counts as one). None: one, as every run stored before was planned
    processes: Annotated[Annotated[int, PROCESSES] | None, Setting(
        "the processes each stage is launched on, one per GPU: its steps are counted, its GRPO settings and memory "
        "checked for them, and only a worker of that many GPUs trains it (default 1)", "N",
        experiment=False)] = None
    engineer_history: list[dict[str, Any]] = Field(default_factory=list)
    example: bool = False
    held_configs: HeldConfigs | None = None  # what a `static` or `schedule` arm's run proposes (None: other runs)

    @field_validator("grpo")
    @classmethod
    def _grpo(cls, value: dict[str, Any]) -> dict[str, Any]:
        refused = refused_grpo(value)
        if fields := [k for k in refused if k != "report_to"]:
            which = "a GRPOConfig field" if len(fields) == 1 else "GRPOConfig fields"
            raise _refused(fields[0], f"{', '.join(fields)}: not {which} a run may set (a run sets how its policy "
                           "learns and samples; where its files, logs and weights go and what code it loads are the "
                           "lab's: docs/training.md, \"GRPO fields\")")
        if refused:
            raise _refused("report_to", f"report_to {value['report_to']!r:.60}: a run reports to "
                           f"{', '.join(REPORT_TO)} only (trackers that keep their records on this machine)")
        return value

    @property
    def overrides(self) -> GrpoOverrides:
        """The `grpo` overrides the lab reads itself, typed."""
        return GrpoOverrides.model_validate(self.grpo)

    @field_validator("validation_per_size")
    @classmethod
    def _per_size(cls, value: int | None) -> int | None:
        if value is not None:
            checked_per_size(Split.VALIDATION, value)  # a ValueError saying what it must be
        return value

    @field_validator("dev_per_size")
    @classmethod
    def _dev(cls, value: int | None) -> int | None:
        if value is not None:
            checked_per_size(Split.DEV, value)  # a ValueError: not a multiple of the wait subsets
        return value

    @field_validator("agent_counts", "validation_agents", mode="before")
    @classmethod
    def _counts_read(cls, value: Any) -> Any:
        """A list (a row's JSON, a settings file) reads as the tuple it was."""
        return tuple(value) if isinstance(value, list) else value

    @field_validator("lora_target_modules", mode="before")
    @classmethod
    def _modules_read(cls, value: Any) -> Any:
        """A list reads as the tuple it was; one string is all-linear or nothing (peft would read it as a pattern)."""
        if isinstance(value, str) and value != "all-linear":
            raise ValueError("a list of module names (e.g. [q_proj, v_proj]) or all-linear")
        return tuple(value) if isinstance(value, list) else value

    @field_validator("lora_target_modules")
    @classmethod
    def _modules(cls, value: tuple[str, ...] | str | None) -> tuple[str, ...] | str | None:
        if isinstance(value, tuple):
            if not 1 <= len(value) <= 64:
                raise ValueError(f"name from 1 to 64 modules (or all-linear), not {len(value)}")
            if bad := next((name for name in value if not LORA_MODULE.fullmatch(name)), None):
                raise ValueError(f"{bad!r:.60} is not a module's name (letters, digits, _ and ., e.g. q_proj)")
        return value

    @model_validator(mode="after")
    def _lora_shape(self) -> RunSettings:
        """LoRA's alpha, dropout and modules only with a rank: without one every weight trains and they say nothing."""
        if not self.lora and (given := [name for name in LORA_SHAPE if getattr(self, name) is not None]):
            message = f"{given[0]}: LoRA is off (lora = 0): give lora a rank (a TRL recipe's lora_r) to use it"
            raise PydanticCustomError("lora_off", "{message}", {"setting": given[0], "message": message})
        return self

    @field_validator("agent_counts")
    @classmethod
    def _counts(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        return None if value is None else checked_counts(value)

    @field_validator("validation_agents")
    @classmethod
    def _validation_agents(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        return checked_validation_agents(value)

    @classmethod
    def checked(cls, **values: Any) -> RunSettings:
        """The settings of `values`, or a SettingsError naming the first setting that is wrong."""
        try:
            return cls.model_validate(values)
        except ValidationError as err:
            raise SettingsError(first_error(err), setting_of(err)) from None


def _refused(key: str, message: str) -> PydanticCustomError:
    """The error of a GRPO override a run may not set: `message`, with the override's setting (`grpo.KEY`) in the
    error's context, where `setting_of` finds it."""
    return PydanticCustomError("grpo_refused", "{message}", {"setting": f"grpo.{key}", "message": message})


def setting_of(err: ValidationError) -> str | None:
    """The setting the first error of `err` is about, from where pydantic says it is: the field its `loc` starts
    with, or `grpo.KEY` for a GRPO override the `grpo` check refuses (that error's context says which)."""
    e = err.errors()[0]
    if "setting" in (e.get("ctx") or {}):
        return str(e["ctx"]["setting"])
    return str(e["loc"][0]) if e["loc"] else None


LORA_SHAPE = ("lora_alpha", "lora_dropout", "lora_target_modules")  # what LoRA's rank (`lora`) is needed for


def checked_counts(counts: tuple[int, ...]) -> tuple[int, ...]:
    """A run's `agent_counts` as it is stored: each within the rules' range, fewest first, each once; a ValueError
    naming the count out of range, or saying there is none."""
    least, most = AGENT_COUNTS
    if not counts:
        raise ValueError(f"name at least one agent count ({least}..{most})")
    if outside := [k for k in counts if not least <= k <= most]:
        raise ValueError(f"agent count {outside[0]} is outside {least}..{most}")
    return tuple(sorted(set(counts)))


def checked_validation_agents(counts: tuple[int, ...]) -> tuple[int, ...]:
    """A run's `validation_agents` as it is stored (`checked_counts`), each count's boards able to meet every wait
    subset at 3 dev boards a size (a ValueError naming the count otherwise)."""
    counts = checked_counts(counts)
    checked_agents(counts)  # the check of `dev_cells` and `validation_cells`, without making the cells
    return counts


def settings_declared() -> dict[str, Setting]:
    """Each of `RunSettings`'s fields that a person gives, and how (its `Setting`), in the fields' order."""
    return {name: meta for name, field in RunSettings.model_fields.items() for meta in field.metadata
            if isinstance(meta, Setting)}


# What a new run takes where neither a flag nor a settings file gives it (the flags' defaults, the page form's), by
# field; a field not here takes the model's default.
NEW_RUN: dict[str, Any] = {name: s.new_run for name, s in settings_declared().items() if s.new_run is not None}


def first_error(err: ValidationError) -> str:
    """A pydantic error as one line: `field = value: message` (the value where it is a short one)."""
    e = err.errors()[0]
    where, msg = ".".join(map(str, e["loc"])), e["msg"].removeprefix("Value error, ")
    if where and isinstance(e.get("input"), int | float | str | bool) and len(repr(e["input"])) <= 40:
        where = f"{where} = {e['input']!r}"
    return f"{where}: {msg}" if where else msg


Primary = Literal["valid", "optimal"]  # an experiment's primary metric: the rate its report leads with
PRIMARY_RATES: tuple[str, ...] = get_args(Primary)
# How `--match-compute` evens the answers an experiment's arms generate per stage: `extra`, the arms that probe less
# (none, mostly) train extra GRPO steps for the answers the most probing arm samples; `trim`, the arms that probe
# more train fewer steps, down to the least probing arm's answers.
MatchMode = Literal["extra", "trim"]
MATCH_MODES: tuple[str, ...] = get_args(MatchMode)


class ComputeMatch(BaseModel):
    """How an experiment evened its arms' generated answers (`lab.study.experiments.match_compute`): each arm's probe
    answers per proposal as planned (0: it does not probe), and the GRPO steps added to each of its trained stages,
    the stages that follow a proposal (negative: taken off), with the rollouts those steps sample."""

    model_config = ConfigDict(strict=True, frozen=True)

    mode: MatchMode
    probe_answers: dict[str, int]  # arm -> probe answers per proposal (planned: none found in the probe cache)
    steps: dict[str, int]  # arm -> GRPO steps added to every trained stage
    rollouts: dict[str, int]  # arm -> rollouts (completions) those steps add to every trained stage


class ExperimentSettings(BaseModel):
    """What every run of an experiment shares (`run`, its settings whole, and `config`, the initial config) and the
    compute it buys, as `Experiment.settings` stores it: the figures a report quotes beside them are derived from
    those when the experiment is made (`lab.study.experiments.compute_settings`) and never change after."""

    model_config = ConfigDict(extra="allow", frozen=True)

    run: RunSettings  # every run's settings (each arm sets its own context on top)
    config: EnvConfig  # stage 0's config of every run
    steps_per_stage: int = Field(ge=1)  # GRPO steps a stage takes, as TRL counts them (training.stage.planned_steps)
    validation_boards: int = Field(ge=1)  # boards each stage is evaluated on
    validation_per_size: Annotated[int, PER_SIZE] = VALIDATION_PER_SIZE
    scenario: str | None = None  # where the initial config came from (a scenario's name, or "a config of its own")
    slurm_arrays: list[str] = Field(default_factory=list)  # the Slurm array jobs that ran it (lab.study.slurm)
    rollouts_per_stage: int | None = Field(default=None, ge=1)  # completions a stage samples for training (None:
    # an experiment made before they were recorded: counted from its settings when asked)
    primary: Primary = "valid"  # the rate its report and the Compare tab lead with; an experiment made before: valid
    matched: ComputeMatch | None = None  # the arms' answers evened by GRPO steps (None: every arm trains the same)
    processes: Annotated[int, PROCESSES] = 1  # processes a stage is launched on (a worker's GPUs), for which
    # the steps and rollouts above are counted (an experiment made before it was recorded: one)

    @property
    def stages(self) -> int:
        return self.run.stages

    @property
    def instances(self) -> int:
        """Boards per stage."""
        return self.config.num_instances

    @property
    def grpo(self) -> dict[str, Any]:
        return self.run.grpo

    @property
    def validation_agents(self) -> tuple[int, ...]:
        """The agent counts of every run's validation and dev boards."""
        return self.run.validation_agents

    @property
    def validation_subset(self) -> int | None:
        """The validation boards asked for (None: the whole set)."""
        return self.run.validation_boards

    def compute(self) -> dict[str, Any]:
        """What two experiments must share to be compared at equal compute (`lab.study.experiments.adopt_runs`)."""
        return {"stages": self.stages, "instances": self.instances, "grpo": self.grpo,
                "steps_per_stage": self.steps_per_stage, "validation_per_size": self.validation_per_size,
                "validation_agents": list(self.validation_agents), "validation_boards": self.validation_boards,
                "validation_subset": self.validation_subset,
                "config": self.config.model_dump(mode="json"), "lora": self.run.lora,
                **({"matched": self.matched.model_dump()} if self.matched is not None else {})}

    def arm_steps(self, arm: str) -> int:
        """The GRPO steps each trained stage of `arm`'s runs takes: the experiment's, and its matching steps."""
        return self.steps_per_stage + (self.matched.steps.get(arm, 0) if self.matched is not None else 0)
