"""Checkpoints and `rlmesh train --resume`: refusals, and a killed run that resumes exactly."""

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rl import checkpoint
from rl.config import ConfigError, dump_toml, load_config
from rl.resume import resume_config, truncate_logs
from tests.test_interrupt import Launch

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "configs" / "tiny_qwen3_e2e.toml"
REWARD = "[{fn = 'tests.e2e_rewards:even_token_share'}]"  # varies across samples: nonzero advantages and losses


def fake_run(tmp_path: Path, steps_with_checkpoints: list[int], committed: bool = True) -> Path:
    run_dir = tmp_path / "run"
    config = load_config(TINY)
    run_dir.mkdir()
    (run_dir / "config.toml").write_text(dump_toml(config))
    for step in steps_with_checkpoints:
        tmp = checkpoint.begin(run_dir, step)
        (tmp / "config.toml").write_text(dump_toml(config))
        (tmp / "run_state.json").write_text(json.dumps({"step": step, "policy_version": step, "data_cursor": 2 * step, "rows_done_ahead": []}))
        if committed:
            checkpoint.commit(run_dir, tmp, step, keep=2)
    return run_dir


def test_commit_renames_into_place_and_prunes_to_keep(tmp_path):
    run_dir = fake_run(tmp_path, [1, 2, 3])
    assert [path.name for path in checkpoint.committed_checkpoints(run_dir)] == ["step_00000002", "step_00000003"]
    assert checkpoint.newest_checkpoint(run_dir).name == "step_00000003"
    assert not list(checkpoint.checkpoint_root(run_dir).glob(".tmp-*"))


def test_resume_continues_from_the_newest_checkpoint_and_allows_longer_runs(tmp_path):
    run_dir = fake_run(tmp_path, [1, 2])
    config, newest = resume_config(run_dir, {"run.steps": "10", "wandb.enabled": "false", "checkpoint.every_steps": "5"})
    assert newest.name == "step_00000002" and config.run.steps == 10


def test_resume_refuses_trajectory_changes_naming_the_keys(tmp_path):
    run_dir = fake_run(tmp_path, [1])
    with pytest.raises(ConfigError, match=r"different algorithm.group_size, model.path, tasks.0.args.num_digits: that would change"):
        resume_config(run_dir, {"model.path": "smollm2-135m-instruct", "algorithm.group_size": "8", "tasks.0.args.num_digits": "3"})


def test_resume_without_a_committed_checkpoint_is_refused(tmp_path):
    run_dir = fake_run(tmp_path, [1], committed=False)
    with pytest.raises(ConfigError, match="has no committed checkpoint"):
        resume_config(run_dir, {})
    with pytest.raises(ConfigError, match="not a run directory"):
        resume_config(tmp_path, {})


def test_truncate_logs_drops_records_after_the_checkpoint(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": step}) + "\n" for step in range(5)))
    truncate_logs(tmp_path, 2)
    assert (tmp_path / "metrics.jsonl").read_text().splitlines() == ['{"step": 0}', '{"step": 1}', '{"step": 2}']


def run_to_end(*args: str) -> None:
    result = subprocess.run([sys.executable, "-m", "rl.cli", "train", *args], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def comparable(record: dict) -> dict:
    """A metrics record without wall-clock quantities and the services' counters (counted since the launcher started)."""
    return {key: value for key, value in record.items() if not key.startswith(("time/", "perf/", "services/")) and not key.endswith("_per_s")}


@pytest.mark.e2e
def test_a_killed_run_resumes_to_the_same_metrics_and_tokens(tmp_path):
    overrides = ["--run.steps", "4", "--checkpoint.every_steps", "1", "--wandb.enabled", "false",
                 "--tasks.0.rubric.reward_fns", REWARD]
    run_to_end("--config", str(TINY), "--run.output_dir", str(tmp_path / "straight"), *overrides)

    launch = Launch(tmp_path / "killed", "--run.steps", "4", "--checkpoint.every_steps", "1", "--tasks.0.rubric.reward_fns", REWARD)
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
