"""The metric set every run reports about its rollouts, overall and per task (`<prefix>/<task>/...`)."""

from __future__ import annotations

import statistics

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


def rollout_metrics(groups: list[RolloutGroup]) -> dict[str, float]:
    """Rewards, response lengths, truncation rate, sampler entropy per token and status counts of a consumed
    batch, overall and per task (advantages and policy lag are the train step's and the controller's)."""
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
        metrics[f"{scope}/malformed_tool_calls"] = sum(r.num_malformed_tool_calls for r in members)
        logprobs = [logprob for r in members for turn in r.turns for logprob in turn.completion_logprobs]
        if logprobs:  # E[-log p(x)] over x ~ p is the entropy: estimated from the sampled tokens
            metrics[f"{scope}/entropy"] = -sum(logprobs) / len(logprobs)
    for status in RolloutStatus:
        metrics[f"rollouts/status/{status.value}"] = sum(r.status is status for r in rollouts)
    return metrics
