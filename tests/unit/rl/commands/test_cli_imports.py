"""The launcher must start no thread before it blocks SIGINT (rl/processes/interrupts.py): importing the CLI starts none."""

import subprocess
import sys

import pytest

from tests.support.paths import REPO

pytestmark = pytest.mark.processes  # the CLI is imported in a fresh Python


def test_importing_the_cli_starts_no_thread():
    code = "import os, rl.commands.cli; print(len(os.listdir('/proc/self/task')))"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env={"PYTHONPATH": str(REPO)}, capture_output=True, text=True
    )
    assert result.stdout.strip() == "1", result.stderr
