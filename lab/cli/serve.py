"""`envlab serve`'s options and where it serves, read without Gradio: the command checks its port and answers
`--help` before it imports the page (seconds on a loaded machine), and `lab.pages.web` reads the same."""

from __future__ import annotations

import argparse
import errno
import os
import socket
import stat
import sys
from collections.abc import Mapping
from pathlib import Path

AUTH_SETTING = "ENVLAB_AUTH"
EXAMPLE_PID = "ENVLAB_EXAMPLE_PID"  # the process bringing a new lab's example run in beside the page's imports
AUTH_FILE_LIMIT = 64 * 1024  # bytes of a logins file read at most: a few hundred users


def arguments() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="envlab serve", description="The envlab web lab.")
    p.add_argument("--host", help="address to bind (0.0.0.0 to expose the lab; use --auth-file); "
                                   "default: $GRADIO_SERVER_NAME, else 127.0.0.1")
    p.add_argument("--port", type=int, help="default: $GRADIO_SERVER_PORT, else 7860")
    p.add_argument("--auth-file", metavar="FILE",
                   help="a file with one user:password per line, readable by you only (chmod 600): the page asks for "
                        f"a login; ${AUTH_SETTING} (user:password lines) does the same")
    p.add_argument("--auth", help=argparse.SUPPRESS)  # refused: a password on the command line is seen in `ps`
    p.add_argument("--allowed-hosts", default="", metavar="NAMES",
                   help="more host names the page answers to, comma-separated (e.g. lab.example.org behind a proxy; "
                        "'*' for any); localhost's and --host's always")
    p.add_argument("--forwarded-allow-ips", default="", metavar="IPS",
                   help="proxies whose X-Forwarded-For names the client (comma-separated addresses or networks); "
                        "none by default: the client is the TCP peer")
    p.add_argument("--db", help="database path or URL (default: $ENVLAB_DB, else runs/envlab.db)")
    p.add_argument("--no-worker", action="store_true", help="do not start a worker beside the page")
    p.add_argument("--no-example", action="store_true",
                   help="leave a new, empty database empty for good (by default its first start imports the shipped "
                        "example run and studies, and a later start finishes an import that was stopped)")
    return p


def address(host: str | None, port: int | None) -> tuple[str, int]:
    """Where to serve: the flags, else Gradio's own GRADIO_SERVER_NAME and GRADIO_SERVER_PORT, else
    127.0.0.1:7860."""
    host = host or os.environ.get("GRADIO_SERVER_NAME") or "127.0.0.1"
    if port is None:
        raw = os.environ.get("GRADIO_SERVER_PORT") or "7860"
        if not raw.isdigit():
            raise SystemExit(f"envlab serve: GRADIO_SERVER_PORT={raw!r} is not a port number")
        port = int(raw)
    return host, port


def port_free(host: str, port: int) -> bool:
    """Whether the page can listen on `(host, port)`; any reason but a taken port ends the command."""
    try:
        socket.create_server((host, port)).close()
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            return False
        raise SystemExit(f"envlab serve: cannot serve on {host}:{port}: {err.strerror or err}") from None
    return True


def taken_message(port: int) -> str:
    return f"envlab serve: port {port} is taken; choose another with --port N or GRADIO_SERVER_PORT"


def logins(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> list[tuple[str, str]] | None:
    """The page's (user, password) pairs: `--auth-file`'s lines, else `$ENVLAB_AUTH`'s, else None (no login).

    Never from the command line, where every local user reads it (`ps`): `--auth` is refused, saying where a
    password goes. A logins file must be a regular file that no one else may read or write (mode 600 or 400), at
    most `AUTH_FILE_LIMIT` bytes. Blank lines and `#` comments are skipped. Ends the command (`SystemExit`, one line)
    when any of this fails."""
    if args.auth is not None:
        raise SystemExit("envlab serve: --auth would put the password on the command line, where every user of this "
                         "machine can read it (ps): put user:password lines in a file only you can read (chmod 600) "
                         f"and give --auth-file FILE, or set ${AUTH_SETTING}=user:password")
    if args.auth_file is not None:
        return _pairs(_read_logins(Path(args.auth_file)), f"--auth-file {args.auth_file}")
    if environ.get(AUTH_SETTING):
        return _pairs(environ[AUTH_SETTING], f"${AUTH_SETTING}")
    return None


def _read_logins(path: Path) -> str:
    try:  # opened without waiting (a FIFO would wait for a writer), then checked to be a plain file
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            if not stat.S_ISREG(mode):
                raise SystemExit(f"envlab serve: --auth-file {path} is not a regular file")
            if mode & 0o077:
                raise SystemExit(f"envlab serve: --auth-file {path} is open to others (mode "
                                 f"{stat.S_IMODE(mode):04o}): make it yours only with chmod 600 {path}")
            data = f.read(AUTH_FILE_LIMIT + 1)
    except OSError as err:
        raise SystemExit(f"envlab serve: cannot read --auth-file {path}: {err.strerror or err}") from None
    if len(data) > AUTH_FILE_LIMIT:
        raise SystemExit(f"envlab serve: --auth-file {path} is longer than {AUTH_FILE_LIMIT:,} bytes")
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise SystemExit(f"envlab serve: --auth-file {path} is not UTF-8 text") from None


def _pairs(text: str, where: str) -> list[tuple[str, str]]:
    pairs = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, password = line.partition(":")
        if not sep or not user or not password:
            raise SystemExit(f"envlab serve: {where}, line {n}: expected user:password")
        pairs.append((user, password))
    if not pairs:
        raise SystemExit(f"envlab serve: {where} names no user:password")
    return pairs


def example_beside(db: str | None) -> int:
    """Fork a process that brings the example run into the lab at `db` where the lab takes it
    (`lab.study.example.ensure_example`: a new lab does), says so in one line and exits 0; returns its id. The page's
    imports take one core for seconds and leave another idle: a new lab's example, imported there meanwhile, costs
    its first start nothing. The page waits for it (`lab.pages.web.example_apart`, told its id in `EXAMPLE_PID`)
    before it reads the database, and does the work itself where it exited otherwise: a refusal is said once, there.
    """
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:  # the child's own imports: the page's process imports them again, after the exec
        from lab.study.example import ensure_example, said_in
        from storage.db import keep_private, open_database

        keep_private()
        if (run_id := ensure_example(open_database(db))) is not None:
            print(said_in(run_id), file=sys.stderr, flush=True)
        code = 0
    except BaseException:  # noqa: BLE001 - said by the page, which tries again (a Ctrl+C reaches it too)
        pass
    finally:
        os._exit(code)
