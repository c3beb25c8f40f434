"""Job handlers that the worker's child processes import in tests (`lab.jobs.worker.InChild("tests.child_jobs:...")`):
jobs that misbehave as real ones can (ignore Cancel, leave a process behind, die without a word)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def stubborn(engine, job, progress):
    """Starts a grandchild (`sleep`), writes both pids to the payload's file, then never checks for Cancel."""
    sleeper = subprocess.Popen(["sleep", "300"])
    Path(job.payload["pids"]).write_text(f"{os.getpid()} {sleeper.pid}")
    while True:
        time.sleep(0.1)


def patient(engine, job, progress):
    """Reports a step every 0.1 s until asked to stop, then writes "saved at step N" to the payload's file (as a
    stage saves its checkpoint) and raises Cancelled. Writes its pid to the payload's `pid` file, where given."""
    from training.progress import Cancelled

    if "pid" in job.payload:
        Path(job.payload["pid"]).write_text(str(os.getpid()))
    step = 0
    while not progress(step, 1000, f"step {step}" if step % 10 == 0 else None):
        step += 1
        time.sleep(0.1)
    Path(job.payload["saved"]).write_text(f"saved at step {step}")
    raise Cancelled(f"stopped at step {step}")


def killed(engine, job, progress):
    """Reports once, says something on stderr, then is killed with SIGKILL (as the kernel's OOM killer does)."""
    progress(1, 2, "halfway")
    print("loading 9 GB of weights into 8 GB of memory", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def answer(engine, job, progress):
    """Ends done with what it was given, from its own process."""
    progress(1, 1, f"pid {os.getpid()}")
    return {"pid": os.getpid(), "echo": job.payload.get("echo")}


def where(engine, job, progress):
    """Says what its process had imported when the job started, its parent, and the setting it was given."""
    return {"pid": os.getpid(), "parent": os.getppid(), "trl": "trl" in sys.modules,
            "given": os.environ.get("ENVLAB_TEST_GIVEN"), "cwd": os.getcwd()}


def says(engine, job, progress):
    """Says on stderr what it does, then ends done."""
    print("loading the model", file=sys.stderr, flush=True)
    progress(1, 1, "loaded")
    return {"pid": os.getpid()}


def meets(engine, job, progress):
    """Writes its launch's rendezvous port (`MASTER_PORT`, which torchrun's agent listens on) to the payload's `port`
    file, then waits, up to 120 s, until every file the payload's `ports` names is there: jobs launched together, each
    alive (its port held) while the others start. Returns its port."""
    port = os.environ["MASTER_PORT"]
    Path(job.payload["port"]).write_text(port)
    deadline = time.monotonic() + 120
    while not all(Path(other).exists() for other in job.payload["ports"]):
        if time.monotonic() > deadline:
            raise TimeoutError("the other launches never started")
        time.sleep(0.1)
    return {"port": int(port)}
