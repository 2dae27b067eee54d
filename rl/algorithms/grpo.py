"""From scored rollout groups to training samples with GRPO advantages."""

from __future__ import annotations

import torch

from rl.algorithms.advantages import grpo_advantages
from rl.batching import TrainSample
from rollouts.types import Rollout, RolloutGroup


def rollout_to_samples(rollout: Rollout, advantage: float) -> list[TrainSample]:
    """The training samples of a rollout: one per run of turns whose prompts extend each other.

    When every turn's prompt starts with the previous prompt + completion (the renderer
    bridged the turns), the whole conversation is one sample with the completions trained;
    where a re-render broke the prefix, a new sample starts.
    """
    samples: list[TrainSample] = []
    input_ids: list[int] = []
    loss_mask: list[bool] = []
    sampling_logprobs: list[float] = []
    versions: list[int] = []

    def close_sample() -> None:
        # A sample's version is its oldest sampled token's: staleness is measured from it.
        samples.append(TrainSample(input_ids, loss_mask, sampling_logprobs, advantage, min(versions)))

    for turn in rollout.turns:
        if not turn.completion_token_ids:
            continue
        prompt = turn.prompt_token_ids
        if input_ids and prompt[: len(input_ids)] != input_ids:
            close_sample()
            input_ids, loss_mask, sampling_logprobs, versions = [], [], [], []
        new_prompt = prompt[len(input_ids) :]
        input_ids = input_ids + new_prompt + turn.completion_token_ids
        loss_mask = loss_mask + [False] * len(new_prompt) + [True] * len(turn.completion_token_ids)
        sampling_logprobs = sampling_logprobs + [0.0] * len(new_prompt) + list(turn.completion_logprobs)
        versions.append(turn.policy_version)
    if input_ids:
        close_sample()
    return samples


def rollout_advantages(group: RolloutGroup, *, normalize_std: bool, drop_constant_reward: bool) -> dict[str, float]:
    """GRPO advantage of each trained rollout of a group, by `rollout_id`; {} if none is left to learn from.

    Errored, timed-out, aborted and prompt-overflow rollouts are left out of the baseline and
    the loss; a group needs two trainable rollouts for a baseline.
    """
    trainable = [rollout for rollout in group.rollouts if rollout.status.is_trainable() and rollout.reward is not None]
    if len(trainable) < 2:
        return {}
    rewards = torch.tensor([rollout.reward for rollout in trainable], dtype=torch.float64)
    if drop_constant_reward and bool((rewards == rewards[0]).all()):
        return {}
    advantages = grpo_advantages(rewards, normalize_std=normalize_std).tolist()
    return {rollout.rollout_id: advantage for rollout, advantage in zip(trainable, advantages)}


def group_to_samples(group: RolloutGroup, *, normalize_std: bool, drop_constant_reward: bool) -> list[TrainSample]:
    """GRPO samples of a group: its trained rollouts (see `rollout_advantages`) with their advantages."""
    advantages = rollout_advantages(group, normalize_std=normalize_std, drop_constant_reward=drop_constant_reward)
    return [
        sample
        for rollout in group.rollouts
        if rollout.rollout_id in advantages
        for sample in rollout_to_samples(rollout, advantages[rollout.rollout_id])
    ]
