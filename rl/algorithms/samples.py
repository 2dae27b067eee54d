"""From scored rollout groups to training samples, each task through its own `Algorithm`.

    produce_row:  scored group → assign (credit once, kept on each Rollout.advantage) → drop rule → buffer
    train step:   the step's groups → step-level credit (reinforce_pp's whitening) → samples + metrics

| type | rl (advantage) | ce | ref_kl |
|---|---|---|---|
| grpo, rloo, max_rl, reinforce_pp, reward, custom | sampled tokens | - | - |
| echo | sampled tokens (grpo) | environment messages' tokens, weight by each message's role | - |
| sft | - | the demonstration (dataset) or a frozen sampler's tokens | - |
| opd | - | - | sampled tokens vs a frozen teacher |
| opsd | - | - | sampled tokens vs the policy shown a demonstration |
"""

from __future__ import annotations

from typing import Any

import torch

from rl.algorithms.base import Algorithm, PromptLogprobsFn
from rl.algorithms.registry import build_algorithm
from rl.algorithms.streams import rollout_to_samples
from rl.config.algorithm import AlgorithmConfig
from rl.packing.rows import TrainSample
from rollouts.types import Rollout, RolloutGroup

DROPPED = "rollouts/dropped_groups"
DROPPED_ZERO_ADV = "rollouts/dropped_zero_adv_groups"


class SampleBuilder:
    """Credits each scored group once and turns a step's groups into samples and per-task advantage metrics."""

    def __init__(
        self,
        algorithms: dict[str, AlgorithmConfig],
        renderers: dict[str, Any],
        prompt_logprobs: PromptLogprobsFn | None,
    ):
        self.algorithms: dict[str, Algorithm] = {
            task: build_algorithm(config, task, renderers.get(task), prompt_logprobs)
            for task, config in algorithms.items()
        }

    def assign(self, group: RolloutGroup) -> str | None:
        """Credit the group's trainable rollouts (`Rollout.advantage`); the metric key it is dropped under, or None.

        Runs once per group, when it is scored: training and sample logging read the advantages it wrote.
        """
        algorithm = self.algorithms[group.task_name]
        trainable = algorithm.trainable(group)
        if len(trainable) < (2 if algorithm.group_relative else 1):
            return DROPPED
        if algorithm.trains_rl:
            rewards = torch.tensor([rollout.reward for rollout in trainable], dtype=torch.float64)  # [G]
            for rollout, advantage in zip(trainable, algorithm.advantages(rewards, trainable).tolist()):
                rollout.advantage = advantage
        return DROPPED_ZERO_ADV if algorithm.drops(trainable) else None

    def drop_reason(self, group: RolloutGroup, seq_len: int) -> str | None:
        """`assign`, then whether any of the group's samples fits `seq_len` tokens (a metric key, or None: kept).

        The producer gives a dropped group's slot to another row.
        """
        reason = self.assign(group)
        if reason is not None:
            return reason
        trainable = self.algorithms[group.task_name].trainable(group)
        fits = any(
            len(sample.input_ids) <= seq_len for rollout in trainable for sample in rollout_to_samples(rollout, 0.0)
        )
        return None if fits else DROPPED

    async def build(self, groups: list[RolloutGroup]) -> tuple[list[TrainSample], dict[str, float]]:
        """Samples of every group with something to learn; `rollouts/dropped_groups` counts the others.

        Groups not yet credited (built without the producer) are credited here, once.
        """
        metrics: dict[str, float] = {DROPPED_ZERO_ADV: 0, DROPPED: 0}
        kept: list[tuple[RolloutGroup, list[Rollout]]] = []
        for group in groups:
            algorithm = self.algorithms[group.task_name]
            trainable = algorithm.trainable(group)
            credited = not algorithm.trains_rl or (trainable and all(r.advantage is not None for r in trainable))
            reason = None if credited else self.assign(group)
            if reason is None and credited and algorithm.drops(trainable):
                reason = DROPPED_ZERO_ADV
            if reason is not None:
                metrics[DROPPED] += 1
                metrics[DROPPED_ZERO_ADV] += reason == DROPPED_ZERO_ADV
                continue
            kept.append((group, trainable))
        for task in sorted({group.task_name for group, _ in kept}):
            algorithm = self.algorithms[task]
            algorithm.step_advantages([group for group, _ in kept if group.task_name == task])
            values = torch.tensor(
                [r.advantage or 0.0 for group, trainable in kept if group.task_name == task for r in trainable],
                dtype=torch.float64,
            )
            metrics[f"advantage/{task}/mean"] = float(values.mean())
            metrics[f"advantage/{task}/std"] = float(values.std(unbiased=False))
            metrics[f"advantage/{task}/frac_zero"] = float((values == 0).double().mean())
        samples: list[TrainSample] = []
        for group, trainable in kept:
            group_samples = await self.algorithms[group.task_name].samples(group, trainable)
            metrics[DROPPED] += not group_samples
            samples.extend(group_samples)
        return samples, metrics
