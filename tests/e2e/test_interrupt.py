"""Ctrl-C on a real run, in several phases, stops every actor process and exits with 130.

SIGINT is sent to the launcher's pid (process-directed, as a terminal or `kill` sends it): that is
the signal the kernel may hand to any of the launcher's threads, the cause of the once-lost Ctrl-C.
"""

import signal
import time

import pytest

from tests.support.launch import Launch, processes_with_marker

STOP_DEADLINE_S = 30


def assert_stops_cleanly(launch: Launch) -> None:
    sent = time.monotonic()
    returncode = launch.wait_for_exit(timeout=STOP_DEADLINE_S)
    assert returncode == 130, launch.output()
    assert time.monotonic() - sent < STOP_DEADLINE_S
    assert "rlmesh: interrupted" in "".join(launch.lines), (
        launch.output()
    )  # Monarch may print a teardown trace after it
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
        tmp_path,
        "--tasks.0.rubric.reward_fns",
        "[{fn = 'tests.support.e2e_rewards:kill_reward_process'}]",
        "--services.reward.max_restarts",
        "0",
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
