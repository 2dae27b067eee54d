"""A trainer SIGKILLed in the middle of a run is replaced in the run. One rank, after step 3 of 6 (checkpoints every
2 steps): the launcher exits 0, the run's log says what happened, and the run writes the same metrics and tokens as
an uninterrupted run (with `trainer.lora`: tests/e2e/test_lora.py). One rank of two: both are restarted, to the
numbers of an uninterrupted 2-rank run. Lost before the run's first checkpoint: the run stops with exit 1, saying there
is nothing to resume."""

import os
import signal
import time

from rl.checkpoint import store as checkpoint
from tests.support.launch import Launch, processes_with_marker, trainer_pids
from tests.support.paths import TINY
from tests.support.runs import EXACT_RUN, assert_rows_trained_once, assert_same_run, read_jsonl, train_to_end


def test_a_killed_trainer_is_recovered_in_the_run_to_the_same_metrics_and_tokens(tmp_path, clean_tiny_run):
    launch = Launch(tmp_path, "--checkpoint.every_steps", "2", *EXACT_RUN)
    try:
        launch.wait_for_line("step    3 v3")
        killed = trainer_pids(launch)
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


def test_a_2_rank_trainer_that_loses_one_rank_is_restarted_whole_to_the_clean_2_rank_runs_numbers(tmp_path):
    """One rank of a 2-rank (FSDP2) trainer SIGKILLed after step 2 of 4: both ranks are replaced (the survivor is
    stopped, not left waiting in a collective), the launcher exits 0, every row is trained exactly once, and the run
    writes the metrics and tokens of an uninterrupted 2-rank run (the new ranks load the sharded checkpoint whole)."""
    run = ("--trainer.num_procs", "2", "--run.steps", "4", "--checkpoint.every_steps", "1", "--run.eval_every", "0")
    run += EXACT_RUN[2:]  # its reward: nonzero advantages and losses
    train_to_end("--config", str(TINY), "--run.output_dir", str(tmp_path / "clean"), "--wandb.enabled", "false", *run)
    launch = Launch(tmp_path, *run)
    try:
        launch.wait_for_line("step    2 v2")
        ranks = trainer_pids(launch)
        assert len(ranks) == 2
        os.kill(ranks[1], signal.SIGKILL)
        launch.wait_for_line("trainer recovered")
        new_ranks = trainer_pids(launch)
        assert len(new_ranks) == 2 and not set(new_ranks) & set(ranks), (ranks, new_ranks)
        assert launch.wait_for_exit(timeout=600) == 0, launch.output()
    finally:
        launch.kill_everything()
    run_dir = tmp_path / "tiny_qwen3_e2e"
    assert_rows_trained_once(run_dir, steps=4, groups_per_step=2, group_size=4)
    recovered = [record for record in read_jsonl(run_dir / "metrics.jsonl") if "recovery/trainer_count" in record]
    assert [record["recovery/trainer_count"] for record in recovered] == [1]
    assert_same_run(run_dir, tmp_path / "clean" / "tiny_qwen3_e2e", steps=4)


def test_a_trainer_lost_before_the_first_checkpoint_stops_the_run_with_exit_1_and_nothing_to_resume(tmp_path):
    """No checkpoint to recover from (`checkpoint.every_steps = 0`, the final one not reached): the recovery cannot
    start, the launcher exits 1 saying the run must start again, and leaves no checkpoint and no actor process."""
    launch = Launch(tmp_path, "--checkpoint.every_steps", "0", "--run.eval_every", "0")
    try:
        launch.wait_for_line("step    1 v1")
        killed = trainer_pids(launch)
        assert len(killed) == 1
        os.kill(killed[0], signal.SIGKILL)
        assert launch.wait_for_exit(timeout=120) == 1, launch.output()
        stopped = [line for line in launch.lines if line.startswith("rlmesh: run stopped: the trainer was lost")]
        assert len(stopped) == 1, launch.output()
        nothing = (
            "the run committed no checkpoint before it: nothing to recover from or to resume, start the run again "
            "(checkpoint.every_steps = N keeps a checkpoint every N steps)"
        )
        assert stopped[0].rstrip().endswith(nothing), launch.output()
        assert "--resume" not in launch.text, launch.output()
        deadline = time.monotonic() + 10
        while processes_with_marker(launch.marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert processes_with_marker(launch.marker) == []
    finally:
        launch.kill_everything()
    assert checkpoint.committed_checkpoints(tmp_path / "tiny_qwen3_e2e") == []
