"""Turning task rows into scored-ready rollout groups.

`collect_groups` drives every environment of a batch of rows turn by turn. Each turn, all
pending requests of all groups go to the generator in one call, which keeps vLLM's batch
full; the generator isolates a failing request so one bad group does not fail the others.
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from env_types.renderer_env import Completion, GenerationRequest, RendererEnv, RendererEnvConfig
from rollouts.types import Rollout, RolloutGroup, RolloutStatus
from tasks.task import Task

GenerateFn = Callable[[list[GenerationRequest]], Awaitable[list["Completion | str"]]]
"""Batch generation: one completion per request, or the error text of a request that failed."""


@dataclass
class GroupSpec:
    """What one group needs: its row, its task and that task's renderer and limits."""

    group_id: str
    task_name: str
    task: Task
    example: dict[str, Any]
    renderer: Any
    env_config: RendererEnvConfig


async def collect_groups(
    specs: list[GroupSpec], group_size: int, generate: GenerateFn, *, run_seed: int | None = None
) -> list[RolloutGroup]:
    """Run `group_size` rollouts of every spec to a terminal status.

    With `run_seed`, every request carries a seed derived from it and its rollout id (see `sampling_seed`).
    """
    groups: list[RolloutGroup] = []
    renderer_envs: list[RendererEnv] = []
    for spec in specs:
        rollouts = [
            Rollout(
                rollout_id=f"{spec.group_id}/{index}",
                group_id=spec.group_id,
                task_name=spec.task_name,
                sample_index=index,
            )
            for index in range(group_size)
        ]
        groups.append(RolloutGroup(group_id=spec.group_id, task_name=spec.task_name, example=spec.example, rollouts=rollouts))
        try:
            envs = spec.task.make_envs(copy.deepcopy(spec.example), group_size)
            if len(envs) != group_size:
                raise ValueError(f"make_envs returned {len(envs)} environments for a group of {group_size}")
        except Exception as exc:
            for rollout in rollouts:
                rollout.fail(RolloutStatus.ERROR, f"make_envs failed: {exc!r}")
            continue
        renderer_envs.extend(
            RendererEnv(env, spec.renderer, spec.env_config, rollout, run_seed=run_seed) for env, rollout in zip(envs, rollouts)
        )

    requests = await asyncio.gather(*(renderer_env.start() for renderer_env in renderer_envs))
    pending = [(env, request) for env, request in zip(renderer_envs, requests) if request is not None]
    while pending:
        try:
            completions = await generate([request for _, request in pending])
        except Exception as exc:
            completions = [f"generator call failed: {exc!r}"] * len(pending)
        failed_groups = {env.rollout.group_id: result for (env, _), result in zip(pending, completions) if isinstance(result, str)}
        next_pending = []
        steps = []
        for (env, _), completion in zip(pending, completions):
            if env.rollout.group_id in failed_groups:
                steps.append(env.abort(RolloutStatus.ERROR, failed_groups[env.rollout.group_id]))
            else:
                steps.append(env.step(completion))
        results = await asyncio.gather(*steps)
        for (env, _), next_request in zip(pending, results):
            if next_request is not None and env.rollout.group_id not in failed_groups:
                next_pending.append((env, next_request))
        pending = next_pending
    return groups
