"""The command line's and the page's side of a run's settings (`storage.settings.RunSettings`, the typed record):
the flags every command that creates runs takes (`settings_arguments`, each `dest` a field's name, read back by
`settings_from_args`, each count's bound the field's own `Count`), and a run's settings file, read as any file a
person names is read (`read_settings_file`).
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import yaml

from storage.settings import (
    GRPO_FIELDS,
    NEW_RUN,
    Count,
    RunSettings,
    SettingsError,
    settings_declared,
)

# The bounds of the counts a run takes on the command line and in the page's form, each with why it is where it is;
# those of a run's settings are `RunSettings`'s own (storage.settings), so every way in meets the same bound.
MAX_BOARDS = Count(1, 100_000, "a config's num_instances is at most 100,000 boards per stage",
                   "a stage trains on at least 1 board")
SEED = Count(0, 2**31 - 1, "a run's seed is stored in a 32-bit column (PostgreSQL's integer)",
             "numpy's generators take no negative seed")


# `--agent-counts 2,3,4` and `--validation-agents 3,4,5`: agent counts separated by commas, checked as the fields are
agent_counts = settings_declared()["agent_counts"].parse
validation_agents = settings_declared()["validation_agents"].parse


def counts_text(agents: Sequence[int]) -> str:
    """Agent counts in words: "3-5" for a range, "2, 4" otherwise, "3" for one."""
    counts = sorted(agents)
    if len(counts) > 2 and counts == list(range(counts[0], counts[-1] + 1)):
        return f"{counts[0]}-{counts[-1]}"
    return ", ".join(map(str, counts))


def settings_arguments(parser: argparse.ArgumentParser, *, experiment: bool = False) -> None:
    """The flags of a run's settings, for every command that creates runs, each made from its field's declaration
    (`storage.settings.Setting`): `dest` the field's name, a `Count` its type, a bool a switch, a Literal its
    choices. `experiment`: the flags of `envlab experiment new` (its runs always auto-apply; the context is each
    arm's)."""
    from lab.context import CONTEXT_PRESETS, DEFAULT_PRESET  # here: the presets' names, for the flag's choices

    parser.add_argument("--settings", type=Path, metavar="FILE.yaml",
                        help="every run setting from one YAML file (keys: the settings' names, grpo: a mapping of "
                             "GRPOConfig fields; a TRL recipe's names too: lora_r, use_peft, chat_template_kwargs, "
                             "GRPOConfig fields at the top); the flags given go on top (docs/training.md, \"Settings "
                             "files\")")
    for name, setting in settings_declared().items():
        if setting.help is None or (experiment and not setting.experiment):
            continue
        field = RunSettings.model_fields[name]
        annotation = field.annotation
        kind: dict[str, Any] = {"default": None}
        if annotation is bool:
            kind["action"] = "store_true"
        elif name == "context_preset":
            kind["choices"] = list(CONTEXT_PRESETS)
        elif (choices := _literal(annotation)) is not None:
            kind["choices"] = choices
        elif (parse := setting.parse or _count(field.metadata, annotation)) is not None:
            kind |= {"type": parse, "metavar": setting.metavar}
        help_text = setting.help.format(new_run=setting.new_run, default=DEFAULT_PRESET)
        parser.add_argument(f"--{(setting.flag or name).replace('_', '-')}", dest=name, help=help_text, **kind)


def _literal(annotation: Any) -> tuple[Any, ...] | None:
    """A Literal's values (a setting whose flag offers them as its choices); None for any other type."""
    return get_args(annotation) if get_origin(annotation) is Literal else None


def _count(metadata: list[Any], annotation: Any) -> Count | None:
    """The `Count` of a field: among its own metadata (`Annotated[int, Count, ...]`, which pydantic keeps beside
    the type), or in its type (`Annotated[int, Count] | None`); None where there is none."""
    inner = [meta for part in (annotation, *get_args(annotation)) if get_origin(part) is Annotated
             for meta in get_args(part)[1:]]
    return next((meta for meta in (*metadata, *inner) if isinstance(meta, Count)), None)


def settings_from_args(args: argparse.Namespace, *, grpo: dict[str, Any] | None = None,
                       grpo_under: dict[str, Any] | None = None, **values: Any) -> RunSettings:
    """The settings of a command: what a new run takes (`NEW_RUN`), then `--settings FILE.yaml`, then every
    flag given (`settings_arguments`: each `dest` a field's name), then `values`. GRPO fields merge the same way,
    over `grpo_under` (a scenario's): the file's `grpo`, then `grpo` (the `--grpo KEY=VALUE` pairs the command
    parsed). A SettingsError names the file's line where the setting came from the file."""
    file = settings_file(args)
    given = {name: getattr(args, name) for name in RunSettings.model_fields
             if name != "grpo" and getattr(args, name, None) is not None}
    from_file = dict(file.values) if file else {}
    merged = {**(grpo_under or {}), **from_file.pop("grpo", {}), **(grpo or {})}
    try:
        settings = RunSettings.checked(**{**NEW_RUN, **from_file, **given, **values, "grpo": merged})
    except SettingsError as err:
        raise SettingsError(file.located(err, set(given) | set(values), set(grpo or {})) if file
                            else str(err), err.setting) from None
    for said in file.became if file else ():  # TRL's and PEFT's names, each with the lab setting it became
        print(said, file=sys.stderr)
    return settings


SETTINGS_FILE_BYTES = 64 * 1024  # a settings file is a few lines; anything larger is not one
SETTINGS_FILE_DEPTH = 32  # a settings file's deepest nesting (it needs 3: held configs' ratios); deeper is not one
FILE_KEYS = tuple(sorted(set(RunSettings.model_fields) - {"context", "engineer_history", "example"}))
# The names of TRL's and PEFT's own that a settings file also reads, so a `trl grpo --config recipe.yaml` recipe can be
# pasted in (`_from_trl`): ModelConfig's `use_peft` and `lora_r` become `lora` (its `lora_alpha`, `lora_dropout` and
# `lora_target_modules` are the lab's own names), `chat_template_kwargs`' `enable_thinking` becomes `thinking`, and a
# GRPOConfig field at the top level goes into `grpo`, checked there as any of `grpo`'s.
TRL_NAMES = ("chat_template_kwargs", "lora_r", "use_peft")
TRL_LORA_R = 16  # TRL's ModelConfig's lora_r, the rank `use_peft: true` alone asks for


@dataclass(frozen=True)
class SettingsFile:
    """A settings file read and checked for its shape (`read_settings_file`): its values, and the line of each
    setting (`grpo.KEY` for a GRPO field) for the messages that name one."""

    path: Path
    values: dict[str, Any]
    lines: dict[str, int]
    became: tuple[str, ...] = ()  # `FILE:LINE: name -> setting` for each of TRL's names read (`_from_trl`)

    def located(self, err: Exception, flags: set[str] = frozenset(), grpo_flags: set[str] = frozenset()) -> str:
        """`err`'s message with `FILE:LINE: ` in front where the setting it is about (`SettingsError.setting`: its
        own, or its cause's) came from this file, not from a flag given on top of it (`flags`: settings' names,
        `grpo_flags`: GRPO fields')."""
        cause: BaseException | None = err
        while cause is not None and not isinstance(cause, SettingsError):
            cause = cause.__cause__
        key = cause.setting if isinstance(cause, SettingsError) else None
        grpo = key.removeprefix("grpo.") if key and key.startswith("grpo.") else None
        if key in self.lines and (grpo or key) not in (grpo_flags if grpo else flags):
            return f"{self.path}:{self.lines[key]}: {err}"
        return f"{self.path}: {err}"


def settings_file(args: argparse.Namespace) -> SettingsFile | None:
    """The `--settings` file of a command, read (None without one)."""
    path = getattr(args, "settings", None)
    return None if path is None else read_settings_file(path)


def read_settings_file(path: Path) -> SettingsFile:
    """A YAML mapping of run settings (`FILE_KEYS`; `grpo` a mapping of GRPOConfig fields; TRL's names as the settings
    they become, `_from_trl`): a regular file of at most
    `SETTINGS_FILE_BYTES` (`read_regular`), read with YAML's safe loader, no aliases and at most
    `SETTINGS_FILE_DEPTH` levels deep (`_Loader`); its values are checked with the flags' (`settings_from_args`). A
    SettingsError names the file and the line of what is wrong."""
    try:
        data = read_regular(path, SETTINGS_FILE_BYTES, "a settings file")
        if len(data) > SETTINGS_FILE_BYTES:
            raise SettingsError(f"{path}: more than {SETTINGS_FILE_BYTES:,} bytes: not a settings file")
        text = data.decode("utf-8")
    except FileRefused as err:
        raise SettingsError(str(err)) from None
    except UnicodeDecodeError as err:
        raise SettingsError(f"{path}: not UTF-8 text (byte {err.start})") from None
    loader = _Loader(text, path)
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
    values, became = _from_trl(path, values, lines)
    return SettingsFile(path, values, lines, became)


def _from_trl(path: Path, values: dict[str, Any], lines: dict[str, int]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """`values` with TRL's names (`TRL_NAMES`, and GRPOConfig fields at the top level) as the lab settings they
    become, `lines` keyed by those settings too, and a line saying each; a SettingsError (naming the file's line)
    where two of them say different things or one holds what the lab cannot read."""
    values, became = dict(values), {}

    def refuse(key: str, why: str) -> None:
        raise SettingsError(f"{path}:{lines[key]}: {key}: {why}", key)

    if moved := [key for key in values if key not in FILE_KEYS and key not in TRL_NAMES]:
        values["grpo"] = {**values.get("grpo", {}), **{key: values.pop(key) for key in moved}}
        became |= {key: f"grpo.{key}" for key in moved}
    if "lora_r" in values:
        if "lora" in values:
            refuse("lora_r", f"lora_r and lora (line {lines['lora']}) both give LoRA's rank: keep one")
        values["lora"], lines["lora"], became["lora_r"] = values.pop("lora_r"), lines["lora_r"], "lora"
    if "use_peft" in values:
        use = values.pop("use_peft")
        if not isinstance(use, bool):
            refuse("use_peft", f"{use!r:.40} is not true or false")
        if "lora" in values and bool(values["lora"]) != use:
            refuse("use_peft", f"use_peft is {str(use).lower()} but lora is {values['lora']!r:.20}")
        if "lora" not in values:
            values["lora"], lines["lora"] = TRL_LORA_R if use else 0, lines["use_peft"]
        became["use_peft"] = "lora"
    if "chat_template_kwargs" in values:
        kwargs = values.pop("chat_template_kwargs")
        if not isinstance(kwargs, dict) or set(kwargs) - {"enable_thinking"} or \
                not isinstance(kwargs.get("enable_thinking", False), bool):
            refuse("chat_template_kwargs", "the lab reads enable_thinking only (true or false: its thinking setting)")
        if "thinking" in values:
            refuse("chat_template_kwargs", f"chat_template_kwargs and thinking (line {lines['thinking']}) both "
                                           "set the thinking mode: keep one")
        if "enable_thinking" in kwargs:
            values["thinking"] = "on" if kwargs["enable_thinking"] else "off"
            lines["thinking"] = lines["chat_template_kwargs"]
        became["chat_template_kwargs"] = "thinking"
    line_of = {key: lines.get(key) or lines[f"grpo.{key}"] for key in became}
    return values, tuple(f"{path}:{line_of[key]}: {key} -> {became[key]}" for key in sorted(became, key=line_of.get))


class _Loader(yaml.SafeLoader):
    """YAML's safe loader, refusing an alias (`*name`: a few lines of them expand to gigabytes) and nesting deeper
    than `SETTINGS_FILE_DEPTH` (PyYAML composes a node's children by recursion: 20,000 brackets overflow the stack)."""

    def __init__(self, text: str, path: Path) -> None:
        super().__init__(text)
        self.path, self.depth = path, 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()
        where = f"{self.path}:{event.start_mark.line + 1}"
        if isinstance(event, yaml.AliasEvent):
            raise SettingsError(f"{where}: an alias (*{event.anchor}): a settings file writes each value out")
        if self.depth >= SETTINGS_FILE_DEPTH:
            raise SettingsError(f"{where}: nested more than {SETTINGS_FILE_DEPTH} levels deep: not a settings file")
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


class FileRefused(ValueError):
    """A file a person named that is not read (`read_regular`); the message names it and says why."""


def read_regular(path: Path, limit: int, what: str) -> bytes:
    """At most `limit + 1` bytes of the file at `path` (more than `limit`: the caller says why that is too many),
    where the path resolves to a regular file: a directory, a device (/dev/zero), a pipe or a link to one is refused
    before it is opened, and checked again once open, without blocking (it may have been swapped meanwhile), so a
    file a person names neither fills the memory nor hangs the command. `what` is what the file should be (the
    refusal of a directory says it). A FileRefused names the path and what is wrong."""
    try:
        resolved = path.resolve(strict=True)
        _regular(path, resolved, resolved.stat().st_mode, what)
        fd = os.open(resolved, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise FileRefused(f"{path}: no such file") from None
    except (OSError, RuntimeError) as err:  # a loop of links, a name too long, no permission
        raise FileRefused(f"{path}: cannot be read ({getattr(err, 'strerror', None) or err})") from None
    with os.fdopen(fd, "rb") as f:
        _regular(path, resolved, os.fstat(f.fileno()).st_mode, what)
        return f.read(limit + 1)


def _regular(path: Path, resolved: Path, mode: int, what: str) -> None:
    where = "" if resolved == path.absolute() else f" (it resolves to {resolved})"
    if stat.S_ISDIR(mode):
        raise FileRefused(f"{path}: a directory{where}, not {what}")
    if not stat.S_ISREG(mode):
        raise FileRefused(f"{path}: not a regular file{where}")


def _lines(path: Path, node: yaml.MappingNode) -> dict[str, int]:
    """The line of each setting of the file's mapping (`grpo.KEY` for each field of its `grpo` and each GRPOConfig
    field at the top level), refusing a key that is none of `FILE_KEYS`, `TRL_NAMES` and GRPOConfig's fields, or one
    given twice."""
    lines: dict[str, int] = {}

    def add(name: str, line: int) -> None:
        if name in lines:
            raise SettingsError(f"{path}:{line}: {name.removeprefix('grpo.')} is given twice (first on line "
                                f"{lines[name]})")
        lines[name] = line

    for key_node, value_node in node.value:
        key, line = key_node.value, key_node.start_mark.line + 1
        if key in FILE_KEYS or key in TRL_NAMES:
            add(key, line)
        elif key in GRPO_FIELDS or key in _grpo_config():  # a GRPOConfig field at the top level, as TRL's recipes
            add(f"grpo.{key}", line)
        else:
            raise SettingsError(f"{path}:{line}: {key!r:.60} is not a run setting (one of {', '.join(FILE_KEYS)}; "
                                f"or a GRPOConfig field, or TRL's {', '.join(TRL_NAMES)})")
        if key == "grpo" and isinstance(value_node, yaml.MappingNode):
            for k, _ in value_node.value:
                add(f"grpo.{k.value}", k.start_mark.line + 1)
    return lines


def _grpo_config() -> frozenset[str]:
    """The fields of TRL's `GRPOConfig` (imported only here: to tell a GRPOConfig field the lab sets itself, which
    `grpo` refuses saying why, from a name that is nothing)."""
    import dataclasses

    from trl import GRPOConfig

    return frozenset(field.name for field in dataclasses.fields(GRPOConfig))


def settings_yaml(settings: RunSettings) -> str:
    """A run's settings as a settings file (`read_settings_file` reads it back): what `--print-settings` writes."""
    shown = settings.model_dump(mode="json", exclude_none=True, include=set(FILE_KEYS))
    return yaml.safe_dump(shown, sort_keys=False, allow_unicode=True)
