"""How a row becomes a scored `RolloutGroup`: its task's rollout function on the generator service (or a frozen
model), then the reward service. Training rows and held-out rows take the same path."""

from __future__ import annotations

from env_types.renderer import Renderer, build_renderer, stop_token_ids
from rl.assets import resolve_model_path
from rl.config import Config
from rl.config.algorithm import POLICY
from rl.config.roles import SamplingConfig
from rl.loop.roles import Roles
from rollouts.fanout import RolloutContext, RolloutFn, rollout_group
from rollouts.types import RolloutGroup, mark_frozen
from tasks.build import BuiltTask, build_task


def built_tasks(config: Config) -> tuple[dict[str, BuiltTask], dict[str, Renderer], list[int]]:
    """The run's tasks built, each one's chat renderer for the policy model, and every renderer's end-of-turn tokens
    (what stops a generation), sorted: what the training loop and `rlmesh eval` both start from."""
    tasks = {task_config.key: build_task(task_config) for task_config in config.tasks}
    model_path = resolve_model_path(config.model.path)
    renderers = {name: build_renderer(task.config.renderer, model_path) for name, task in tasks.items()}
    return tasks, renderers, sorted({token for renderer in renderers.values() for token in stop_token_ids(renderer)})


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
