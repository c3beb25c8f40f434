"""The command line's and the page's side of a run's settings (`storage.settings.RunSettings`, the typed record):
the flags every command that creates runs takes (`settings_arguments`, each `dest` a field's name, read back by
`settings_from_args`), and the bounds of the counts a person types (`Count`), one bound for every way in.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from envsim.suite import (
    DEV_PER_SIZE,
    FIRST_AGENTS,
    VALIDATION_AGENTS,
    VALIDATION_PER_SIZE,
    Split,
    boards_in,
    validation_cells,
)
from storage.settings import DECODINGS, RunSettings, SettingsError, checked_counts


@dataclass(frozen=True)
class Count:
    """A whole number from `low` to `high`, one bound for every way in: argparse calls it with the text of a flag
    (`type=`), a page's number box goes through `check`. A number out of range is refused saying why the bound is
    where it is (`why` above, `too_few` below), in the same words on both."""

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
        if (why := self.refusal(int(value))) is not None:
            raise ValueError(why)
        return int(value)

    def refusal(self, value: int) -> str | None:
        """Why `value` is out of range, None when it is in."""
        if value < self.low:
            return f"{value:,} is less than {self.low}" + (f": {self.too_few}" if self.too_few else "")
        if value > self.high:
            return f"{value:,} is more than {self.high:,}: {self.why}"
        return None

    def _not_whole(self, shown: str) -> str:
        return f"{shown} is not a whole number from {self.low} to {self.high:,}"


# The bounds of the counts a run takes on the command line and in the page's form, each with why it is where it is.
MAX_STAGES = Count(1, 1000, "each stage trains and evaluates the policy (minutes to hours); run again from "
                            "the last stage's checkpoint for more", "a run trains at least 1 stage")
MAX_BOARDS = Count(1, 100_000, "a config's num_instances is at most 100,000 boards per stage",
                   "a stage trains on at least 1 board")
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
SEED = Count(0, 2**31 - 1, "a run's seed is stored in a 32-bit column (PostgreSQL's integer)",
             "numpy's generators take no negative seed")


def agent_counts(text: str) -> tuple[int, ...]:
    """`--agent-counts 2,3,4`: agent counts separated by commas, checked as `RunSettings.agent_counts` is."""
    return _counts(text, checked_counts)


def validation_agents(text: str) -> tuple[int, ...]:
    """`--validation-agents 3,4,5`: agent counts separated by commas, checked as `RunSettings.validation_agents`
    is (each within the rules' range and at least 2: one agent never meets a wait subset)."""
    def checked(counts: tuple[int, ...]) -> tuple[int, ...]:
        counts = checked_counts(counts)
        validation_cells(VALIDATION_PER_SIZE, counts)
        return counts

    return _counts(text, checked)


def _counts(text: str, check: Callable[[tuple[int, ...]], tuple[int, ...]]) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r:.40} is not agent counts separated by commas (e.g. 2,3,4)"
                                         ) from None
    try:
        return check(counts)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def counts_text(agents: Sequence[int]) -> str:
    """Agent counts in words: "3-5" for a range, "2, 4" otherwise, "3" for one."""
    counts = sorted(agents)
    if len(counts) > 2 and counts == list(range(counts[0], counts[-1] + 1)):
        return f"{counts[0]}-{counts[-1]}"
    return ", ".join(map(str, counts))


def settings_arguments(parser: argparse.ArgumentParser, *, experiment: bool = False) -> None:
    """The flags of a run's settings, for every command that creates runs; each `dest` is a RunSettings field.
    `experiment`: the flags of `envlab experiment new` (its runs always auto-apply; the context is each arm's)."""
    from lab.context import CONTEXT_PRESETS, DEFAULT_PRESET  # here: the presets' names, for the flag's choices

    parser.add_argument("--settings", type=Path, metavar="FILE.yaml",
                        help="every run setting from one YAML file (keys: the settings' names, grpo: a mapping of "
                             "GRPOConfig fields); the flags given go on top (docs/training.md, \"Settings files\")")
    parser.add_argument("--stages", type=MAX_STAGES,
                        help=f"training stages after stage 0 (default {FLAG_DEFAULTS['stages']})")
    parser.add_argument("--base-url", help="base URL of an OpenAI-compatible server (openai: backends)")
    parser.add_argument("--lora", type=LORA_RANK, metavar="RANK",
                        help="train LoRA adapters of this rank (needs peft), e.g. 16 for a large policy; 0: every "
                             "weight")
    parser.add_argument("--validation-boards", type=VALIDATION_BOARDS, metavar="N",
                        help="evaluate each stage on N of the validation boards, spread over the (agent count, size) "
                             "cells (default: all)")
    parser.add_argument("--validation-per-size", type=PER_SIZE, metavar="N",
                        help=f"validation boards per map size and agent count (e.g. 120: "
                             f"{boards_in(Split.VALIDATION, 120):,} boards at agents 3-5, "
                             f"{boards_in(Split.VALIDATION, 120, FIRST_AGENTS):,} at 2 agents; 30: the standard "
                             f"{boards_in(Split.VALIDATION, 30):,}; default {120 if experiment else 30})")
    parser.add_argument("--validation-agents", type=validation_agents, metavar="K,K,...",
                        help="the agent counts of the validation and dev boards, each on sizes max(3, K)..10, e.g. "
                             f"2 (the first sets) (default {','.join(map(str, VALIDATION_AGENTS))}, the paper's; "
                             "docs/experiments.md)")
    parser.add_argument("--keep-checkpoints", action="store_true", default=None,
                        help="keep TRL's intermediate checkpoints (checkpoint-*/) of every stage; by default a "
                             "finished stage keeps only its final weights")
    parser.add_argument("--allow-cpu", action="store_true", default=None,
                        help="let a worker without a GPU run a large pretrained policy (see ENVLAB_GPU_ABOVE)")
    parser.add_argument("--dev-per-size", type=DEV_BOARDS, metavar="N",
                        help=f"dev boards per map size, evaluated after each stage: what the engineers read, never the "
                             f"validation boards (a multiple of 3; default {DEV_PER_SIZE})")
    parser.add_argument("--thinking", choices=("off", "on"), default=None,
                        help="a chat template's thinking mode (Qwen3's enable_thinking) in every prompt (default off)")
    parser.add_argument("--completion-length", type=COMPLETION_TOKENS, metavar="TOKENS",
                        help="new tokens per answer in training, validation, the benchmark and probes (default: 512 "
                             "for a chat policy, by board size for a compact one)")
    parser.add_argument("--validation-decoding", choices=DECODINGS, default=None,
                        help="how validation and the benchmark decode: greedy, or sampled with the model's own "
                             "generation_config (default greedy)")
    parser.add_argument("--agent-counts", type=agent_counts, metavar="K,K,...",
                        help="the agent counts an engineer may put in a stage's agent mix, e.g. 2,3,4,5 (default: the "
                             "counts of the config in force; docs/engineers.md)")
    if experiment:
        return
    parser.add_argument("--auto-apply", action="store_true", default=None,
                        help="apply every proposal without waiting for a person")
    parser.add_argument("--context", dest="context_preset", choices=list(CONTEXT_PRESETS),
                        help=f"the llm engineer's context preset (docs/engineers.md; default {DEFAULT_PRESET})")
    parser.add_argument("--remeasure", action="store_true", default=None,
                        help="the llm engineer probes its answer on the policy and is asked once more where a size "
                             "it changed measures too easy or too hard (docs/engineers.md)")
    parser.add_argument("--probe-boards", type=int, metavar="B", help="boards per size in a probe (Measure, the llm "
                                                                       "engineer's measured context; default 8)")
    parser.add_argument("--probe-answers", type=int, metavar="K",
                        help="sampled answers per board in a probe (default 8)")


def settings_from_args(args: argparse.Namespace, *, grpo: dict[str, Any] | None = None,
                       grpo_under: dict[str, Any] | None = None, **values: Any) -> RunSettings:
    """The settings of a command: the flags' defaults (`FLAG_DEFAULTS`), then `--settings FILE.yaml`, then every
    flag given (`settings_arguments`: each `dest` a field's name), then `values`. GRPO fields merge the same way,
    over `grpo_under` (a scenario's): the file's `grpo`, then `grpo` (the `--grpo KEY=VALUE` pairs the command
    parsed). A SettingsError names the file's line where the setting came from the file."""
    file = settings_file(args)
    given = {name: getattr(args, name) for name in RunSettings.model_fields
             if name != "grpo" and getattr(args, name, None) is not None}
    from_file = dict(file.values) if file else {}
    merged = {**(grpo_under or {}), **from_file.pop("grpo", {}), **(grpo or {})}
    try:
        return RunSettings.checked(**{**FLAG_DEFAULTS, **from_file, **given, **values, "grpo": merged})
    except SettingsError as err:
        raise SettingsError(file.located(str(err), set(given) | set(values), set(grpo or {})) if file
                            else str(err)) from None


# What a flag left out means, below a settings file (a RunSettings field without one here takes the model's default).
FLAG_DEFAULTS: dict[str, Any] = {"stages": 3, "dev_per_size": DEV_PER_SIZE, "dev_per_seed": True}
SETTINGS_FILE_BYTES = 64 * 1024  # a settings file is a few lines; anything larger is not one
FILE_KEYS = tuple(sorted(set(RunSettings.model_fields) - {"context", "engineer_history", "example"}))
_NAMED = re.compile(r"^(?:settings\['grpo'\] has '(?P<unknown>\w+)'|grpo (?P<grpo>\w+) =|(?P<field>\w+)(?: =|:))")


@dataclass(frozen=True)
class SettingsFile:
    """A settings file read and checked for its shape (`read_settings_file`): its values, and the line of each
    setting (`grpo.KEY` for a GRPO field) for the messages that name one."""

    path: Path
    values: dict[str, Any]
    lines: dict[str, int]

    def located(self, message: str, flags: set[str] = frozenset(), grpo_flags: set[str] = frozenset()) -> str:
        """`message` with `FILE:LINE: ` in front where it names a setting that came from this file (not from a
        flag given on top of it)."""
        found = _NAMED.match(message)
        if found is not None:
            grpo = found["unknown"] or found["grpo"]
            key = f"grpo.{grpo}" if grpo else found["field"]
            if key in self.lines and (grpo or key) not in (grpo_flags if grpo else flags):
                return f"{self.path}:{self.lines[key]}: {message}"
        return f"{self.path}: {message}"


def settings_file(args: argparse.Namespace) -> SettingsFile | None:
    """The `--settings` file of a command, read (None without one)."""
    path = getattr(args, "settings", None)
    return None if path is None else read_settings_file(path)


def read_settings_file(path: Path) -> SettingsFile:
    """A YAML mapping of run settings (`FILE_KEYS`; `grpo` a mapping of GRPOConfig fields), bounded in size and
    read with YAML's safe loader; its values are checked with the flags' (`settings_from_args`). A SettingsError
    names the file and the line of what is wrong."""
    try:
        size = path.stat().st_size
        if size > SETTINGS_FILE_BYTES:
            raise SettingsError(f"{path}: {size:,} bytes, more than {SETTINGS_FILE_BYTES:,}: not a settings file")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise SettingsError(f"{path}: cannot be read ({err.strerror if isinstance(err, OSError) else err})"
                            ) from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return SettingsFile(path, {}, {})
        if not isinstance(node, yaml.MappingNode):
            raise SettingsError(f"{path}:{node.start_mark.line + 1}: a settings file is a mapping of setting: value")
        lines = _lines(path, node)
        values = loader.construct_document(node)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise SettingsError(f"{where}: not YAML: {getattr(err, 'problem', None) or err}") from None
    finally:
        loader.dispose()
    if not isinstance(values.get("grpo", {}), dict):
        raise SettingsError(f"{path}:{lines['grpo']}: grpo is a mapping of GRPOConfig fields (field: value)")
    return SettingsFile(path, values, lines)


def _lines(path: Path, node: yaml.MappingNode) -> dict[str, int]:
    """The line of each setting of the file's mapping (and of each field of its `grpo`), refusing a key that is not
    a setting, or one given twice."""
    lines: dict[str, int] = {}
    for key_node, value_node in node.value:
        key, line = key_node.value, key_node.start_mark.line + 1
        if key not in FILE_KEYS:
            raise SettingsError(f"{path}:{line}: {key!r:.60} is not a run setting (one of {', '.join(FILE_KEYS)})")
        if key in lines:
            raise SettingsError(f"{path}:{line}: {key} is given twice (first on line {lines[key]})")
        lines[key] = line
        if key == "grpo" and isinstance(value_node, yaml.MappingNode):
            lines.update({f"grpo.{k.value}": k.start_mark.line + 1 for k, _ in value_node.value})
    return lines


def settings_yaml(settings: RunSettings) -> str:
    """A run's settings as a settings file (`read_settings_file` reads it back): what `--print-settings` writes."""
    shown = settings.model_dump(mode="json", exclude_none=True, include=set(FILE_KEYS))
    return yaml.safe_dump(shown, sort_keys=False, allow_unicode=True)
