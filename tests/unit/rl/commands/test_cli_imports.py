"""The launcher must start no thread before it blocks SIGINT (rl/processes/interrupts.py): importing the CLI starts
none, nor does a resume before it blocks SIGINT."""

import subprocess
import sys

import pytest

from tests.support.paths import REPO, TINY
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
main(["train", *sys.argv[1:]])
"""


@pytest.mark.parametrize("start", ["--config", "--resume"])
def test_a_train_blocks_sigint_while_it_is_one_thread(tmp_path, start):
    """A thread started before SIGINT is blocked may take the Ctrl-C, which then bypasses the run's checkpoint on
    interrupt (a KeyboardInterrupt at any bytecode). `rlmesh train --resume` asks whether the run is a LoRA tenant by
    reading its checkpoint with torch, whose import starts a thread: only after SIGINT is blocked."""
    target = TINY if start == "--config" else fake_run(tmp_path, [1])
    result = subprocess.run(
        [sys.executable, "-c", THREADS_WHEN_BLOCKED, start, str(target)],
        cwd=REPO,
        env={"PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.stdout.strip() == "1", result.stdout + result.stderr
