"""`envlab serve`'s options and where it serves, read without Gradio: the command checks its port and answers
`--help` before it imports the page (seconds on a loaded machine), and `lab.pages.web` reads the same."""

from __future__ import annotations

import argparse
import errno
import os
import socket


def arguments() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="envlab serve", description="The envlab web lab.")
    p.add_argument("--host", help="address to bind (0.0.0.0 to expose the lab; use --auth); "
                                   "default: $GRADIO_SERVER_NAME, else 127.0.0.1")
    p.add_argument("--port", type=int, help="default: $GRADIO_SERVER_PORT, else 7860")
    p.add_argument("--auth", help="user:password, or a file with one user:password per line")
    p.add_argument("--allowed-hosts", default="", metavar="NAMES",
                   help="more host names the page answers to, comma-separated (e.g. lab.example.org behind a proxy; "
                        "'*' for any); localhost's and --host's always")
    p.add_argument("--forwarded-allow-ips", default="", metavar="IPS",
                   help="proxies whose X-Forwarded-For names the client (comma-separated addresses or networks); "
                        "none by default: the client is the TCP peer")
    p.add_argument("--db", help="database path or URL (default: $ENVLAB_DB, else runs/envlab.db)")
    p.add_argument("--no-worker", action="store_true", help="do not start a worker beside the page")
    p.add_argument("--no-example", action="store_true",
                   help="leave a new, empty database empty (by default the shipped example run is imported into it)")
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
