"""A run stopped three ways after a trained step and resumed each time writes the same metrics and tokens as an
uninterrupted run: SIGKILL (its newest regular checkpoint is then damaged on disk: the resume names why, keeps it aside
and continues from the one before), then Ctrl-C (SIGINT) and SIGTERM with no regular checkpoints (each commits the step
it stopped after: the only checkpoint of that step)."""

import re
import signal
from pathlib import Path

from rl.checkpoint import store as checkpoint
from tests.support.launch import Launch
from tests.support.runs import EXACT_RUN, assert_same_run, read_jsonl, train_to_end

SAVED = re.compile(r"rlmesh: interrupted after step (\d+); it is saved in (\S+)")


def stop_after_a_trained_step(run_dir: Path, step: int, signal_number: int, skipped: tuple[str, ...] = ()) -> int:
    """Resume `run_dir` with no regular checkpoints and send `signal_number` once step `step` is logged: the run must
    exit 130 naming the step it committed (`step`, or the next when it was training), that step must be the newest
    checkpoint and the last logged step. `skipped`: lines the resume must print before it trains. Returns the step."""
    launch = Launch(run_dir, "--checkpoint.every_steps", "0", resume=run_dir)
    try:
        launch.wait_for_line(f"step {step:4d} v{step}")
        for line in skipped:
            assert f"rlmesh: warning: {line}" in launch.text, launch.output()
        launch.process.send_signal(signal_number)
        assert launch.wait_for_exit(timeout=120) == 130, launch.output()
        assert "rlmesh: interrupt received" in launch.text, launch.output()  # taken by the run's signal watcher
    finally:
        launch.kill_everything()
    saved = SAVED.search(launch.text)
    assert saved is not None, launch.output()
    committed = int(saved[1])
    newest = checkpoint.newest_checkpoint(run_dir)
    assert committed >= step and saved[2] == str(newest) and newest.name == f"step_{committed:08d}"
    assert checkpoint.read(newest, checkpoint.RUN_STATE)["step"] == committed
    assert read_jsonl(run_dir / "metrics.jsonl")[-1]["step"] == committed
    return committed


def test_a_run_stopped_by_sigkill_sigint_and_sigterm_resumes_to_the_same_metrics_and_tokens(tmp_path, clean_tiny_run):
    launch = Launch(tmp_path, "--checkpoint.every_steps", "1", "--checkpoint.keep", "2", *EXACT_RUN)
    try:
        launch.wait_for_line("step    2 v2")
        launch.process.send_signal(signal.SIGKILL)
        launch.process.wait(timeout=30)
    finally:
        launch.kill_everything()
    run_dir = tmp_path / "tiny_qwen3_e2e"
    newest = checkpoint.newest_checkpoint(run_dir)
    killed_at = int(newest.name.removeprefix("step_"))
    assert killed_at in (2, 3)
    damaged = sorted((newest / "trainer").glob("*.distcp"))[0]
    with open(damaged, "r+b") as file:  # one byte of the weights flipped: same size, another content
        file.seek(damaged.stat().st_size // 2)
        byte = file.read(1)
        file.seek(-1, 1)
        file.write(bytes([byte[0] ^ 0xFF]))
    interrupted = stop_after_a_trained_step(
        run_dir,
        killed_at,
        signal.SIGINT,
        skipped=(
            f"skipping checkpoint {newest.name}: trainer/{damaged.name} differs from what was committed (sha256)",
            f"a checkpoint newer than the one resumed is kept aside as {newest.with_name('damaged-' + newest.name)}",
        ),
    )
    assert (newest.with_name(f"damaged-{newest.name}") / "trainer" / damaged.name).is_file()
    terminated = stop_after_a_trained_step(run_dir, interrupted + 1, signal.SIGTERM)
    if terminated < 6:
        train_to_end("--resume", str(run_dir))
    assert_same_run(run_dir, clean_tiny_run, steps=6, interrupted_at=(interrupted, terminated))
