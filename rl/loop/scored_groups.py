"""How a row becomes a scored `RolloutGroup`: its task's rollout function on the generator service (or a frozen
model), then the reward service. Training rows and held-out rows take the same path."""

from __future__ import annotations

from rl.config.algorithm import POLICY
from rl.config.roles import SamplingConfig
from rl.loop.roles import Roles
from rollouts.fanout import RolloutContext, RolloutFn, rollout_group
from rollouts.types import RolloutGroup, mark_frozen
from tasks.build import BuiltTask


class ScoredGroups:
    def __init__(self, tasks: dict[str, BuiltTask], renderers: dict[str, object], roles: Roles, run_seed: int):
        self.tasks, self.renderers, self.roles, self.run_seed = tasks, renderers, roles, run_seed

    async def make(
        self,
        row_id: str,
        task_name: str,
        row: dict,
        group_size: int,
        sampling: SamplingConfig,
        sampler: str = POLICY,
        rollout_fn: RolloutFn | None = None,
    ) -> RolloutGroup:
        """A row's group: `group_size` rollouts on the generator service (or frozen model `sampler`), then its rewards.

        `rollout_fn` replaces the task's (an algorithm's own, e.g. sft's demonstrations, which generate nothing)."""
        task = self.tasks[task_name]
        dispatch_version = self.roles.policy_version()

        def context(sample_index: int) -> RolloutContext:
            return RolloutContext(
                row_id=row_id,
                sample_index=sample_index,
                task_name=task_name,
                task=task.task,
                renderer=self.renderers[task_name],
                env_config=task.config.env,
                generate=lambda request: self.roles.generate(request, sampling, row_id, sampler),
                run_seed=self.run_seed,
            )

        group = await rollout_group(row_id, task_name, row, group_size, rollout_fn or task.rollout_fn, context)
        for rollout in group.rollouts:
            rollout.dispatch_policy_version = dispatch_version
        if sampler == POLICY:
            for rollout in group.rollouts:
                rollout.metadata["generator_replica"] = self.roles.generators.router.replica_of(row_id)
        else:
            mark_frozen([group], sampler)
        if group.rollouts and all(rollout.reward is not None for rollout in group.rollouts):
            return group  # the rollout_fn scored its own samples
        return await self.roles.score(group)
