"""`rlmesh train` in a subprocess for the end-to-end tests, and the processes a run started (found by a marker in their environment)."""

import os
import queue
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil

from rl.processes.titles import role_of
from tests.support.paths import REPO, TINY

LINE_TIMEOUT_S = 600
"""How long a test waits for a line by default: a liveness guard, not a bound on the run's speed (a run's start and
steps take several times longer on two cores that another test's run shares; a hung run is stopped by the per-test
deadline, `tests/support/deadline.py`, or by this)."""


def processes_with_marker(marker: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("RLMESH_TEST_MARKER") == marker:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def still_running(processes: list[psutil.Process], timeout_s: float = 10) -> list[psutil.Process]:
    """The `processes` still running (a zombie has exited) after up to `timeout_s` of waiting for them: a process that was
    stopped or SIGKILLed a moment ago may still be exiting (freeing its memory on a busy machine)."""
    deadline = time.monotonic() + timeout_s
    while (running := [process for process in processes if _running(process)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return running


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:  # it ended between the two questions
        return False


def actor_pids(launcher_pid: int, prefix: str) -> dict[str, int]:
    """The launcher's live actor processes whose name (`rl.processes.titles`) starts with `prefix`, by name.

    Monarch starts every actor process as a direct child of the launcher, so only those count: a process an actor
    forked inherits its name, and once orphaned its parent is no longer the actor (a lookup by name and parent took
    such a child for a trainer rank). Two live children with one name fail the lookup instead of picking one."""
    found: dict[str, int] = {}
    for child in psutil.Process(launcher_pid).children():
        try:
            role = role_of(child.pid)
            alive = child.status() != psutil.STATUS_ZOMBIE
        except (psutil.Error, FileNotFoundError):
            continue
        if alive and role.startswith(prefix):
            assert role not in found, f"two live actor processes named {role}: {found[role]} and {child.pid}"
            found[role] = child.pid
    return found


def replica_pid(launch: "Launch", service: str) -> int:
    """The pid of a live replica of `service`: the actor process named `<service>/<index>#<incarnation>` (cut to 15
    bytes)."""
    replicas = actor_pids(launch.process.pid, f"{service}/")
    assert replicas, f"no live {service} replica"
    return next(iter(replicas.values()))


def trainer_pids(launch: "Launch") -> list[int]:
    """The trainer ranks' processes (named `trainer/<rank>`), in rank order."""
    ranks = actor_pids(launch.process.pid, "trainer/")
    return [ranks[role] for role in sorted(ranks, key=lambda role: int(role.removeprefix("trainer/")))]


class Launch:
    """`rlmesh train` on the tiny config in a subprocess, its output read line by line with deadlines."""

    def __init__(
        self, output_dir: Path, *overrides: str, resume: Path | None = None, env: dict[str, str] | None = None
    ):
        """A new run in `output_dir`, or (`resume`) `rlmesh train --resume RUN_DIR` with `overrides`; `env`: variables
        added to the launcher's environment (its actor processes inherit them)."""
        self.marker = uuid.uuid4().hex
        env = {**os.environ, **(env or {}), "RLMESH_TEST_MARKER": self.marker, "PYTHONUNBUFFERED": "1"}
        start = (
            ["--resume", str(resume)]
            if resume is not None
            else [
                "--config",
                str(TINY),
                "--run.output_dir",
                str(output_dir),
                "--run.steps",
                "50",
                "--wandb.enabled",
                "false",
            ]
        )
        self.process = subprocess.Popen(
            [sys.executable, "-m", "rl.commands.cli", "train", *start, *overrides],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self._queue.put(line)
        self._queue.put(None)

    def _collect(self, timeout: float, text: str | None = None) -> str:
        """Collect output lines for up to `timeout` s: "found" at the first line holding `text`, "ended" when the
        pipe closes, "timeout" otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                return "ended"
            self.lines.append(line)
            if text is not None and text in line:
                return "found"
        return "timeout"

    def wait_for_line(self, text: str, timeout: float = LINE_TIMEOUT_S) -> None:
        outcome = self._collect(timeout, text)
        if outcome == "ended":
            raise AssertionError(f"launcher ended before printing {text!r}:\n{self.output()}")
        if outcome == "timeout":
            raise AssertionError(f"no {text!r} within {timeout} s:\n{self.output()}")

    def read_until(self, text: str, timeout: float) -> bool:
        """Read output for `timeout` s at most, stopping at the first line holding `text`: whether that line came."""
        return self._collect(timeout, text) == "found"

    def wait_for_count(self, text: str, count: int, timeout: float = LINE_TIMEOUT_S) -> None:
        """Wait until `count` of the lines printed so far hold `text` (lines an earlier wait read count too)."""
        deadline = time.monotonic() + timeout
        while sum(text in line for line in self.lines) < count:
            self.wait_for_line(text, timeout=max(0.0, deadline - time.monotonic()))

    def wait_for_exit(self, timeout: float, drain_s: float = 30) -> int:
        """The launcher's exit code, and its output read until the pipe closes or `drain_s` after the exit (an actor
        process that outlives the launcher holds the pipe open: `processes_with_marker` finds it, not this)."""
        returncode = self.process.wait(timeout=timeout)
        self._collect(drain_s)
        return returncode

    @property
    def text(self) -> str:
        """Everything printed so far (Monarch may print a long teardown trace after rlmesh's last line)."""
        return "".join(self.lines)

    def output(self) -> str:
        """The last 40 lines, for an assertion's message."""
        return "".join(self.lines[-40:])

    def kill_everything(self) -> None:
        for process in [self.process, *processes_with_marker(self.marker)]:
            try:
                process.kill()
            except (ProcessLookupError, psutil.NoSuchProcess):
                pass
