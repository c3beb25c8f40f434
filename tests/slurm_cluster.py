"""A one-node Slurm cluster on this machine, from Debian's packages (`slurmctld`, `slurmd`, `slurm-client`,
`munge`), for the tests of the lab's Slurm path (tests/conftest.py) and its benchmark (benchmarks/bench_slurm.py).

It needs root: `munged` runs as the `munge` user, `slurmctld` and `slurmd` as root (`SlurmUser=root`). Every file
it writes lives in one temporary folder (configuration, state, spool, logs, pid files, the munge socket and a key
of its own), so it touches nothing of the machine's own Slurm or munge set-up and any number of sessions of it
can live side by side (free ports). Process tracking by /proc (`proctrack/linuxproc`) and no task plugin: no
cgroups to set up, so the cluster is up in seconds. No accounting daemon: job states come from `scontrol`.
`stop()` ends the daemons by the PIDs they wrote, nothing else.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.processes import alive
from tests.servers import free_port

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel")
START_TIMEOUT_S = 60


class ClusterUnavailable(RuntimeError):
    """This machine cannot start the one-node cluster; the message says what is missing."""


def missing() -> str | None:
    """Why no cluster can start here (a missing binary, not root), or None."""
    absent = [name for name in DAEMONS if shutil.which(name) is None and not Path("/usr/sbin", name).exists()]
    if absent:
        return f"Slurm is not installed (no {', '.join(absent)}; apt-get install slurmctld slurmd slurm-client munge)"
    if os.geteuid() != 0:
        return "a one-node Slurm cluster needs root (slurmd runs jobs as their user)"
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "there is no 'munge' user to run munged"
    return None


def _binary(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


@dataclass
class Cluster:
    """A running one-node cluster: `env` points Slurm's commands at it (`SLURM_CONF`)."""

    base: Path
    node: str
    cpus: int
    pids: dict[str, int] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.base / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *command: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(command, env={**os.environ, **self.env}, capture_output=True, text=True, check=check,
                              timeout=30)

    def log(self, name: str) -> str:
        path = self.base / "log" / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def stop(self) -> None:
        """Cancel this cluster's jobs (a job left running would outlive its daemons), then SIGTERM to each daemon
        this cluster started (by the PID it wrote), SIGKILL after a grace period; then the folder is removed."""
        if "slurmctld" in self.pids:
            jobs = self.run("squeue", "-h", "-o", "%i", check=False).stdout.split()
            if jobs:
                self.run("scancel", *jobs, check=False)
            deadline = time.monotonic() + 20
            while jobs and time.monotonic() < deadline:
                time.sleep(0.3)
                jobs = self.run("squeue", "-h", "-t", "PENDING,RUNNING,COMPLETING,SUSPENDED,CONFIGURING", "-o", "%i",
                                check=False).stdout.split()
        for name in ("slurmd", "slurmctld", "munged"):
            pid = self.pids.get(name)
            if pid is None:
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and alive(pid):
                time.sleep(0.1)
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.base, ignore_errors=True)


def _pid(path: Path, what: str, cluster: Cluster) -> int:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            text = path.read_text().strip()
            if text:
                return int(text)
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    raise ClusterUnavailable(f"{what} wrote no pid file in {START_TIMEOUT_S} s:\n{cluster.log(what)}")


def start(cpus: int | None = None, *, min_job_age_s: int = 600, kill_wait_s: int = 5) -> Cluster:
    """Start munged, slurmctld and slurmd with a configuration of their own, and wait until the node is idle.

    `cpus`: the node's CPUs (default: this machine's). `kill_wait_s`: seconds between a cancelled job's SIGTERM
    and its SIGKILL. `min_job_age_s`: how long `scontrol` still shows an ended job (the tests read its state).
    """
    if (why := missing()) is not None:
        raise ClusterUnavailable(why)
    base = Path(tempfile.mkdtemp(prefix="envlab-slurm-"))
    base.chmod(0o755)
    node = socket.gethostname().split(".")[0]
    cpus = cpus or os.cpu_count() or 1
    cluster = Cluster(base, node, cpus)
    try:
        _start(cluster, min_job_age_s, kill_wait_s)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _start(cluster: Cluster, min_job_age_s: int, kill_wait_s: int) -> None:
    base = cluster.base
    munge = pwd.getpwnam("munge")
    mdir = base / "munge"
    mdir.mkdir(mode=0o755)
    key = mdir / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    for path in (mdir, key):
        os.chown(path, munge.pw_uid, munge.pw_gid)
    for sub in ("state", "spool", "log", "run"):
        (base / sub).mkdir(mode=0o755)
    socket_path = mdir / "munge.socket"
    subprocess.run(["runuser", "-u", "munge", "--", _binary("munged"), f"--socket={socket_path}",
                    f"--key-file={key}", f"--pid-file={mdir / 'munged.pid'}", f"--log-file={mdir / 'munged.log'}",
                    f"--seed-file={mdir / 'munged.seed'}", "--force"], check=True, capture_output=True, timeout=30)
    cluster.pids["munged"] = _pid(mdir / "munged.pid", "munged", cluster)
    ctld_port, d_port = free_port(), free_port()
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    cluster.conf.write_text("\n".join([
        "ClusterName=envlab",
        f"SlurmctldHost={cluster.node}(127.0.0.1)",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={d_port}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={socket_path}",
        f"StateSaveLocation={base / 'state'}",
        f"SlurmdSpoolDir={base / 'spool'}",
        f"SlurmctldPidFile={base / 'run' / 'slurmctld.pid'}",
        f"SlurmdPidFile={base / 'run' / 'slurmd.pid'}",
        f"SlurmctldLogFile={base / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={base / 'log' / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "ReturnToService=2",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=sched_interval=2",
        f"MinJobAge={min_job_age_s}",
        f"KillWait={kill_wait_s}",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=30",
        "InactiveLimit=0",
        f"NodeName={cluster.node} NodeAddr=127.0.0.1 CPUs={cluster.cpus} RealMemory={memory} State=UNKNOWN",
        f"PartitionName=debug Nodes={cluster.node} Default=YES MaxTime=INFINITE State=UP",
        "",
    ]))
    env = {**os.environ, **cluster.env}
    subprocess.run([_binary("slurmctld"), "-c", "-i"], env=env, check=True, capture_output=True, timeout=30)
    cluster.pids["slurmctld"] = _pid(base / "run" / "slurmctld.pid", "slurmctld", cluster)
    subprocess.run([_binary("slurmd"), "-c"], env=env, check=True, capture_output=True, timeout=30)
    cluster.pids["slurmd"] = _pid(base / "run" / "slurmd.pid", "slurmd", cluster)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        state = cluster.run("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.strip()
        if state in ("idle", "mixed", "allocated"):
            return
        time.sleep(0.3)
    raise ClusterUnavailable(f"the node is not idle after {START_TIMEOUT_S} s (sinfo: {state!r}):\n"
                             f"{cluster.log('slurmctld')}\n{cluster.log('slurmd')}")
