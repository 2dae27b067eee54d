"""The `Algorithm` base class: what a task's algorithm decides about its scored groups.

One instance per task (built by `rl.algorithms.registry.build_algorithm`). It owns three things:

- credit: `advantages` of a group's trainable rollouts, computed once when the group is scored
  (`SampleBuilder.assign`) and kept on each rollout (`Rollout.advantage`) for training and sample logs;
- the drop rule: whether a credited group has nothing to learn from;
- the token streams: `samples`, the group's `TrainSample`s routed to the rl, ce and ref_kl components.

A new credit-assignment scheme is a subclass registered in `rl.algorithms.registry`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

import torch

from rl.algorithms.streams import rollout_to_samples, spread_token_advantages
from rl.config.algorithm import AlgorithmConfig
from rl.packing.rows import TrainSample
from rollouts.types import Rollout, RolloutGroup

PromptLogprobsFn = Callable[[str, list[list[int]]], Awaitable[list[list[float]]]]
"""(model name or "policy", token id lists) -> per-token logprobs of each list (position 0 gets 0.0)."""


class Algorithm:
    """Credit, drop rule and token streams of one task's groups; subclasses override what differs."""

    group_relative: ClassVar[bool] = False
    """Advantages are taken relative to the group's other rollouts: a group needs two trainable rollouts."""
    trains_rl: ClassVar[bool] = True
    """Trains the rl component, which needs the live policy's sampling logprobs (so no frozen sampler)."""
    filters_env_messages: ClassVar[bool] = False
    """Reads `echo_filter` (echo): any other algorithm refuses it rather than ignore it."""

    def __init__(
        self, config: AlgorithmConfig, task: str, renderer: Any = None, prompt_logprobs: PromptLogprobsFn | None = None
    ):
        self.config = config
        self.task = task
        self.renderer = renderer
        self.prompt_logprobs = prompt_logprobs

    @classmethod
    def check(cls, config: AlgorithmConfig, where: str, group_size: int) -> None:
        """Reject a resolved config this algorithm cannot run; messages name the key (`where` = its section)."""
        if cls.group_relative and group_size < 2:
            raise ValueError(
                f"{where}.type = {config.type!r} is group-relative but algorithm.group_size = {group_size}: "
                "every advantage would be 0 (set group_size >= 2)"
            )
        if config.echo_filter and not cls.filters_env_messages:
            raise ValueError(f"{where}.echo_filter is read by type = 'echo' only, not by {config.type!r}")
        if cls.trains_rl and config.sampler != "policy":
            raise ValueError(
                f"{where}.sampler = {config.sampler!r} (a frozen model) cannot feed {where}.type = {config.type!r}: "
                "the rl loss needs the trained policy's sampling logprobs (use sft or opd)"
            )

    def rollouts_per_row(self, group_size: int) -> int:
        """How many rollouts a training row is sampled into."""
        return group_size

    def rollout_fn(self) -> Callable[..., Awaitable[Rollout | None]] | None:
        """The rollout function of a training row when the algorithm brings its own (None: the task's)."""
        return None

    def trainable(self, group: RolloutGroup) -> list[Rollout]:
        """The group's rollouts that can be trained on: a trainable status and a reward."""
        return [rollout for rollout in group.rollouts if rollout.status.is_trainable() and rollout.reward is not None]

    def advantages(self, rewards: torch.Tensor, rollouts: list[Rollout]) -> torch.Tensor:
        """Per-rollout advantages of a group's trainable rollouts ([G] float64 rewards -> [G])."""
        return torch.zeros(len(rollouts))

    def step_advantages(self, groups: list[RolloutGroup]) -> None:
        """Adjust the credited groups of one step together (in place on `Rollout.advantage`); most do nothing."""

    def drops(self, rollouts: list[Rollout]) -> bool:
        """Dynamic sampling: the group's credit is all zero and `drop_constant_reward_groups` asks to drop it."""
        return (
            self.trains_rl
            and self.config.drop_constant_reward_groups
            and all(r.advantage == 0 and not any(r.token_advantages or ()) for r in rollouts)
        )

    async def samples(self, group: RolloutGroup, rollouts: list[Rollout]) -> list[TrainSample]:
        """The training samples of a credited group's trainable `rollouts`: rl on the sampled tokens, each with its
        rollout's advantage (or its own, `Rollout.token_advantages`)."""
        samples = []
        for rollout in rollouts:
            own = rollout_to_samples(rollout, float(rollout.advantage or 0.0))
            if rollout.token_advantages is not None:
                own = spread_token_advantages(own, rollout.token_advantages)
            samples.extend(own)
        return samples
