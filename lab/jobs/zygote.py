"""A job's child forked from a process that has imported the training stack once (a zygote), not started cold.

A job runs in a process of its own (`lab.jobs.child`) so that a model's memory goes back whole when it ends. Started
as `python -m lab.jobs.child`, each such process first imports torch, transformers and TRL: about 10 s on a 2-core
machine, 20 s beside a busy neighbour, for every stage. A zygote is started once per worker process (per set of
the settings read at import, `import_key`); it imports those modules, then forks one child per job. The child is
as fresh for its job as a cold one: a process and a process group of its own, its output on a pipe the worker
reads, the job's environment, and its memory given back when it exits.

CPU children only: a worker that owns GPUs starts its child through `accelerate launch` (`lab.jobs.worker`), and a
zygote never initialises CUDA. `ENVLAB_ZYGOTE=0` starts every child cold.

The worker side (`spawn`) and the zygote (`python -m lab.jobs.zygote FD`) talk over a Unix socket: a request is the
child's arguments, environment and working folder, with two descriptors, the write end of its output pipe and a
socket on which the zygote says the child's pid, then how it ended (`Forked`, which the worker watches as it would
a `subprocess.Popen`). When the worker's process goes, its end of the socket closes: the zygote ends every child
it forked and exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import IO

SETTING = "ENVLAB_ZYGOTE"
# What a child's module imports before its job starts, once, in the zygote (the stage's modules pull in torch,
# transformers, TRL and datasets); not the module it runs, which runs as `__main__`.
PRELOAD = ("training.stage", "training.evaluate", "training.probe", "lab.loop", "lab.jobs.worker")
# Settings read when those modules are imported (thread pools, the model hub's, Trackio's folder, the
# interpreter's): a child whose environment differs in one of them gets a zygote of its own.
IMPORT_PREFIXES = ("OMP_", "MKL_", "OPENBLAS_", "HF_", "TRANSFORMERS_", "TRACKIO_", "TORCH", "PYTORCH_", "TOKENIZERS_",
                   "PYTHON", "LD_")
# Set by those imports themselves (torch's, to its default), read when a model is compiled, not at import: a process
# that imported them since its zygote started still forks from it.
SET_BY_IMPORTS = frozenset({"TORCHINDUCTOR_CACHE_DIR"})
MAX_REQUEST = 1 << 20


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    return (os.environ if environ is None else environ).get(SETTING, "1") != "0"


def import_key(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith(IMPORT_PREFIXES) and k not in SET_BY_IMPORTS))


class Forked:
    """A child forked by a zygote, watched as a `subprocess.Popen` is: `pid` (also its process group),
    `stdout` (its stdout and stderr, text), `poll`, `wait` and `returncode` (minus the signal that ended it)."""

    def __init__(self, pid: int, stdout: IO[str], report: socket.socket, said: bytes = b"") -> None:
        self.pid, self.stdout, self._report, self.returncode = pid, stdout, report, None
        self._said = said  # what the zygote said after the pid, if it came in the same read

    def _read(self, timeout: float | None) -> None:
        while self.returncode is None:
            if b"\n" in self._said:  # `exit CODE`
                self.returncode = int(self._said.split(b"\n", 1)[0].split()[1])
            else:
                ready, _, _ = select.select([self._report], [], [], timeout)
                if not ready:
                    return
                chunk = self._report.recv(256)
                self._said += chunk
                if chunk:
                    continue
                self.returncode = -signal.SIGKILL  # the zygote itself is gone, and its children with it
            self._report.close()

    def poll(self) -> int | None:
        self._read(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._read(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(f"job child {self.pid}", timeout)
        return self.returncode


class Zygote:
    """The worker's end of one zygote process."""

    def __init__(self, env: Mapping[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock, self.lock = ours, threading.Lock()
        self.proc = subprocess.Popen([sys.executable, "-m", "lab.jobs.zygote", str(theirs.fileno())], env=dict(env),
                                     pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, start_new_session=True)
        theirs.close()
        self.children: list[Forked] = []  # those not yet seen to end

    def alive(self) -> bool:
        return self.proc.poll() is None

    def busy(self) -> bool:
        """Whether a child it forked may still run: one whose end its watcher has not read (read here, a report
        could be taken from the thread that waits on it)."""
        self.children = [c for c in self.children if c.returncode is None]
        return bool(self.children)

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], cwd: str) -> Forked:
        """`python ARGV` (`-m MODULE ARGS`) forked, with environment `env`, in folder `cwd`."""
        out_r, out_w = os.pipe()
        report, report_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            request = json.dumps({"argv": list(argv), "env": dict(env), "cwd": cwd}).encode()
            with self.lock:
                socket.send_fds(self.sock, [request], [out_w, report_theirs.fileno()])
        except OSError:
            os.close(out_r)
            report.close()
            raise
        finally:
            os.close(out_w)
            report_theirs.close()
        said = b""
        while b"\n" not in said:
            chunk = report.recv(64)
            if not chunk:
                os.close(out_r)
                report.close()
                raise OSError("the zygote ended before it started the child")
            said += chunk
        first, rest = said.split(b"\n", 1)
        child = Forked(int(first.split()[1]), open(out_r, encoding="utf-8", errors="replace"), report, rest)  # noqa: SIM115
        self.children.append(child)
        return child

    def close(self) -> None:
        self.sock.close()  # the zygote ends its children and exits
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


_zygotes: dict[tuple[tuple[str, str], ...], Zygote] = {}  # least recently used first
_lock = threading.Lock()
# Zygotes a process keeps, the one in use among them (each holds the training stack, about 0.4 GB): a process whose
# children's import settings change (a command run for one database, then another: each has its own Trackio folder)
# would otherwise keep one per setting it ever met. The least recently used one with no child running goes first.
KEPT = 2


def spawn(argv: Sequence[str], env: Mapping[str, str]) -> Forked:
    """`python ARGV` (`-m MODULE ARGS`) with environment `env`, forked from this process's zygote for `env`'s import
    settings (started on first use, and again if it died)."""
    return _running(env).spawn(argv, env, os.getcwd())


def warm(env: Mapping[str, str]) -> None:
    """Start the zygote for `env`'s import settings now, if none runs, without waiting for its imports: a process
    about to run jobs (`envlab run`, which imports TRL itself to check a new run's settings) does its own start
    meanwhile, and its first child forks at once. A zygote that cannot start is `spawn`'s to find (cold children)."""
    _running(env)


def _running(env: Mapping[str, str]) -> Zygote:
    key = import_key(env)
    with _lock:
        zygote = _zygotes.pop(key, None)
        if zygote is None or not zygote.alive():
            zygote = Zygote(env)
        _zygotes[key] = zygote  # the most recently used, last
        idle = [k for k, z in _zygotes.items() if k != key and not z.busy()]
        for old in idle[:max(len(_zygotes) - KEPT, 0)]:
            _zygotes.pop(old).close()
    return zygote


def close_all() -> None:
    with _lock:
        for zygote in _zygotes.values():
            zygote.close()
        _zygotes.clear()


# ---------------------------------------------------------------- the zygote's side


def _child(request: dict, out_fd: int) -> None:
    """In the forked child: a process of its own for the job, then `python -m MODULE ARGS` as the request says;
    never returns."""
    code = 1
    try:
        os.setsid()
        if sys.platform.startswith("linux"):
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: ends with the zygote
        for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # Slurm's warning is the worker's to handle (lab.jobs.worker)
        signal.set_wakeup_fd(-1)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.close(out_fd)
        sys.stdout.reconfigure(write_through=True)
        sys.stderr.reconfigure(write_through=True)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        import numpy
        import torch

        numpy.random.seed()  # fresh entropy, as a cold process has (`random` reseeds itself after a fork)
        torch.seed()
        flag, module, *args = request["argv"]
        if flag != "-m":
            raise ValueError(f"a zygote runs `-m MODULE ARGS`, not {request['argv']!r}")
        sys.argv = [module, *args]
        runpy.run_module(module, run_name="__main__", alter_sys=True)  # as `python -m MODULE ARGS` runs it
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:  # noqa: BLE001 (said on the child's stderr, which the worker keeps)
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve(fd: int) -> None:
    """The zygote: import `PRELOAD`, then fork a child per request until the worker's end closes."""
    import importlib

    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker decides; a Ctrl-C reaches it, not this
    for name in PRELOAD:
        importlib.import_module(name)
    control = socket.socket(fileno=fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    reports: dict[int, socket.socket] = {}

    def reap() -> None:
        while reports:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            report = reports.pop(pid, None)
            if report is not None:
                with contextlib.suppress(OSError):
                    report.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
                report.close()

    try:
        while True:
            ready, _, _ = select.select([control, wake_r], [], [])
            if wake_r in ready:
                os.read(wake_r, 4096)
                reap()
            if control not in ready:
                continue
            try:
                message, fds, _, _ = socket.recv_fds(control, MAX_REQUEST, 2)
            except OSError:
                break
            if not message:
                break  # the worker's process is gone
            out_fd, report_fd = fds
            report = socket.socket(fileno=report_fd)
            pid = os.fork()
            if pid == 0:
                control.close()
                report.close()
                for r in reports.values():
                    r.close()
                os.close(wake_r)
                os.close(wake_w)
                _child(json.loads(message), out_fd)
            os.close(out_fd)
            reports[pid] = report
            with contextlib.suppress(OSError):
                report.sendall(f"pid {pid}\n".encode())
            reap()
    finally:
        for pid in list(reports):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


if __name__ == "__main__":
    serve(int(sys.argv[1]))
