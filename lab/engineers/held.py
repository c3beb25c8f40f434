"""The held engineers: configs a person wrote down, proposed as they are. `static` holds one config for every stage
(e.g. the best config a screen found), `schedule` one per stage (e.g. 2 -> 3 -> 4 agents): the proposal after stage
k is item k + 1 (counted from 1), the last item again once the items run out.

They read no evidence, so an experiment's held arm says what a fixed curriculum reaches at the same compute. The
configs come from a file read once, when the arm is made (`read_held`), and travel with each run of the arm in its
settings (`storage.settings.HeldConfigs`); the loop hands them in as the option `held`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from envsim.config import ConfigError, EnvConfig, project
from lab.context import Evidence
from lab.engineers.answer import EngineerAnswer, answer_of
from lab.engineers.needs import Needs
from lab.settings import FileRefused, read_regular
from storage.settings import Held, HeldConfigs, RunSettings

MAX_HELD_BYTES = 256 * 1024  # a held file's most bytes: a schedule of hundreds of configs fits with room to spare


class HeldFileError(ValueError):
    """A held file that cannot be used; the message names the file and what is wrong."""


def read_held(path: str | Path, kind: Held) -> HeldConfigs:
    """The configs of a person's file, checked: a static file is one config (a JSON object), a schedule file a
    non-empty JSON list of configs; each config strictly (`envsim.config.project(strict=True)`), the problem naming
    a schedule's item (counted from 1). The path must resolve to a regular file of at most `MAX_HELD_BYTES`."""
    data = _read_bounded(Path(path))
    try:
        raw = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise HeldFileError(f"{path}: not UTF-8 text (byte {err.start})") from None
    except json.JSONDecodeError as err:
        raise HeldFileError(f"{path}: not JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    if kind == Held.STATIC:
        if not isinstance(raw, dict):
            raise HeldFileError(f"{path}: a static arm's file holds one config (a JSON object), "
                                f"not a {_json_kind(raw)}")
        items = [raw]
    else:
        if not isinstance(raw, list) or not raw:
            raise HeldFileError(f"{path}: a schedule arm's file holds a JSON list of configs, one per stage, "
                                f"not {'an empty list' if raw == [] else 'a ' + _json_kind(raw)}")
        items = raw
    configs = []
    for n, item in enumerate(items, 1):
        try:
            configs.append(project(item, strict=True).config)
        except ConfigError as err:
            raise HeldFileError(f"{path}: " + (f"item {n}: " if kind == Held.SCHEDULE else "") + str(err)) from None
    return HeldConfigs(kind=kind, source=Path(path).name[:255], configs=tuple(configs))


def _read_bounded(path: Path) -> bytes:
    """The file's bytes, where the path resolves to a regular file of at most `MAX_HELD_BYTES` (`read_regular`:
    a directory, a device, a pipe or a link to one is refused, and never more than the bound is read)."""
    try:
        data = read_regular(path, MAX_HELD_BYTES, "a file of configs")
    except FileRefused as err:
        raise HeldFileError(str(err)) from None
    if len(data) > MAX_HELD_BYTES:
        raise HeldFileError(f"{path}: larger than {MAX_HELD_BYTES // 1024} KiB; a file of configs is far smaller")
    return data


def _json_kind(value: Any) -> str:
    return {dict: "JSON object", list: "JSON list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")


def check_held(held: HeldConfigs, config: EnvConfig, counts: tuple[int, ...] | None) -> str | None:
    """Why `held` cannot be an arm of runs that start on `config` with the agent counts `counts`
    (`RunSettings.agent_counts`; None: those of `config`), or None.

    A held config trains on the map sizes every arm trains on (a size can have no data: `data_ratio` 0), and only on
    the agent counts the runs allow, as the other engineers' proposals do."""
    counts = counts or config.agent_counts
    for n, item in enumerate(held.configs, 1):
        which = f"item {n}: " if held.kind == Held.SCHEDULE else ""
        if item.sizes != config.sizes:
            return (f"{held.source}: {which}map sizes {_listed(item.sizes)} differ from the initial config's "
                    f"({_listed(config.sizes)}); give every size (data_ratio 0 trains none of its boards)")
        if outside := sorted(set(item.agent_counts) - set(counts)):
            return (f"{held.source}: {which}agent count {outside[0]} is not one of the runs' agent counts "
                    f"({_listed(counts)}); --agent-counts sets them")
    return None


def _listed(numbers: tuple[int, ...]) -> str:
    return ", ".join(map(str, numbers))


# ---------------------------------------------------------------- the engineers


def held_needs(settings: RunSettings) -> Needs:
    return Needs(held_configs=True)


def static(evidence: Evidence, *, held: HeldConfigs | None = None, **_options: Any) -> EngineerAnswer:
    """The held config, for every stage."""
    if held is None:
        return _none_held("static")
    return answer_of(held.configs[0], evidence.current.config, f"held config from {held.source}")


def schedule(evidence: Evidence, *, held: HeldConfigs | None = None, **_options: Any) -> EngineerAnswer:
    """The schedule's item for the next stage (`evidence.round_index`, counted from 1); past the last item, the
    last item again."""
    if held is None:
        return _none_held("schedule")
    n = len(held.configs)
    k = min(evidence.round_index, n)
    said = f"schedule item {k} of {n} from {held.source}"
    if evidence.round_index > n:
        said += f" (stage {evidence.round_index}: the schedule has ended, its last item repeats)"
    return answer_of(held.configs[k - 1], evidence.current.config, said)


def _none_held(engineer: str) -> EngineerAnswer:
    return EngineerAnswer(prompt="", raw="", proposed=None, projection=None, rationale="",
                          error=f"the {engineer} engineer holds no configs: it runs as an experiment's arm "
                                f"({engineer}:FILE), whose runs store the file's configs")
