"""What generation did for a step: throughput, drops, policy lag, and how long training waited for it.

The producer counts into `GenerationStats` as rows finish; the controller drains it once a step
and turns it, with the consumed batch, into the step's `rollouts/`, `async/`, `time/` and `perf/` metrics.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rl.algorithms.streams import new_samples
from rl.metrics.standard import rollout_metrics
from rollouts.types import FAILED_STATUSES, Rollout, RolloutGroup, is_frozen_sampled


@dataclass
class GenerationStats:
    """What the producer did since the consumer last looked; `seconds` counts time with any row generating."""

    seconds: float = 0.0
    completion_tokens: int = 0
    dropped_groups: int = 0
    dropped_zero_adv_groups: int = 0
    running: int = 0
    busy_since: float = 0.0
    dropped_failed: list[RolloutGroup] = field(default_factory=list)
    """Dropped groups with a failed rollout: the step logs and counts them, though it trains none of them."""

    def row_started(self) -> None:
        if self.running == 0:
            self.busy_since = time.perf_counter()
        self.running += 1

    def row_finished(self, group: RolloutGroup, drop: str | None) -> None:
        """`drop`: the metric key the group was dropped under (`SampleBuilder.drop_reason`), None if kept."""
        self.running -= 1
        if self.running == 0:
            self.seconds += time.perf_counter() - self.busy_since
        self.completion_tokens += sum(rollout.num_completion_tokens for rollout in group.rollouts)
        self.dropped_groups += drop is not None
        self.dropped_zero_adv_groups += drop == "rollouts/dropped_zero_adv_groups"
        if drop is not None and failed_rollouts([group]):
            self.dropped_failed.append(group)

    def drain(self) -> GenerationStats:
        now = time.perf_counter()
        seconds = self.seconds + (now - self.busy_since if self.running else 0.0)
        drained = GenerationStats(
            seconds,
            self.completion_tokens,
            self.dropped_groups,
            self.dropped_zero_adv_groups,
            dropped_failed=self.dropped_failed,
        )
        self.seconds, self.completion_tokens, self.dropped_groups, self.dropped_zero_adv_groups, self.busy_since = (
            0.0,
            0,
            0,
            0,
            now,
        )
        self.dropped_failed = []
        return drained


def failed_rollouts(groups: list[RolloutGroup]) -> list[Rollout]:
    """The rollouts of `groups` whose environment, generator or reward function failed (status error, timeout, aborted)."""
    return [rollout for group in groups for rollout in group.rollouts if rollout.status in FAILED_STATUSES]


def failure_line(step: int, groups: list[RolloutGroup]) -> str | None:
    """The console's one line for a step whose groups (trained or dropped) have failed rollouts: how many, and the
    first one's error; None when none failed."""
    failed = failed_rollouts(groups)
    if not failed:
        return None
    first = (failed[0].error or failed[0].status.value).strip().splitlines() or [failed[0].status.value]
    total = sum(len(group.rollouts) for group in groups)
    return (
        f"step {step}: {len(failed)} of {total} rollouts failed and were not trained on"
        f" (rollouts.jsonl has each one's error); first: {first[-1][:300]}"
    )


@dataclass
class GroupFailures:
    """Groups produced over a whole run and how many failed (every rollout failed), with the first failure's error."""

    groups: int = 0
    failed: int = 0
    first_error: str = ""

    def record(self, failed: bool, cause: str) -> None:
        self.groups += 1
        self.failed += failed
        if failed and not self.first_error:
            self.first_error = cause.strip().splitlines()[-1][:300] if cause.strip() else "failed"

    def summary(self) -> str | None:
        """The end of the run's warning when any group failed, None when none did."""
        if not self.failed:
            return None
        return (
            f"{self.failed} of {self.groups} groups ({self.failed / self.groups:.0%}) failed and were not trained on;"
            f" first error: {self.first_error} (every failed rollout is in rollouts.jsonl with its error,"
            ' kind "dropped" when its group was dropped)'
        )


def batch_metrics(
    groups: list[RolloutGroup],
    evicted: list[RolloutGroup],
    stats: GenerationStats,
    policy_version: int,
    wait_seconds: float,
) -> dict[str, float]:
    """A consumed batch's metrics: drops and evictions (with the evicted groups' mean completion length, to compare
    with the kept ones': a budget that evicts long rollouts biases training toward short ones), version offsets
    against `policy_version`, generation throughput, the consumer's wait, and `rl.metrics.standard.rollout_metrics`;
    `rollouts/status/*` also counts the rollouts of the failed groups dropped since the last step
    (`stats.dropped_failed`)."""
    rollouts = [rollout for group in groups for rollout in group.rollouts]
    # frozen samplers never age
    policy_sampled = [r for r in rollouts if r.turns and r.metadata.get("sampler", "policy") == "policy"]
    offsets = [policy_version - min(r.policy_versions) for r in policy_sampled]
    metrics: dict[str, float] = {
        "rollouts/evicted_stale_groups": len(evicted),
        "rollouts/dropped_groups": stats.dropped_groups,
        "rollouts/dropped_zero_adv_groups": stats.dropped_zero_adv_groups,
        "async/version_offset_mean": sum(offsets) / len(offsets) if offsets else 0.0,
        "async/version_offset_max": max(offsets, default=0),
        "rollouts/policy_lag_max": max(
            (policy_version - group.min_policy_version for group in groups if not is_frozen_sampled(group)), default=0
        ),
        "time/generation_s": stats.seconds,
        "perf/sample_wait_time": wait_seconds,
        "perf/generation_tokens_per_s": stats.completion_tokens / stats.seconds if stats.seconds else 0.0,
        "rollouts/gateway_new_samples": sum(r.metadata.get("gateway_new_samples", 0) for r in rollouts),
        "rollouts/new_samples": sum(new_samples(r) for r in rollouts),  # environment and gateway rollouts alike
    }
    metrics.update(rollout_metrics(groups))
    if evicted_lengths := [rollout.num_completion_tokens for group in evicted for rollout in group.rollouts]:
        metrics["rollouts/evicted_completion_tokens_mean"] = sum(evicted_lengths) / len(evicted_lengths)
    for rollout in (rollout for group in stats.dropped_failed for rollout in group.rollouts):
        metrics[f"rollouts/status/{rollout.status.value}"] += 1  # counted though dropped: a failure never hides
    return metrics


def overlap_metrics(wait_seconds: float, busy_seconds: float) -> dict[str, float]:
    """How much of a step the consumer waited for rollouts vs. was busy (advantages, train step, weight sync)."""
    wait_ratio = wait_seconds / (wait_seconds + busy_seconds)
    return {"perf/wait_time_ratio": wait_ratio, "perf/overlap_ratio": 1.0 - wait_ratio}
