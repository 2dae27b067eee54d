"""The suite's per-test deadline (tests.support.deadline) on a real pytest run: a hung test ends the run with exit 1,
its stack and its child processes killed."""

import os
import subprocess
import sys
import time

import psutil
import pytest

from tests.support.paths import REPO

pytestmark = pytest.mark.processes  # a hung pytest run as a child process

HUNG_TEST = """
import subprocess, time
import psutil

def test_hangs(tmp_path):
    child = subprocess.Popen(["sleep", "600"])
    (tmp_path.parent.parent / "child.pid").write_text(f"{child.pid} {psutil.Process(child.pid).create_time()}")
    time.sleep(600)
"""


def still_running(pid: int, created: float) -> bool:
    """Whether the process `pid` created at `created` still runs (its pid may belong to a newer process by now)."""
    try:
        process = psutil.Process(pid)
        return process.create_time() == created and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_hung_test_ends_the_run_with_its_stack_and_no_child_left(tmp_path):
    (tmp_path / "test_hung.py").write_text(HUNG_TEST)
    start = time.monotonic()
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "tests.support.deadline",
            "--basetemp",
            str(tmp_path / "base"),
            "-p",
            "no:cacheprovider",
            str(tmp_path / "test_hung.py"),
        ],
        cwd=REPO,
        env={**os.environ, "RLMESH_TEST_DEADLINE_S": "3"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1 and time.monotonic() - start < 60, run.stdout + run.stderr
    assert "test_hung.py::test_hangs: still running after 3 s (RLMESH_TEST_DEADLINE_S); stacks:" in run.stderr
    assert "in test_hangs" in run.stderr  # the hung test's frame, from every thread's stack
    pid, created = (tmp_path / "child.pid").read_text().split()
    assert not still_running(int(pid), float(created))
