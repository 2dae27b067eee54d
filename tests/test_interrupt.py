"""Ctrl-C on a real run, in several phases, stops every actor process and exits with 130.

SIGINT is sent to the launcher's pid (process-directed, as a terminal or `kill` sends it): that is
the signal the kernel may hand to any of the launcher's threads, the cause of the once-lost Ctrl-C.
"""

import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent
STOP_DEADLINE_S = 30


def processes_with_marker(marker: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("RLMESH_TEST_MARKER") == marker:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


class Launch:
    """`rlmesh train` on the tiny config in a subprocess, its output read line by line with deadlines."""

    def __init__(self, output_dir: Path, *overrides: str, resume: Path | None = None):
        """A new run in `output_dir`, or (`resume`) `rlmesh train --resume RUN_DIR` with `overrides`."""
        self.marker = uuid.uuid4().hex
        env = {**os.environ, "RLMESH_TEST_MARKER": self.marker, "PYTHONUNBUFFERED": "1"}
        start = ["--resume", str(resume)] if resume is not None else [
            "--config", str(REPO / "configs" / "tiny_qwen3_e2e.toml"), "--run.output_dir", str(output_dir), "--run.steps", "50",
            "--wandb.enabled", "false"]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "rl.cli", "train", *start, *overrides],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self._queue.put(line)
        self._queue.put(None)

    def wait_for_line(self, text: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                raise AssertionError(f"launcher ended before printing {text!r}:\n{self.output()}")
            self.lines.append(line)
            if text in line:
                return
        raise AssertionError(f"no {text!r} within {timeout} s:\n{self.output()}")

    def wait_for_exit(self, timeout: float) -> int:
        returncode = self.process.wait(timeout=timeout)
        while (line := self._queue.get(timeout=10)) is not None:
            self.lines.append(line)
        return returncode

    def output(self) -> str:
        return "".join(self.lines[-40:])

    def kill_everything(self) -> None:
        for process in [self.process, *processes_with_marker(self.marker)]:
            try:
                process.kill()
            except (ProcessLookupError, psutil.NoSuchProcess):
                pass


def assert_stops_cleanly(launch: Launch) -> None:
    sent = time.monotonic()
    returncode = launch.wait_for_exit(timeout=STOP_DEADLINE_S)
    assert returncode == 130, launch.output()
    assert time.monotonic() - sent < STOP_DEADLINE_S
    assert "rlmesh: interrupted" in "".join(launch.lines), launch.output()  # Monarch may print a teardown trace after it
    deadline = time.monotonic() + 10
    while processes_with_marker(launch.marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_with_marker(launch.marker) == []


@pytest.mark.parametrize(
    "phase_line",
    [
        "Monarch internal logs",  # actor start-up: the store is up, processes are spawning
        "step    0 v0",  # the first batch is being generated and scored
        "step    1 v1",  # training, weight sync, generation of the next batch
    ],
    ids=["startup", "first-generation", "training"],
)
def test_ctrl_c_in_any_phase_stops_all_actor_processes(tmp_path, phase_line):
    launch = Launch(tmp_path)
    try:
        launch.wait_for_line(phase_line)
        assert launch.process.poll() is None, launch.output()
        launch.process.send_signal(signal.SIGINT)
        assert_stops_cleanly(launch)
    finally:
        launch.kill_everything()


def test_an_actor_that_dies_stops_the_run_with_exit_1(tmp_path):
    launch = Launch(
        tmp_path, "--tasks.0.rubric.reward_fns", "[{fn = 'tests.e2e_rewards:kill_reward_process'}]", "--services.reward.max_restarts", "0"
    )
    try:
        returncode = launch.wait_for_exit(timeout=300)
        assert returncode == 1, launch.output()
        assert "run stopped:" in launch.output() and "reward: restart budget spent" in launch.output()
        deadline = time.monotonic() + 10
        while processes_with_marker(launch.marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert processes_with_marker(launch.marker) == []
    finally:
        launch.kill_everything()
