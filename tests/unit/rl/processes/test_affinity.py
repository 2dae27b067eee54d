"""CPU pinning from config (routing between replicas: tests/unit/rl/services/test_services.py)."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.processes  # a pinned child process


def test_pin_process_takes_its_share_of_the_cores():
    code = (
        "import os, torch\nfrom rl.processes.affinity import pin_process\n"
        "print(pin_process([0, 1], rank=1, of=2), sorted(os.sched_getaffinity(0)), torch.get_num_threads())\n"
        "print(pin_process([0], rank=1, of=2), pin_process(None))"
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout.split("\n")
    assert out[0] == "[1] [1] 1"  # replica 1 of 2 on cores [0, 1] gets core 1
    assert out[1] == "[0] []"  # fewer cores than replicas: all share them; unset: no pinning
