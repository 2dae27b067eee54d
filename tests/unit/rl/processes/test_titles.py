"""A process names its role in `comm` only: its command line and environment stay (teardown and tests find processes by them)."""

import os
import subprocess
import sys

import psutil
import pytest

from rl.processes.titles import role_of
from tests.support.paths import REPO

pytestmark = pytest.mark.processes  # a named child process


def test_a_named_process_keeps_its_command_line_and_environment():
    code = "from rl.processes.titles import name_process; import sys, time; name_process('frozen_judge/0#0'); print('named', flush=True); time.sleep(30)"
    child = subprocess.Popen(
        [sys.executable, "-c", code, "monarch"],
        cwd=REPO,
        env={**os.environ, "RLMESH_TEST_MARKER": "titles"},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "named"
        process = psutil.Process(child.pid)
        assert role_of(child.pid) == "frozen_judge/0#"  # cut to comm's 15 bytes
        assert process.cmdline()[-1] == "monarch"  # what rl.processes.interrupts.monarch_processes matches
        assert process.environ()["RLMESH_TEST_MARKER"] == "titles"
    finally:
        child.kill()
        child.wait()
