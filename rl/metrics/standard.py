"""The metric set every run reports about its rollouts, overall and per task (`<prefix>/<task>/...`)."""

from __future__ import annotations

import statistics

from rl.algorithms.grpo import rollout_advantages
from rl.config import AlgorithmConfig
from rollouts.types import Rollout, RolloutGroup, RolloutStatus


def reward_metrics(rollouts: list[Rollout], prefix: str) -> dict[str, float]:
    """`prefix/mean` of the rewards (a missing reward counts 0) and `prefix/<fn>` of each component,
    over all rollouts and again per task as `prefix/<task>/mean`, `prefix/<task>/<fn>`."""
    metrics: dict[str, float] = {}
    by_task: dict[str, list[Rollout]] = {}
    for rollout in rollouts:
        by_task.setdefault(rollout.task_name, []).append(rollout)
    for scope, members in [(prefix, rollouts)] + [(f"{prefix}/{task}", by_task[task]) for task in sorted(by_task)]:
        metrics[f"{scope}/mean"] = sum(r.reward or 0.0 for r in members) / len(members)
        for key in sorted({key for r in members for key in r.reward_components}):
            metrics[f"{scope}/{key}"] = sum(r.reward_components.get(key, 0.0) for r in members) / len(members)
    return metrics


def rollout_metrics(groups: list[RolloutGroup], policy_version: int, algorithm: AlgorithmConfig) -> dict[str, float]:
    """Rewards, response lengths, truncation rate, sampler entropy per token and status counts (overall and
    per task), advantages of the trained rollouts, and policy lag of a consumed batch trained at `policy_version`."""
    rollouts = [rollout for group in groups for rollout in group.rollouts]
    metrics = reward_metrics(rollouts, prefix="reward")
    metrics["reward/std"] = statistics.pstdev(r.reward or 0.0 for r in rollouts)
    by_task: dict[str, list[Rollout]] = {}
    for rollout in rollouts:
        by_task.setdefault(rollout.task_name, []).append(rollout)
    for scope, members in [("rollouts", rollouts)] + [(f"rollouts/{task}", by_task[task]) for task in sorted(by_task)]:
        lengths = [r.num_completion_tokens for r in members]
        metrics[f"{scope}/completion_tokens_mean"] = sum(lengths) / len(lengths)
        metrics[f"{scope}/completion_tokens_max"] = max(lengths)
        metrics[f"{scope}/truncation_rate"] = sum(r.status is RolloutStatus.TRUNCATED for r in members) / len(members)
        logprobs = [logprob for r in members for turn in r.turns for logprob in turn.completion_logprobs]
        if logprobs:  # E[-log p(x)] over x ~ p is the entropy: estimated from the sampled tokens
            metrics[f"{scope}/entropy"] = -sum(logprobs) / len(logprobs)
    for status in RolloutStatus:
        metrics[f"rollouts/status/{status.value}"] = sum(r.status is status for r in rollouts)
    advantages = [
        advantage
        for group in groups
        for advantage in rollout_advantages(
            group, normalize_std=algorithm.normalize_advantage_std, drop_constant_reward=algorithm.drop_constant_reward_groups
        ).values()
    ]
    if advantages:
        metrics["advantage/abs_mean"] = sum(abs(a) for a in advantages) / len(advantages)
        metrics["advantage/std"] = statistics.pstdev(advantages)
        metrics["advantage/min"], metrics["advantage/max"] = min(advantages), max(advantages)
    lags = [policy_version - group.min_policy_version for group in groups]
    metrics["rollouts/policy_lag_max"] = max(lags)
    metrics["rollouts/policy_lag_mean"] = sum(lags) / len(lags)
    return metrics
