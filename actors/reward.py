"""RewardActor: scores finished rollout groups in its own process, off the controller's loop.

Reward functions may be slow (a judge model, a sandbox); running them here keeps the
controller free to drive generation. Calls are served concurrently (a Monarch actor
otherwise handles one message at a time); at most `run.reward_concurrency` groups score at once.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from monarch.actor import endpoint

from env_types.renderer import build_renderer
from rl.assets import resolve_model_path
from rl.checkpoint import store as checkpoint
from rl.config.roles import SamplingConfig
from rl.config.tasks import RendererConfig, TaskConfig
from rl.metrics import timer
from rl.metrics.actor import MetricsActor
from rl.processes.titles import name_process
from rl.services.replica import ReplicaId, ServiceReplica, concurrent_endpoint
from rollouts.types import RolloutGroup
from rubrics.judge import connect_frozen_models
from rubrics.rubric import apply_reward
from tasks.build import build_task


class RewardActor(MetricsActor, ServiceReplica):
    memory_role = "reward"

    def __init__(
        self,
        tasks: list[TaskConfig],
        concurrency: int,
        model_paths: dict[str, str],
        judge_sampling: SamplingConfig,
        seed: int = 0,
        replica: ReplicaId | None = None,
    ):
        """`concurrency`: `run.reward_concurrency`; `model_paths`: each frozen model's path (`[models.<name>]`), for
        rendering what `judge` reward functions send it; `judge_sampling`: how judges sample (`generator.eval_sampling`);
        `seed`: `run.seed`, which with each rollout's id seeds every sync reward call (`Rubric.seed`)."""
        self.rng_name = f"reward_{replica.index}" if replica is not None else "reward"
        """This replica's RNG file in a checkpoint (each replica draws its own numbers)."""
        name_process(str(replica) if replica else "reward")
        self.tasks = {task.name: task.task for task in map(build_task, tasks)}
        for task in self.tasks.values():
            task.rubric.seed = seed
        self.limit = asyncio.Semaphore(concurrency)
        self.model_paths = model_paths
        self.judge_sampling = judge_sampling

    @endpoint
    async def connect_models(self, gateway: Any, names: list[str]) -> None:
        """The frozen models (`[models.<name>]`) that `judge` reward functions may call, through the controller's
        gateway to their services (`rl.services.gateway`)."""
        renderers = {
            name: build_renderer(RendererConfig(), resolve_model_path(self.model_paths[name])) for name in names
        }
        connect_frozen_models(gateway, renderers, self.judge_sampling)

    @concurrent_endpoint
    async def score_group(self, group: RolloutGroup) -> RolloutGroup:
        """The group with `reward` / `reward_components` filled in on every rollout."""
        async with self.limit:
            with timer("reward"):  # summed over groups, which score concurrently
                rewards = await self.tasks[group.task_name].score_group(group.rollouts, group.example)
        if len(rewards) != len(group.rollouts):
            raise ValueError(
                f"{group.task_name}: score_group returned {len(rewards)} rewards for {len(group.rollouts)} rollouts"
            )
        for rollout, reward in zip(group.rollouts, rewards):
            apply_reward(rollout, reward)
        return group

    @endpoint
    async def save_rng(self, path: str) -> None:
        """Async reward functions draw from this process's RNG, which goes into checkpoints; sync ones run in worker
        processes whose RNG is seeded per call (`rubrics.rubric.call_seed`), so they need none."""
        checkpoint.write(Path(path), checkpoint.RNG, self.rng_name)

    @endpoint
    async def load_rng(self, path: str) -> None:
        checkpoint.load_rng(Path(path), self.rng_name)
