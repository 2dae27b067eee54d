"""A cluster of namespaced hosts (testbed/hosts.py) running rlmesh: a worker on every host but the launcher's,
`rlmesh train` with `scheduler = "attach"` in the launcher's host. Shared by tests/e2e/test_multihost.py and
benchmarks/multihost_faults.py.

The workers get a login's environment (`WORKER_ENV`), not the launcher's, as when started over SSH or by a service
manager. A `Launch` reads the launcher's output as it comes, each line with its time, so a caller can act when a line
appears (a step done, the actors ready) and tell when a fault was noticed."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from rl.assets import cache_dir
from testbed import hosts as namespaced

REPO = Path(__file__).resolve().parents[1]  # the checkout the workers run

WORKER_PORT = 26600  # every host has its own ports
HOSTS = {"trainer": ["trainer0", "trainer1"], "generator": ["generator0"]}
WORKER_ENV = ("PATH", "HOME", "LANG", "RLMESH_CACHE")


class Launch:
    """A running `rlmesh train` in the launcher's host: its output lines, each with its `time.monotonic()`."""

    def __init__(self, process: subprocess.Popen):
        self.process = process
        self.started = time.monotonic()
        self.lines: list[tuple[float, str]] = []
        self._new_line = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            with self._new_line:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self._new_line.notify_all()
        with self._new_line:
            self._new_line.notify_all()

    @property
    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def line_with(self, text: str, since: float = 0.0) -> tuple[float, str] | None:
        """The first line containing `text` printed at or after `since` (monotonic), with its time."""
        return next(((at, line) for at, line in list(self.lines) if at >= since and text in line), None)

    def wait_for_line(self, text: str, timeout: float, since: float = 0.0) -> tuple[float, str] | None:
        """Wait for a line containing `text` (None when the run ends or `timeout` passes first)."""
        deadline = time.monotonic() + timeout
        with self._new_line:
            while (found := self.line_with(text, since)) is None:
                left = deadline - time.monotonic()
                if left <= 0 or (self.process.poll() is not None and not self._reader.is_alive()):
                    return None
                self._new_line.wait(min(left, 1.0))
        return found

    def wait(self, timeout: float) -> int:
        """The exit code, after killing the launcher if it runs past `timeout` seconds."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            self.lines.append((time.monotonic(), f"[multihost] launcher killed after {timeout:g} s"))
        self._reader.join(timeout=10)
        return self.process.returncode


class Cluster:
    """The hosts `launcher`, the trainer hosts and the generator host of `HOSTS`, a worker on each but the first."""

    def __init__(self, network: namespaced.Network, output_dir: Path):
        self.network = network
        self.output_dir = output_dir
        # every process, the launcher included, starts with a login's environment: not this pytest process's, which
        # carries state of the tests before it (e.g. WANDB_SERVICE, a socket in this host's /tmp, not the launcher's)
        self.worker_env = {key: os.environ[key] for key in WORKER_ENV if key in os.environ} | {"PYTHONPATH": str(REPO)}
        self.env = self.worker_env
        self.workers: dict[str, subprocess.Popen] = {}

    def start_worker(self, name: str) -> None:
        """(Re)start host `name`'s worker at its address."""
        host = self.network[name]
        log = open(self.output_dir / f"worker-{name}.log", "a")
        self.workers[name] = host.popen(
            [sys.executable, "-m", "rl.commands.cli", "worker", "--address", self.address(name)],
            cwd=REPO,
            env=self.worker_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

    def address(self, name: str) -> str:
        return f"tcp://{self.network[name].ip}:{WORKER_PORT}"

    def workers_table(self) -> str:
        """`cluster.workers` as a TOML inline table: each role's hosts' worker addresses."""
        roles = {role: [self.address(name) for name in names] for role, names in HOSTS.items()}
        return "{ " + ", ".join(f"{role} = {json.dumps(addresses)}" for role, addresses in roles.items()) + " }"

    def launch(self, *args: str) -> Launch:
        """Start `rlmesh train ARGS --cluster.workers ...` in the launcher's host."""
        process = self.network["launcher"].popen(
            [sys.executable, "-m", "rl.commands.cli", "train", *args, "--cluster.workers", self.workers_table()],
            cwd=REPO,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        return Launch(process)


@contextlib.contextmanager
def cluster(output_dir: Path) -> Iterator[Cluster]:
    """The namespaced hosts with their workers running; everything in them is killed on exit."""
    keep = [REPO, Path(sys.prefix), cache_dir(), output_dir]
    names = ["launcher", *(name for names in HOSTS.values() for name in names)]
    with namespaced.hosts(names, keep=keep) as network:
        made = Cluster(network, output_dir)
        for name in names[1:]:
            made.start_worker(name)
        yield made


def metrics(run_dir: Path) -> list[dict]:
    """The run's per-step records (`metrics.jsonl`)."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
