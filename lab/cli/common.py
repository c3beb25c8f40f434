"""What the command families share: one-line usage errors, the database of `--db`, an EnvConfig file, `--grpo`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import NoReturn

from envsim.config import ConfigError, EnvConfig, project
from lab.settings import Count


class UsageError(Exception):
    """Bad input on the command line or in a file; printed as one clear line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """argparse, with a bad option said in one line (`envlab run: argument --stages: ...`), exit status 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


# The bounds of the counts the command line takes beside a run's settings (lab.settings has those), each
# with why it is where it is. Each family keeps its own; this one is bench-suite's and experiment run's.
WORKERS = Count(1, 64, "each worker is a process that loads its own policy", "at least 1 worker")


def config_file(path: Path | None) -> EnvConfig:
    """The EnvConfig in a JSON file, checked strictly (the round-0 default without a file)."""
    if path is None:
        return EnvConfig.default()
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError as err:
        raise UsageError(f"{path}: no such file") from err
    except json.JSONDecodeError as err:
        raise UsageError(f"{path}: not JSON ({err})") from err
    try:
        return project(raw, strict=True).config
    except ConfigError as err:
        raise UsageError(f"{path}: {err}") from err


def engine_of(db: str | None):
    """The migrated database of `--db`; a location that cannot be used is one line (exit 2), not a traceback."""
    from storage.db import DatabaseUnusable, open_database

    try:
        return open_database(db)
    except DatabaseUnusable as err:
        raise UsageError(str(err)) from None


def grpo_overrides(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise UsageError(f"--grpo {pair!r}: give KEY=VALUE, e.g. --grpo max_steps=20")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out



def start_bar_at(bar, done: int) -> None:
    """Start a tqdm `bar` at `done`: what was done before this command is the bar's starting point, not progress it
    made at once (which would make its rate millions a second and its time left zero)."""
    bar.initial = bar.n = bar.last_print_n = done
    bar.refresh()
