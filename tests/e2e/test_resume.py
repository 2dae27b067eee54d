"""A run SIGKILLed after step 2 and resumed writes the same metrics and tokens as an uninterrupted run."""

import json
import signal
import subprocess
import sys

from rl.checkpoint import store as checkpoint
from tests.support.launch import Launch
from tests.support.paths import REPO, TINY

REWARD = "[{fn = 'tests.support.e2e_rewards:even_token_share'}]"  # varies across samples: nonzero advantages and losses


def run_to_end(*args: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rl.cli", "train", *args], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def comparable(record: dict) -> dict:
    """A metrics record without wall-clock quantities and the services' counters (counted since the launcher started)."""
    return {
        key: value
        for key, value in record.items()
        if not key.startswith(("time/", "perf/", "services/")) and not key.endswith("_per_s")
    }


def test_a_killed_run_resumes_to_the_same_metrics_and_tokens(tmp_path):
    overrides = [
        "--run.steps",
        "4",
        "--checkpoint.every_steps",
        "1",
        "--wandb.enabled",
        "false",
        "--tasks.0.rubric.reward_fns",
        REWARD,
    ]
    run_to_end("--config", str(TINY), "--run.output_dir", str(tmp_path / "straight"), *overrides)

    launch = Launch(
        tmp_path / "killed", "--run.steps", "4", "--checkpoint.every_steps", "1", "--tasks.0.rubric.reward_fns", REWARD
    )
    try:
        launch.wait_for_line("step    2 v2")
        launch.process.send_signal(signal.SIGKILL)
        launch.process.wait(timeout=30)
    finally:
        launch.kill_everything()
    killed_dir = tmp_path / "killed" / "tiny_qwen3_e2e"
    assert checkpoint.newest_checkpoint(killed_dir).name in ("step_00000002", "step_00000003")
    run_to_end("--resume", str(killed_dir))

    straight_dir = tmp_path / "straight" / "tiny_qwen3_e2e"
    straight = [json.loads(line) for line in (straight_dir / "metrics.jsonl").read_text().splitlines()]
    resumed = [json.loads(line) for line in (killed_dir / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in resumed] == [0, 1, 2, 3, 4]
    assert any(record.get("loss", 0.0) != 0.0 for record in straight)
    assert [comparable(record) for record in resumed] == [comparable(record) for record in straight]
    assert (killed_dir / "rollouts.jsonl").read_text() == (straight_dir / "rollouts.jsonl").read_text()
