"""A run whose trainer is SIGKILLed after step 3 of 6 (checkpoints every 2 steps) replaces it in the run: the launcher
exits 0, the run's log says what happened, and the run writes the same metrics and tokens as an uninterrupted run."""

import os
import signal

import psutil

from rl.processes.titles import role_of
from tests.support.launch import Launch, processes_with_marker
from tests.support.runs import EXACT_RUN, assert_same_run, read_jsonl


def trainer_pids(marker: str) -> list[int]:
    """The trainer ranks' processes of the launch (named `trainer/<rank>`; a child they forked inherits the name)."""
    pids = []
    for process in processes_with_marker(marker):
        try:
            role, parent = role_of(process.pid), process.parent()
            if role.startswith("trainer/") and (parent is None or role_of(parent.pid) != role):
                pids.append(process.pid)
        except (psutil.Error, FileNotFoundError):
            continue
    return pids


def test_a_killed_trainer_is_recovered_in_the_run_to_the_same_metrics_and_tokens(tmp_path, clean_tiny_run):
    launch = Launch(tmp_path, "--checkpoint.every_steps", "2", *EXACT_RUN)
    try:
        launch.wait_for_line("step    3 v3")
        killed = trainer_pids(launch.marker)
        assert len(killed) == 1
        os.kill(killed[0], signal.SIGKILL)
        assert launch.wait_for_exit(timeout=600) == 0, launch.output()
    finally:
        launch.kill_everything()
    run_dir = tmp_path / "tiny_qwen3_e2e"
    log = (run_dir / "run.log").read_text()
    assert "trainer lost after step 3" in log and "loads checkpoint step_00000002" in log, log[-3000:]
    recovered = [record for record in read_jsonl(run_dir / "metrics.jsonl") if "recovery/trainer_count" in record]
    assert len(recovered) == 1 and recovered[0]["step"] == 3, recovered  # the first step trained again
    assert recovered[0]["recovery/trainer_count"] == 1 and recovered[0]["recovery/replayed_steps"] == 1
    assert 0 < recovered[0]["recovery/trainer_s"] < 300
    assert_same_run(run_dir, clean_tiny_run, steps=6)
