"""The `envlab` command line: build the benchmark suite, generate, score and show instances; run the loop, workers
and experiments."""

from __future__ import annotations

import argparse
import errno
import os
import select
import signal
import sys

from envsim.generator import GenerationError
from lab.cli import boards, experiments, runs, study
from lab.cli.common import Parser, UsageError
from storage.db import DatabaseDamaged, keep_private

# One module per command family: boards (the testbed's boards, no database), runs (a run, the workers, a run as a
# file, the page), experiments, and study (the screens a study is designed from); `common` holds what they share.


def arguments() -> argparse.ArgumentParser:
    p = Parser(prog="envlab", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    boards.add_commands(sub)
    runs.add_commands(sub)
    experiments.add_commands(sub)
    study.add_commands(sub)
    sub.add_parser("serve", help="start the web lab and a worker beside it (envlab serve --help for options)")
    return p


def main(argv: list[str] | None = None) -> int:
    """`envlab ARGS`: the exit status (0; 2 for bad input, a full disk, a damaged database; 130 for Ctrl+C, in one
    line: a job in hand went back to the queue, `lab.jobs.worker`, and nothing was left half-written; 141 when what
    read the output stopped, without a word)."""
    argv = sys.argv[1:] if argv is None else argv
    keep_private()  # the database, run folders and exports any command makes are this user's alone
    try:
        return _command(argv)
    except KeyboardInterrupt:
        print(f"envlab {' '.join(argv[:1])}: interrupted".replace(" :", ":"), file=sys.stderr)
        return 130
    except BrokenPipeError:
        if not _reader_gone():
            raise
        # what reads the output stopped (`envlab generate | head`): stop as a Unix tool does, with no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's last flush goes nowhere
        return 128 + signal.SIGPIPE


def _reader_gone() -> bool:
    """Whether standard output is a pipe whose reading end has closed."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (OSError, ValueError):
        return False


def _command(argv: list[str]) -> int:
    if argv[:1] == ["serve"]:
        runs.serve(argv[1:])
    try:
        args = arguments().parse_args(argv)
    except UsageError as err:
        print(err, file=sys.stderr)
        return 2
    try:
        args.fn(args)
    except (UsageError, GenerationError, DatabaseDamaged) as err:
        print(f"envlab {args.command}: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        where = f" writing {err.filename}" if err.filename else ""
        print(f"envlab {args.command}: the disk is full{where} ({err.strerror}): nothing was left half-written; "
              "free some space and run it again", file=sys.stderr)
        return 2
    return 0

