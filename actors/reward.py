"""RewardActor: scores finished rollout groups in its own process, off the controller's loop.

Reward functions may be slow (a judge model, a sandbox); running them here keeps the
controller free to drive generation. Calls are served concurrently (a Monarch actor
otherwise handles one message at a time); at most `run.reward_concurrency` groups score at once.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from monarch.actor import concurrent_endpoint, endpoint

from rl import checkpoint
from rl.assets import resolve_model_path
from rl.config import SamplingConfig, TaskConfig
from rl.metrics import timer
from rl.metrics.actor import MetricsActor
from env_types.renderer import RendererConfig
from rl.services.replica import ServiceReplica
from rollouts.types import RolloutGroup
from rubrics.judge import connect_frozen_models
from rubrics.rubric import apply_reward
from tasks.build import build_task


class RewardActor(MetricsActor, ServiceReplica):
    def __init__(self, tasks: list[TaskConfig], concurrency: int, model_paths: dict[str, str], judge_sampling: SamplingConfig):
        """`concurrency`: `run.reward_concurrency`; `model_paths`: each frozen model's path (`[models.<name>]`), for
        rendering what `judge` reward functions send it; `judge_sampling`: how judges sample (`generator.eval_sampling`)."""
        self.tasks = {task.name: task.task for task in map(build_task, tasks)}
        self.limit = asyncio.Semaphore(concurrency)
        self.model_paths = model_paths
        self.judge_sampling = judge_sampling

    @endpoint
    async def connect_models(self, models: dict[str, list[Any]]) -> None:
        """Frozen-model Generator replicas (`[models.<name>]`) that `judge` reward functions may call."""
        renderers = {name: RendererConfig().build(resolve_model_path(self.model_paths[name])) for name in models}
        connect_frozen_models(models, renderers, self.judge_sampling)

    @concurrent_endpoint
    async def score_group(self, group: RolloutGroup) -> RolloutGroup:
        """The group with `reward` / `reward_components` filled in on every rollout."""
        async with self.limit:
            with timer("reward"):  # summed over groups, which score concurrently
                rewards = await self.tasks[group.task_name].score_group(group.rollouts, group.example)
        if len(rewards) != len(group.rollouts):
            raise ValueError(f"{group.task_name}: score_group returned {len(rewards)} rewards for {len(group.rollouts)} rollouts")
        for rollout, reward in zip(group.rollouts, rewards):
            apply_reward(rollout, reward)
        return group

    @endpoint
    async def save_rng(self, path: str) -> None:
        """Reward functions may draw random numbers: their process's RNG goes into checkpoints."""
        checkpoint.save_rng(Path(path), "reward")

    @endpoint
    async def load_rng(self, path: str) -> None:
        checkpoint.load_rng(Path(path), "reward")
