"""Ctrl-C on a real run, in several phases, stops every actor process and exits with 130.

SIGINT is sent to the launcher's pid (process-directed, as a terminal or `kill` sends it): that is
the signal the kernel may hand to any of the launcher's threads, the cause of the once-lost Ctrl-C.
"""

import json
import re
import signal
import time
from pathlib import Path

import pytest

from rl.checkpoint import store as checkpoint
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


def test_ctrl_c_after_step_2_commits_it_prints_the_resume_command_and_every_failed_reward_shows(tmp_path):
    """Issue 33: the first Ctrl-C commits the last completed step (2, or 3 when its train step was already in flight)
    and prints the exact resume command, which continues the run. The reward is the report's flaky one (ValueError,
    nan or the string "1.0" on 4 rows in 10): each failure is an error rollout with its text in rollouts.jsonl and the
    sample log, counted in `rollouts/status/error`, and the console names them per step and at the end."""
    launch = Launch(tmp_path, "--tasks.0.rubric.reward_fns", "[{fn = 'tests.support.e2e_rewards:flaky'}]")
    try:
        launch.wait_for_line("step    2 v2")
        launch.process.send_signal(signal.SIGINT)
        assert_stops_cleanly(launch)
    finally:
        launch.kill_everything()
    console = "".join(launch.lines)
    saved = re.search(
        r"rlmesh: interrupted after step (\d+); it is saved in (\S+)\nresume with: (rlmesh train --resume (\S+))",
        console,
    )
    assert saved, console
    step, run_dir = int(saved[1]), Path(saved[4])
    assert step in (2, 3) and Path(saved[2]) == checkpoint.newest_checkpoint(run_dir)
    assert checkpoint.read_run_state(checkpoint.newest_checkpoint(run_dir))["step"] == step

    assert re.search(
        r"step \d+: \d+ of \d+ rollouts failed and were not trained on .*first: reward function 'flaky'", console
    )
    assert re.search(
        r"\d+ of \d+ groups \(\d+%\) failed and were not trained on; first error: reward function 'flaky'", console
    )
    rollouts = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    errors = [r for r in rollouts if r["rollout"]["status"] == "error" and r["step"] <= step]
    assert errors and {r["kind"] for r in errors} == {"dropped"}
    assert all(r["rollout"]["error"].startswith("reward function 'flaky' ") for r in errors)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sum(m.get("rollouts/status/error", 0) for m in metrics if m["step"] <= step) == len(errors)
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert {s["rollout_id"] for s in samples if s["status"] == "error"} == {r["rollout"]["rollout_id"] for r in errors}

    resumed = Launch(tmp_path, "--run.steps", str(step + 1), resume=run_dir)  # the printed command, one step further
    try:
        assert resumed.wait_for_exit(timeout=300) == 0, resumed.output()
    finally:
        resumed.kill_everything()
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()][-1] == step + 1
