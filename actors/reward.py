"""RewardActor: scores finished rollout groups in its own process, off the controller's loop.

Reward functions may be slow (a judge model, a sandbox); running them here keeps the
controller free to drive generation. Calls are served concurrently (a Monarch actor
otherwise handles one message at a time); at most `run.reward_concurrency` groups score at once.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from monarch.actor import Actor, concurrent_endpoint, endpoint

from rl import checkpoint
from rl.config import Config
from rollouts.types import RolloutGroup
from rubrics.rubric import apply_reward
from tasks.build import build_task


class RewardActor(Actor):
    def __init__(self, config: Config):
        self.tasks = {task.name: task.task for task in map(build_task, config.tasks)}
        self.limit = asyncio.Semaphore(config.run.reward_concurrency)

    @concurrent_endpoint
    async def score_group(self, group: RolloutGroup) -> RolloutGroup:
        """The group with `reward` / `reward_components` filled in on every rollout."""
        async with self.limit:
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
