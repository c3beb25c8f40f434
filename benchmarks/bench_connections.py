"""What connections without a login cost the page under a login: its memory and open files before, while and after
a client opens `--attempts` heartbeat connections (Gradio's `GET /gradio_api/heartbeat/<id>`, which holds its
connection open) and keeps every socket open until the end (as many as its own open-file limit lets it).

Run: `python benchmarks/bench_connections.py [--attempts 20000]`.

The page runs as `envlab serve` with a login (`ENVLAB_AUTH`) in a process of its own on 127.0.0.1 (a temporary
SQLite database, no worker, no example); the figures are read from /proc. The ratio of the page's memory after the
attempts to its memory before is the figure (target: at most `MEMORY_RATIO`), with the most files it held open
(target: at most `FILES_ABOVE_START` above its start). Exits 1 when a target is missed.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # runs from a checkout without an install
sys.path.insert(0, str(ROOT / "benchmarks"))

import os  # noqa: E402
import resource  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402
from dataclasses import dataclass  # noqa: E402

from flags import parse  # noqa: E402
from tqdm import tqdm  # noqa: E402

from tests.servers import free_port  # noqa: E402

MEMORY_RATIO = 1.25
FILES_ABOVE_START = 200


@dataclass
class Settings:
    attempts: int = 20000


def usage(pid: int) -> tuple[int, int]:
    """The process's resident memory (KiB) and open files."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def serve(folder: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    page = subprocess.Popen([sys.executable, "-m", "lab.cli", "serve", "--no-worker", "--no-example", "--port",
                             str(port), "--db", str(folder / "lab.db")], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "ENVLAB_AUTH": "alice:secret"})
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            urllib.request.urlopen(f"{base}/", timeout=2)
            return page, base
        except OSError:
            time.sleep(0.5)
    page.kill()
    raise SystemExit("the page did not answer in 5 minutes")


def attempt(port: int, index: int) -> tuple[socket.socket, bytes]:
    """One heartbeat request without a login, its socket left open; the first line of the answer."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(f"GET /gradio_api/heartbeat/s{index} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    return sock, sock.recv(64).split(b"\r\n")[0]


def main(settings: Settings) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    keep = hard - 128  # sockets this client can hold; past it the oldest is closed (the page's side is measured)
    with tempfile.TemporaryDirectory() as tmp:
        page, base = serve(Path(tmp))
        port = int(base.rsplit(":", 1)[1])
        try:
            time.sleep(1)
            start = usage(page.pid)
            held, answers, most_files = [], {}, start[1]
            for i in tqdm(range(settings.attempts), desc="attempts", mininterval=5, disable=None):
                try:
                    sock, line = attempt(port, i)
                except OSError as err:
                    line = f"refused: {err.strerror or err}".encode()
                else:
                    held.append(sock)
                    if len(held) > keep:
                        held.pop(0).close()
                answers[line] = answers.get(line, 0) + 1
                if i % 500 == 0:
                    most_files = max(most_files, usage(page.pid)[1])
            during = usage(page.pid)
            most_files = max(most_files, during[1])
            for sock in held:
                sock.close()
            time.sleep(2)
            after = usage(page.pid)
        finally:
            page.terminate()
            page.wait(30)
    ratio = after[0] / start[0]
    print(f"{settings.attempts} heartbeat connections without a login, each socket kept open by the client:")
    for line, count in sorted(answers.items(), key=lambda kv: -kv[1]):
        print(f"  {count:6d} answered {line.decode(errors='replace')}")
    print(f"page memory: {start[0] / 1024:.0f} MiB before, {during[0] / 1024:.0f} MiB with them open, "
          f"{after[0] / 1024:.0f} MiB after (ratio after/before {ratio:.2f}, target <= {MEMORY_RATIO})")
    print(f"page open files: {start[1]} before, at most {most_files} meanwhile, {after[1]} after "
          f"(target <= {start[1] + FILES_ABOVE_START})")
    return 0 if ratio <= MEMORY_RATIO and most_files <= start[1] + FILES_ABOVE_START else 1


if __name__ == "__main__":
    raise SystemExit(main(parse(Settings, __doc__)))
