"""pass@k of held-out rows with several samples each: Chen et al. 2021's unbiased estimator.

For a row with n scored samples of which c pass, the chance that k of them drawn without replacement include a
pass is 1 - C(n-c, k) / C(n, k); its mean over rows estimates pass@k without the bias of "best of the first k"
(which is the same estimate thrown away n - k samples at a time) or of 1 - (1 - c/n)^k. A sample passes when its
reward reaches `run.eval_pass_threshold`. A sample that failed (its generator, environment or reward function:
status error, timeout or aborted, which the rubric gives `error_reward`) or that the reward service did not score
(reward None) is no answer of the model: it is left out of n and out of the mean reward, and counted in
`eval/failed`. A row with fewer than k scored samples cannot give an unbiased pass@k: it is left out of pass@k (and
counted), never counted as a pass or a failure.
"""

from __future__ import annotations

import math
from fractions import Fraction

from rl.config.run import RunConfig
from rl.metrics.standard import reward_metrics
from rollouts.types import FAILED_STATUSES, Rollout, RolloutGroup
from rubrics.rubric import Rubric


def scored(rollout: Rollout) -> bool:
    """Whether a held-out sample is an answer of the model that was scored: not failed, and given a reward."""
    return rollout.status not in FAILED_STATUSES and rollout.reward is not None


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k) / C(n, k): the probability that k of a row's n samples, c of them passing, include a pass."""
    if not 0 <= c <= n or k < 1:
        raise ValueError(f"pass@k needs 0 <= c <= n and k >= 1, got n={n}, c={c}, k={k}")
    if n < k:
        raise ValueError(f"pass@{k} cannot be estimated from {n} samples")
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


def pass_metrics(groups: list[RolloutGroup], k: int, threshold: float, prefix: str = "eval") -> dict[str, float]:
    """`prefix/pass@1` and `prefix/pass@<k>` over rows (each group is one row's samples), and again per task as
    `prefix/pass@<k>/<task>`; `prefix/pass@<k>/rows_left_out`: rows with fewer than k scored samples."""
    rows: list[tuple[str, int, int]] = []  # (task, n, c)
    for group in groups:
        rewards = [rollout.reward for rollout in group.rollouts if scored(rollout)]
        rows.append((group.task_name, len(rewards), sum(reward >= threshold for reward in rewards)))
    metrics: dict[str, float] = {}
    tasks = sorted({task for task, _, _ in rows})
    for size in sorted({1, k}):
        for scope, members in [("", rows)] + [(f"/{task}", [row for row in rows if row[0] == task]) for task in tasks]:
            estimable = [pass_at_k(n, c, size) for _, n, c in members if n >= size]
            if estimable:
                metrics[f"{prefix}/pass@{size}{scope}"] = sum(estimable) / len(estimable)
    if k > 1:
        metrics[f"{prefix}/pass@{k}/rows_left_out"] = sum(n < k for _, n, _ in rows)
    return metrics


def eval_metrics(groups: list[RolloutGroup], k: int, threshold: float) -> dict[str, float]:
    """A validation's metrics: `eval/reward/...` (mean over every scored sample, per task too), pass@1, pass@k, and
    `eval/failed`: the samples left out of both because they failed or were not scored."""
    rollouts = [rollout for group in groups for rollout in group.rollouts]
    answered = [rollout for rollout in rollouts if scored(rollout)]
    rewards = reward_metrics(answered, prefix="eval/reward") if answered else {}
    return rewards | pass_metrics(groups, k, threshold) | {"eval/failed": len(rollouts) - len(answered)}


def eval_failure_line(step: int, groups: list[RolloutGroup]) -> str | None:
    """The console's line for a validation with failed samples: how many were left out, and the first one's error;
    None when every sample was scored."""
    failed = [rollout for group in groups for rollout in group.rollouts if not scored(rollout)]
    if not failed:
        return None
    cause = (failed[0].error or failed[0].status.value).strip().splitlines() or [failed[0].status.value]
    total = sum(len(group.rollouts) for group in groups)
    return (
        f"validation at step {step}: {len(failed)} of {total} held-out samples failed and were left out of eval/reward"
        f" and eval/pass@k (eval/failed); first: {cause[-1][:300]}"
    )


def unreachable_threshold_warnings(rubrics: dict[str, Rubric], run: RunConfig) -> list[str]:
    """A warning per task whose rubric can never reach `run.eval_pass_threshold` (its largest reward, from every
    function's declared best value, is below it) in a run that validates: every pass@k of that task would read 0
    however right the answers."""
    threshold, warnings = run.eval_pass_threshold, []
    if not run.eval_every:
        return []
    for name, rubric in sorted(rubrics.items()):
        best = rubric.best_total()
        if best is not None and best < threshold - 1e-9:
            warnings.append(
                f"task {name!r}: its rubric gives at most {best:.4g} (a weighted mean: "
                + ", ".join(f"{f.key} weight {rubric.weights[f.key]:.3g}" for f in rubric.reward_fns)
                + f"), below run.eval_pass_threshold = {threshold:g}: no held-out sample can pass, eval/pass@k would "
                f"read 0. Set run.eval_pass_threshold to at most {best:.4g}, or change the rubric's weights"
            )
    return warnings
