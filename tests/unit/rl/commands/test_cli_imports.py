"""The launcher must start no thread before it blocks SIGINT (rl/processes/interrupts.py): importing the CLI starts
none, nor does a resume before it blocks SIGINT."""

import subprocess
import sys

import pytest

from tests.support.paths import REPO
from tests.support.runs import fake_run

pytestmark = pytest.mark.processes  # the CLI is imported in a fresh Python


def test_importing_the_cli_starts_no_thread():
    code = "import os, rl.commands.cli; print(len(os.listdir('/proc/self/task')))"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env={"PYTHONPATH": str(REPO)}, capture_output=True, text=True
    )
    assert result.stdout.strip() == "1", result.stderr


THREADS_WHEN_BLOCKED = """\
import os, sys
from rl.processes import interrupts

class Blocked(interrupts.InterruptibleRun):
    def __init__(self):
        print(len(os.listdir('/proc/self/task')), flush=True)  # before the signal watcher's thread starts
        os._exit(0)

interrupts.InterruptibleRun = Blocked
from rl.commands.cli import main
main(["train", "--resume", sys.argv[1]])
"""


def test_a_resumed_train_blocks_sigint_while_it_is_one_thread(tmp_path):
    """`rlmesh train --resume` asks whether the run is a LoRA tenant by reading its checkpoint with torch, whose import
    starts a thread: a thread started before SIGINT is blocked may take the Ctrl-C, which then bypasses the run's
    checkpoint on interrupt (a KeyboardInterrupt at any bytecode)."""
    run_dir = fake_run(tmp_path, [1])
    result = subprocess.run(
        [sys.executable, "-c", THREADS_WHEN_BLOCKED, str(run_dir)],
        cwd=REPO,
        env={"PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.stdout.strip() == "1", result.stdout + result.stderr
