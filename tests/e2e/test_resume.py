"""A run SIGKILLed after step 2 of 6 and resumed writes the same metrics and tokens as an uninterrupted run."""

import signal

from rl.checkpoint import store as checkpoint
from tests.support.launch import Launch
from tests.support.runs import EXACT_RUN, assert_same_run, train_to_end


def test_a_killed_run_resumes_to_the_same_metrics_and_tokens(tmp_path, clean_tiny_run):
    launch = Launch(tmp_path / "killed", "--checkpoint.every_steps", "1", *EXACT_RUN)
    try:
        launch.wait_for_line("step    2 v2")
        launch.process.send_signal(signal.SIGKILL)
        launch.process.wait(timeout=30)
    finally:
        launch.kill_everything()
    killed_dir = tmp_path / "killed" / "tiny_qwen3_e2e"
    assert checkpoint.newest_checkpoint(killed_dir).name in ("step_00000002", "step_00000003")
    train_to_end("--resume", str(killed_dir))
    assert_same_run(killed_dir, clean_tiny_run, steps=6)
