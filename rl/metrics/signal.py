"""A task whose rewards carry no learning signal: every trained group's rewards equal, step after step."""

from __future__ import annotations

from rollouts.types import FAILED_STATUSES, RolloutGroup


class SignalWatch:
    """Per task, the consecutive steps in which every trained group had equal rewards (no group-relative signal);
    one warning per task when they reach `steps`, again only after the task had a signal."""

    def __init__(self, steps: int):
        self.steps = steps
        self.flat: dict[str, int] = {}
        """Consecutive flat steps of each task."""

    def observe(self, step: int, groups: list[RolloutGroup]) -> list[str]:
        """Count `step`, whose trained groups are `groups` (failed rollouts left out); the warnings now due."""
        warnings = []
        rewards_by_task: dict[str, list[list[float]]] = {}
        for group in groups:
            rewards = [r.reward for r in group.rollouts if r.status not in FAILED_STATUSES and r.reward is not None]
            rewards_by_task.setdefault(group.task_name, []).append(rewards)
        for task, groups_rewards in sorted(rewards_by_task.items()):
            flat = all(len(set(rewards)) <= 1 for rewards in groups_rewards)
            self.flat[task] = self.flat.get(task, 0) + 1 if flat else 0
            if self.steps and self.flat[task] == self.steps:
                seen = sorted({reward for rewards in groups_rewards for reward in rewards})
                warnings.append(
                    f"step {step}: task {task!r} carried no learning signal for {self.steps} steps: within every group "
                    f"all rewards were equal (this step's values: {', '.join(f'{v:g}' for v in seen[:5])}), so every "
                    "advantage is 0. Check the rubric against a few replies (rollouts.jsonl, `rlmesh eval`): a reward "
                    "that never fires (an answer format the model does not follow) or always fires; or the task is "
                    "too hard or too easy for the model (run.no_signal_warn_steps)"
                )
        return warnings
