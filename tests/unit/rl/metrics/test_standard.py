"""The standard per-batch metric set against hand-computed values (two tasks, a failure, a truncation)."""

import math

import pytest

from rl.metrics.standard import reward_metrics, rollout_metrics
from rollouts.types import Rollout, RolloutGroup, RolloutStatus, RolloutTurn


def rollout(task, index, reward, tokens, status=RolloutStatus.COMPLETED, version=0, components=None):
    turn = RolloutTurn(
        prompt_messages=[],
        prompt_token_ids=[1],
        completion_token_ids=[2] * tokens,
        completion_logprobs=[-0.5] * (tokens - 1) + [-1.5] * min(tokens, 1),
        policy_version=version,
    )
    return Rollout(
        rollout_id=f"{task}/{index}",
        group_id=task,
        task_name=task,
        sample_index=index,
        turns=[turn],
        status=status,
        reward=reward,
        reward_components=components or {},
    )


GROUPS = [
    RolloutGroup(
        group_id="a",
        task_name="a",
        example={},
        rollouts=[
            rollout("a", 0, 1.0, 4, components={"correct": 1.0}, version=1),
            rollout("a", 1, 0.0, 8, status=RolloutStatus.TRUNCATED, components={"correct": 0.0}, version=1),
        ],
    ),
    RolloutGroup(
        group_id="b",
        task_name="b",
        example={},
        rollouts=[
            rollout("b", 0, 0.5, 2, version=2),
            rollout("b", 1, 0.0, 6, version=2),
            rollout("b", 2, None, 0, status=RolloutStatus.ERROR, version=2),
        ],
    ),
]


def test_reward_metrics_overall_and_per_task():
    rollouts = [r for group in GROUPS for r in group.rollouts]
    assert reward_metrics(rollouts, "eval/reward") == {
        "eval/reward/mean": 1.5 / 5,
        "eval/reward/correct": 1.0 / 5,
        "eval/reward/a/mean": 0.5,
        "eval/reward/a/correct": 0.5,
        "eval/reward/b/mean": 0.5 / 3,
    }


def test_rollout_metrics_by_hand():
    metrics = rollout_metrics(GROUPS)
    rewards = [1.0, 0.0, 0.5, 0.0, 0.0]
    assert metrics["reward/std"] == pytest.approx(math.sqrt(sum((r - 0.3) ** 2 for r in rewards) / 5))
    assert metrics["rollouts/completion_tokens_mean"] == 20 / 5 and metrics["rollouts/completion_tokens_max"] == 8
    assert metrics["rollouts/a/completion_tokens_mean"] == 6 and metrics["rollouts/b/completion_tokens_mean"] == 8 / 3
    assert metrics["rollouts/truncation_rate"] == 1 / 5 and metrics["rollouts/a/truncation_rate"] == 0.5
    assert metrics["rollouts/b/truncation_rate"] == 0.0
    assert metrics["rollouts/entropy"] == pytest.approx((0.5 * 16 + 1.5 * 4) / 20)  # 20 tokens, 4 rollouts with tokens
    assert metrics["rollouts/a/entropy"] == pytest.approx((0.5 * 10 + 1.5 * 2) / 12)
    assert metrics["rollouts/status/completed"] == 3 and metrics["rollouts/status/error"] == 1
    assert metrics["rollouts/status/truncated"] == 1 and metrics["rollouts/status/timeout"] == 0


def test_malformed_tool_calls_are_counted_per_task_not_failed_tool_runs():
    from rollouts.types import ToolCallError

    calling = rollout("a", 0, 1.0, 4)
    calling.turns[0].tool_call_errors = [
        ToolCallError(kind="invalid_json", detail="x"),
        ToolCallError(kind="tool_failed", detail="y"),
    ]
    other = rollout("b", 0, 1.0, 4)
    other.turns[0].tool_call_errors = [
        ToolCallError(kind="unknown_tool", detail="z"),
        ToolCallError(kind="bad_arguments", detail="w"),
    ]
    metrics = rollout_metrics([RolloutGroup(group_id="g", task_name="a", example={}, rollouts=[calling, other])])
    assert metrics["rollouts/malformed_tool_calls"] == 3
    assert metrics["rollouts/a/malformed_tool_calls"] == 1 and metrics["rollouts/b/malformed_tool_calls"] == 2


def test_evicted_groups_report_their_completion_length_beside_the_kept_ones():
    """Kept rollouts of 2 and 4 tokens (mean 3); evicted ones of 10, 20 and 30 (mean 20): the two means show a budget
    that discards long rollouts. A step that evicts nothing has no evicted length."""
    from rl.metrics.generation import GenerationStats, batch_metrics

    kept = RolloutGroup(
        group_id="k", task_name="t", example={}, rollouts=[rollout("t", 0, 1.0, 2), rollout("t", 1, 0.0, 4)]
    )
    evicted = [
        RolloutGroup(
            group_id="e0", task_name="t", example={}, rollouts=[rollout("t", 0, 1.0, 10), rollout("t", 1, 0.0, 20)]
        ),
        RolloutGroup(group_id="e1", task_name="t", example={}, rollouts=[rollout("t", 0, 1.0, 30)]),
    ]
    metrics = batch_metrics([kept], evicted, GenerationStats(), policy_version=3, wait_seconds=0.0)
    assert metrics["rollouts/evicted_stale_groups"] == 2
    assert metrics["rollouts/evicted_completion_tokens_mean"] == 20.0
    assert metrics["rollouts/completion_tokens_mean"] == 3.0
    none_evicted = batch_metrics([kept], [], GenerationStats(), policy_version=3, wait_seconds=0.0)
    assert "rollouts/evicted_completion_tokens_mean" not in none_evicted
