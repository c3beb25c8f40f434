"""The command line of a benchmark whose settings are a dataclass of defaults: one flag a field (`--a-b` for the
field `a_b`), a switch for a boolean. Imported where the benchmark runs as a script (its folder is on the path)."""

from __future__ import annotations

import argparse
from typing import TypeVar

T = TypeVar("T")


def parse(settings: type[T], doc: str | None) -> T:
    """`settings` as the command line sets it; the help's first line is `doc`'s."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0] if doc else None)
    for name, default in vars(settings()).items():
        flag = f"--{name.replace('_', '-')}"
        if isinstance(default, bool):
            parser.add_argument(flag, action="store_true")
        else:
            parser.add_argument(flag, type=type(default), default=default)
    return settings(**vars(parser.parse_args()))
