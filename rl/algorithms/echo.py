"""echo: GRPO on the sampled tokens plus cross-entropy on the environment's messages, weighted by their role."""

from __future__ import annotations

from typing import Any

from rl.algorithms.policy_gradient import GRPO
from rl.algorithms.streams import rollout_to_samples
from rl.components import import_object
from rl.config.algorithm import AlgorithmConfig
from rl.packing.rows import TrainSample
from rollouts.types import Rollout, RolloutGroup


class Echo(GRPO):
    """Each environment message a later prompt renders trains at its role's `echo_role_weights` (tool 0.1); with
    `echo_filter`, only the messages the filter keeps."""

    filters_env_messages = True

    def __init__(self, config: AlgorithmConfig, task: str, renderer: Any = None, prompt_logprobs: Any = None):
        super().__init__(config, task, renderer, prompt_logprobs)
        self.filter = import_object(config.echo_filter) if config.echo_filter else None

    async def samples(self, group: RolloutGroup, rollouts: list[Rollout]) -> list[TrainSample]:
        weights = self.config.echo_role_weights.model_dump()
        return [
            sample
            for rollout in rollouts
            for sample in rollout_to_samples(
                rollout,
                float(rollout.advantage or 0.0),
                env_weights=weights,
                renderer=self.renderer,
                env_filter=self.filter,
            )
        ]
