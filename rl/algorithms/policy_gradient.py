"""Outcome-reward policy-gradient algorithms: one advantage per rollout, trained on its sampled tokens."""

from __future__ import annotations

import math
from typing import Any

import torch

from rl.algorithms import advantages as adv
from rl.algorithms.base import Algorithm
from rl.components import import_object
from rl.config.algorithm import AlgorithmConfig
from rollouts.types import Rollout, RolloutGroup


class GRPO(Algorithm):
    """Reward minus the group mean (Dr.GRPO); `normalize_advantage_std` divides by the group std (GRPO)."""

    group_relative = True

    def advantages(self, rewards: torch.Tensor, rollouts: list[Rollout]) -> torch.Tensor:
        return adv.grpo_advantages(rewards, normalize_std=self.config.normalize_advantage_std)


class RLOO(Algorithm):
    """Reward minus the mean of the group's other rollouts."""

    group_relative = True

    def advantages(self, rewards: torch.Tensor, rollouts: list[Rollout]) -> torch.Tensor:
        return adv.rloo_advantages(rewards)


class MaxRL(Algorithm):
    """(reward - mean) / mean for pass rates in [0, 1]; a reward outside [0, 1] stops the run naming the task."""

    group_relative = True

    def advantages(self, rewards: torch.Tensor, rollouts: list[Rollout]) -> torch.Tensor:
        try:
            return adv.max_rl_advantages(rewards)
        except ValueError as exc:
            raise ValueError(f"task {self.task!r}: {exc}; use another algorithm.type for this task's rewards") from None


class ReinforcePP(Algorithm):
    """REINFORCE++ baseline: reward minus the group mean, then whitened over the step's tokens of the task."""

    group_relative = True

    def advantages(self, rewards: torch.Tensor, rollouts: list[Rollout]) -> torch.Tensor:
        return adv.grpo_advantages(rewards)

    def step_advantages(self, groups: list[RolloutGroup]) -> None:
        rollouts = [rollout for group in groups for rollout in group.rollouts if rollout.advantage is not None]
        if not rollouts:
            return
        [whitened] = adv.whiten_over_tokens(
            [torch.tensor([r.advantage for r in rollouts])],
            [torch.tensor([float(r.num_completion_tokens) for r in rollouts])],
        )
        for rollout, value in zip(rollouts, whitened.tolist()):
            rollout.advantage = value


class RawReward(Algorithm):
    """The raw reward as the advantage."""

    def advantages(self, rewards: torch.Tensor, rollouts: list[Rollout]) -> torch.Tensor:
        return rewards.to(torch.float32)


class Custom(Algorithm):
    """`custom_advantage_fn(rewards: list[float], rollouts) -> list[float | list[float]]`, imported by path: per
    rollout one advantage for all its sampled tokens, or a list with one per sampled token (per-token credit, as in
    prime-rl: `Rollout.num_completion_tokens` values, the completions of its turns in order)."""

    def __init__(self, config: AlgorithmConfig, task: str, renderer: Any = None, prompt_logprobs: Any = None):
        super().__init__(config, task, renderer, prompt_logprobs)
        self.fn = import_object(config.custom_advantage_fn)

    @classmethod
    def check(cls, config: AlgorithmConfig, where: str, group_size: int) -> None:
        super().check(config, where, group_size)
        if not config.custom_advantage_fn:
            raise ValueError(f"{where}.type = 'custom' needs {where}.custom_advantage_fn = 'package.module:function'")

    def advantages(self, rewards: torch.Tensor, rollouts: list[Rollout]) -> torch.Tensor:
        """Each rollout's advantage (the mean of its per-token values, which go to `Rollout.token_advantages`)."""
        fn = self.config.custom_advantage_fn
        values = self.fn(rewards.tolist(), rollouts)
        if len(values) != len(rollouts):
            raise ValueError(f"{fn} returned {len(values)} advantages for {len(rollouts)} rollouts")
        means = []
        for index, (rollout, value) in enumerate(zip(rollouts, values)):
            rollout.token_advantages = None
            if isinstance(value, (list, tuple)):
                tokens = rollout.num_completion_tokens
                if len(value) != tokens or not all(math.isfinite(float(v)) for v in value):
                    raise ValueError(
                        f"{fn} returned {len(value)} per-token advantages for rollout {index}, which sampled {tokens} "
                        "tokens; each must be a finite number"
                    )
                rollout.token_advantages = [float(v) for v in value]
                means.append(sum(rollout.token_advantages) / tokens if tokens else 0.0)
            else:
                means.append(float(value))
        return torch.tensor(means, dtype=torch.float32)
