"""A real Slurm on this machine: Debian's munge, slurmctld and slurmd, each node a namespaced host of its own.

`slurm_cluster(network, controller, nodes, state_dir)` (a context manager) runs, on the hosts of a
`testbed/hosts.py` network:

- **munged** on the controller's host with a key generated for this cluster, its socket in the sockets' folder (a
  Unix socket is reached through the filesystem, so every host's Slurm talks to it; `AuthInfo=socket=` points Slurm
  there);
- **slurmctld** on the controller's host (`SlurmctldHost=<controller>(<its address>)`);
- one **slurmd** per node host, `NodeName` = the host's name (its hostname), `NodeAddr` = its address, so the jobs'
  processes run in that host's network, hostname, /tmp and /dev/shm, and Slurm hands out the hosts' names.

The configuration is minimal: no accounting database (`accounting_storage/none`), `select/cons_tres` with cores and
memory as consumable resources, `proctrack/linuxproc` and `task/none` (no cgroup enforcement: this container mounts
cgroup v1 without Slurm's hierarchy; slurmd still needs /sys/fs/cgroup to start, which the hosts keep), and every file
(configuration, key, state, pid files, logs) under `state_dir`, except the sockets: munge's and the slurmd spools
(where slurmstepd makes its sockets) live in a short folder under /var/tmp, since a Unix socket's path may not exceed
108 bytes and pytest's temporary paths (longer under xdist) leave too little. Clients find it through `SLURM_CONF`
(`SlurmCluster.env`). Each daemon runs in the foreground as a child of this process; on exit the jobs are cancelled,
the daemons stopped (SIGTERM, then SIGKILL after a few seconds) and the key removed; the logs stay in `state_dir`.
Bring-up is bounded (`START_TIMEOUT_S`). Needs root and Debian's `slurmctld`, `slurmd`, `slurm-client` and `munge`
(scripts/setup_env.sh installs them where it can): `unavailable()` says why not, for a skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from testbed import hosts as namespaced

TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "sinfo", "scontrol", "scancel")
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 10


def tool(name: str) -> str | None:
    """The path of Slurm's or munge's command `name` (the daemons live in /usr/sbin, which a PATH may leave out)."""
    return shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")


def unavailable() -> str | None:
    """Why a Slurm cluster cannot be made here (None: it can)."""
    missing = [name for name in TOOLS if tool(name) is None]
    if missing:
        return f"a real Slurm needs {', '.join(missing)} (Debian: apt-get install slurmctld slurmd slurm-client munge)"
    return namespaced.unavailable()


def slurm_conf(
    state_dir: Path, sockets: Path, controller: namespaced.Host, nodes: Sequence[namespaced.Host], memory_mb: int
) -> str:
    """The cluster's slurm.conf: every node `CPUs` = this machine's cores and `memory_mb` of RealMemory; munge's socket
    and the spools in `sockets`."""
    cpus = os.cpu_count() or 1
    lines = [
        "ClusterName=rlmesh-test",
        f"SlurmctldHost={controller.name}({controller.ip})",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={sockets / 'munge.socket'}",
        f"StateSaveLocation={state_dir / 'ctld'}",
        f"SlurmdSpoolDir={sockets / 'spool'}/%n",
        f"SlurmctldPidFile={state_dir / 'slurmctld.pid'}",
        f"SlurmdPidFile={state_dir / 'slurmd'}-%n.pid",
        f"SlurmctldLogFile={state_dir / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={state_dir / 'log'}/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "SchedulerType=sched/builtin",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "ReturnToService=2",
        "KillWait=5",  # SIGTERM to SIGKILL when a job is cancelled (default 30 s)
        "MailProg=/bin/true",
        *(
            f"NodeName={node.name} NodeAddr={node.ip} CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN"
            for node in nodes
        ),
        "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


@dataclass
class SlurmCluster:
    """A running cluster: `env` lets Slurm's commands find it; `run` runs one on a host of the network."""

    network: namespaced.Network
    controller: str
    nodes: list[str]
    state_dir: Path
    daemons: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.state_dir / "slurm.conf")}

    def run(self, *args: str, host: str | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
        """Run Slurm command `args` on `host` (the controller's by default), its output as text; raise if it fails."""
        done = self._run(host or self.controller, args, timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}\n{self.logs()}")
        return done

    def node_states(self) -> dict[str, str]:
        lines = self.run("sinfo", "--noheader", "--Node", "--format=%N %T").stdout.split()
        return dict(zip(lines[::2], lines[1::2], strict=True))

    def logs(self, lines: int = 20) -> str:
        """The last `lines` of every daemon's log, to explain a failure."""
        parts = []
        for path in sorted((self.state_dir / "log").glob("*.log")):
            parts.append(f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(parts)

    def _start(self, name: str, host: str, args: Sequence[str]) -> None:
        with open(self.state_dir / "log" / f"{name}.out", "w") as log:  # the daemon keeps its own descriptor
            self.daemons[name] = self.network[host].popen(args, env=self.env, stdout=log, stderr=subprocess.STDOUT)

    def _wait(self, what: str, ready) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            for name, daemon in self.daemons.items():
                if daemon.poll() is not None:
                    out = (self.state_dir / "log" / f"{name}.out").read_text(errors="replace")
                    raise RuntimeError(f"{name} exited ({daemon.returncode}) before {what}:\n{out}\n{self.logs()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"Slurm: {what} not within {START_TIMEOUT_S} s\n{self.logs()}")
            time.sleep(0.5)

    def _answers(self, *args: str) -> bool:
        return self._run(self.controller, args, 15).returncode == 0

    def _run(self, host: str, args: Sequence[str], timeout: float) -> subprocess.CompletedProcess:
        process = self.network[host].popen(
            args, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)

    def stop(self) -> None:
        """Cancel every job, stop the daemons (nodes first), remove the key."""
        if "slurmctld" in self.daemons and self.daemons["slurmctld"].poll() is None:
            self._run(self.controller, ["scancel", "--full", "--user=root"], STOP_TIMEOUT_S)
        for daemon in reversed(list(self.daemons.values())):
            if daemon.poll() is None:
                daemon.terminate()
                try:
                    daemon.wait(timeout=STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                    daemon.wait(timeout=STOP_TIMEOUT_S)
        (self.state_dir / "munge.key").unlink(missing_ok=True)


@contextlib.contextmanager
def slurm_cluster(
    network: namespaced.Network, controller: str, nodes: Sequence[str], state_dir: Path, memory_mb: int = 8000
) -> Iterator[SlurmCluster]:
    """munged and slurmctld on host `controller`, a slurmd on each of `nodes`, all idle when this yields; stopped on
    exit. `state_dir` must be visible on every host (under /tmp: in the network's `keep`)."""
    reason = unavailable()
    if reason:
        raise RuntimeError(reason)
    state_dir = Path(state_dir).resolve()
    for directory in ("ctld", "log"):
        (state_dir / directory).mkdir(parents=True, exist_ok=True)
    sockets = Path(tempfile.mkdtemp(prefix="slurm-", dir="/var/tmp"))  # visible on every host: only /tmp is private
    for node in nodes:
        (sockets / "spool" / node).mkdir(parents=True)
    key = state_dir / "munge.key"
    key.touch(mode=0o600)
    key.write_bytes(os.urandom(128))
    (state_dir / "slurm.conf").write_text(
        slurm_conf(state_dir, sockets, network[controller], [network[n] for n in nodes], memory_mb)
    )
    cluster = SlurmCluster(network, controller, list(nodes), state_dir)
    try:
        munge = [
            f"--socket={sockets / 'munge.socket'}",
            f"--key-file={key}",
            f"--pid-file={state_dir / 'munged.pid'}",
        ]
        munge += [f"--log-file={state_dir / 'log' / 'munged.log'}", f"--seed-file={state_dir / 'munged.seed'}"]
        cluster._start("munged", controller, [tool("munged"), "--foreground", "--force", *munge])
        cluster._wait("munged listens", lambda: (sockets / "munge.socket").exists())
        conf = str(state_dir / "slurm.conf")
        cluster._start("slurmctld", controller, [tool("slurmctld"), "-D", "-f", conf])
        cluster._wait("slurmctld answers", lambda: cluster._answers("scontrol", "ping"))
        for node in nodes:
            cluster._start(f"slurmd-{node}", node, [tool("slurmd"), "-D", "-f", conf, "-N", node])
        cluster._wait("every node is idle", lambda: set(cluster.node_states().values()) == {"idle"})
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(sockets, ignore_errors=True)
