"""The ways a real run ends early: Ctrl-C or SIGTERM in any phase, a second Ctrl-C, an actor or the trainer dying.

Each stops every actor process. Signals are sent to the launcher's pid (process-directed, as a terminal or `kill`
sends them): the kernel may hand them to any of the launcher's threads, the cause of the once-lost Ctrl-C.
(The hard stop at the grace deadline: tests/unit/rl/processes/test_interrupts.py.)
"""

import inspect
import os
import signal
import time

import pytest

from rl.config.run import CheckpointConfig
from rl.processes.interrupts import InterruptibleRun
from tests.support.launch import Launch, processes_with_marker, trainer_pids

GRACE_S = inspect.signature(InterruptibleRun).parameters["grace_s"].default
STOP_DEADLINE_S = GRACE_S + CheckpointConfig().interrupt_save_s + 30
"""How long the launcher may take to exit after the signal: its hard stop comes `grace_s` after the signal, or, when a
train step was in flight, `grace_s` past the Ctrl-C checkpoint's save budget (`checkpoint.interrupt_save_s`) from the
save's start (the step's end); then 30 s for the step in flight and the hard stop itself on two busy cores."""


def assert_stops_cleanly(launch: Launch) -> None:
    sent = time.monotonic()
    launch.process.wait(timeout=STOP_DEADLINE_S)
    stopped_s = time.monotonic() - sent  # the launcher's exit, not the output's end (an orphan may hold the pipe)
    print(f"the launcher exited {stopped_s:.1f} s after the signal")
    returncode = launch.wait_for_exit(timeout=0)
    assert returncode == 130, launch.output()
    assert stopped_s < STOP_DEADLINE_S
    assert "rlmesh: interrupted" in launch.text, launch.output()
    assert_no_process_left(launch)


def assert_no_process_left(launch: Launch) -> None:
    deadline = time.monotonic() + 10
    while processes_with_marker(launch.marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_with_marker(launch.marker) == []


@pytest.mark.parametrize(
    "phase_line,signals",
    [
        ("Monarch internal logs", [signal.SIGINT]),  # actor start-up: the store is up, processes are spawning
        ("step    0 v0", [signal.SIGTERM]),  # the first batch is being generated and scored
        ("step    1 v1", [signal.SIGINT, signal.SIGINT]),  # training, weight sync, generation; then a hard stop
    ],
    ids=["startup-sigint", "first-generation-sigterm", "training-second-sigint"],
)
def test_a_signal_in_any_phase_stops_all_actor_processes(tmp_path, phase_line, signals):
    launch = Launch(tmp_path)
    try:
        launch.wait_for_line(phase_line)
        assert launch.process.poll() is None, launch.output()
        for index, signal_number in enumerate(signals):
            if index:
                launch.wait_for_line("rlmesh: interrupt received", timeout=10)
                time.sleep(1)
            launch.process.send_signal(signal_number)
        assert_stops_cleanly(launch)
        if len(signals) > 1:
            assert "rlmesh: interrupted (second interrupt); actor processes killed" in launch.text, launch.output()
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
        assert "run stopped:" in launch.text and "reward: restart budget spent" in launch.text, launch.output()
        assert_no_process_left(launch)
    finally:
        launch.kill_everything()


def test_a_trainer_that_dies_past_the_recovery_budget_stops_the_run_with_exit_1_and_says_how_to_resume(tmp_path):
    launch = Launch(tmp_path, "--checkpoint.every_steps", "1", "--run.max_trainer_recoveries", "0")
    try:
        launch.wait_for_line("step    1 v1")  # step 1 is committed: there is a checkpoint to resume from
        [rank] = trainer_pids(launch)
        os.kill(rank, signal.SIGKILL)
        returncode = launch.wait_for_exit(timeout=120)
        assert returncode == 1, launch.output()
        assert "run stopped:" in launch.text and "the trainer was lost" in launch.text, launch.output()
        assert "rlmesh train --resume" in launch.text, launch.output()
        assert_no_process_left(launch)
    finally:
        launch.kill_everything()
