"""The off-policy loop end to end: staleness budget 1, two generator replicas, tiny Qwen3, 3 steps.

Checked from the run's own files: no trained rollout is older than the budget, an off-policy
rollout was trained (version offset 1), and rows were routed to both replicas.
"""

import json
from pathlib import Path

import pytest

from rl.config import load_config
from rl.loop.controller import Controller
from tests.support.paths import E2E_CONFIGS


async def test_staleness_one_with_two_replicas(tmp_path):
    config = load_config(
        E2E_CONFIGS / "tiny_qwen3_e2e.toml",
        {
            "run.output_dir": str(tmp_path),
            "run.steps": "3",
            "run.eval_every": "0",
            "run.max_policy_staleness": "1",
            "generator.num_replicas": "2",
            "generator.on_weight_update": "finish",
            "wandb.enabled": "false",
            "tasks.0.rubric.reward_fns": "[{fn = 'tests.support.e2e_rewards:even_token_share'}]",
        },
    )
    summary = await Controller(config).run()
    run_dir = Path(summary["run_dir"])
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rollouts = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]

    assert [m["step"] for m in metrics] == [1, 2, 3] and [m["policy_version"] for m in metrics] == [1, 2, 3]
    assert max(m["async/version_offset_max"] for m in metrics) == 1
    for m in metrics:
        assert 0.0 <= m["perf/wait_time_ratio"] <= 1.0 and m["perf/overlap_ratio"] == pytest.approx(
            1 - m["perf/wait_time_ratio"]
        )
        busy_at_least = (
            m["time/train_s"] + m["time/weight_sync_s"]
        )  # the consumer's busy time also covers building the batch
        wait = m["perf/sample_wait_time"]
        assert m["perf/wait_time_ratio"] <= wait / (wait + busy_at_least) + 1e-6
        for key in (
            "perf/sample_wait_time",
            "async/version_offset_mean",
            "train/ppo_clip_frac",
            "train/ppo_kl",
            "rollouts/evicted_stale_groups",
        ):
            assert key in m, key

    train = [r for r in rollouts if r["kind"] == "train"]
    assert len(train) == 3 * 2 * 4  # steps x groups x group size
    for record in train:
        trained_at = record["step"] - 1  # the step that makes version s trains the policy at version s - 1
        sampled_at = min(turn["policy_version"] for turn in record["rollout"]["turns"])
        assert 0 <= trained_at - sampled_at <= 1
    assert {record["rollout"]["metadata"]["generator_replica"] for record in train} == {0, 1}
