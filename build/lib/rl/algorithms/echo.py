"""echo: GRPO on the sampled tokens plus cross-entropy on the environment's messages, weighted by their role."""

from __future__ import annotations

from rl.algorithms.policy_gradient import GRPO
from rl.algorithms.streams import rollout_to_samples
from rl.packing.rows import TrainSample
from rollouts.types import Rollout, RolloutGroup


class Echo(GRPO):
    """Each environment message a later prompt renders trains at its role's `echo_role_weights` (tool 0.1)."""

    async def samples(self, group: RolloutGroup, rollouts: list[Rollout]) -> list[TrainSample]:
        weights = self.config.echo_role_weights.model_dump()
        return [
            sample
            for rollout in rollouts
            for sample in rollout_to_samples(
                rollout, float(rollout.advantage or 0.0), env_weights=weights, renderer=self.renderer
            )
        ]
