"""Replica routing by outstanding rows, and CPU pinning from config."""

import os
import subprocess
import sys

from rl.router import LeastOutstanding


def test_rows_go_to_the_replica_with_the_fewest_outstanding():
    router = LeastOutstanding(3)
    with router.route() as first, router.route() as second, router.route() as third:
        assert [first, second, third] == [0, 1, 2]
        with router.route() as fourth:
            assert fourth == 0 and router.outstanding == [2, 1, 1]
    assert router.outstanding == [0, 0, 0]
    with router.route() as a:
        with router.route() as b:
            pass
        with router.route() as c:  # b finished: replica 1 is free again
            assert (a, b, c) == (0, 1, 1)


def test_pin_process_takes_its_share_of_the_cores():
    code = (
        "import os, torch\nfrom rl.affinity import pin_process\n"
        "print(pin_process([0, 1], rank=1, of=2), sorted(os.sched_getaffinity(0)), torch.get_num_threads())\n"
        "print(pin_process([0], rank=1, of=2), pin_process(None))"
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout.split("\n")
    assert out[0] == "[1] [1] 1"  # replica 1 of 2 on cores [0, 1] gets core 1
    assert out[1] == "[0] []"  # fewer cores than replicas: all share them; unset: no pinning
