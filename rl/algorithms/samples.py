"""From scored rollout groups to training samples: advantages and loss routing, per task algorithm.

Every algorithm is expressed as per-token streams of the sample (see `TrainSample`):

| type | rl (advantage) | ce | ref_kl |
|---|---|---|---|
| grpo, rloo, max_rl, reinforce_pp, reward, custom | sampled tokens | - | - |
| echo | sampled tokens (grpo) | environment tokens, weight by message role | - |
| sft | - | the demonstration (dataset) or a frozen sampler's tokens | - |
| opd | - | - | sampled tokens vs a frozen teacher |
| opsd | - | - | sampled tokens vs the policy shown a demonstration |
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import torch

from rl.algorithms import advantages as adv
from rl.algorithms.config import GROUP_RELATIVE, POLICY, AlgorithmConfig
from rl.batching import TrainSample
from rollouts.types import Rollout, RolloutGroup

PromptLogprobsFn = Callable[[str, list[list[int]]], Awaitable[list[list[float]]]]
"""(model name or "policy", token id lists) -> per-token logprobs of each list (position 0 gets 0.0)."""


def rollout_to_samples(rollout: Rollout, advantage: float, *, env_weights: dict[str, float] | None = None) -> list[TrainSample]:
    """The training samples of a rollout: one per run of turns whose prompts extend each other.

    When every turn's prompt starts with the previous prompt + completion (the renderer bridged the
    turns), the whole conversation is one sample with the completions trained; where a re-render broke
    the prefix, a new sample starts. With `env_weights` (echo), the environment tokens a turn adds to the
    prompt get a cross-entropy weight by the role of the environment message before them.
    """
    samples: list[TrainSample] = []
    input_ids: list[int] = []
    loss_mask: list[bool] = []
    sampling_logprobs: list[float] = []
    ce_weights: list[float] = []
    versions: list[int] = []

    def close_sample() -> None:
        # A sample's version is its oldest sampled token's: staleness is measured from it.
        samples.append(TrainSample(input_ids, loss_mask, sampling_logprobs, advantage, min(versions), ce_weights=ce_weights))

    previous_role = None
    for turn in rollout.turns:
        if not turn.completion_token_ids:
            continue
        prompt = turn.prompt_token_ids
        if input_ids and prompt[: len(input_ids)] != input_ids:
            close_sample()
            input_ids, loss_mask, sampling_logprobs, ce_weights, versions = [], [], [], [], []
        new_prompt = prompt[len(input_ids) :]
        env_weight = (env_weights or {}).get(previous_role, 0.0) if input_ids else 0.0
        input_ids = input_ids + new_prompt + turn.completion_token_ids
        loss_mask = loss_mask + [False] * len(new_prompt) + [True] * len(turn.completion_token_ids)
        sampling_logprobs = sampling_logprobs + [0.0] * len(new_prompt) + list(turn.completion_logprobs)
        ce_weights = ce_weights + [env_weight] * len(new_prompt) + [0.0] * len(turn.completion_token_ids)
        versions.append(turn.policy_version)
        previous_role = turn.env_messages[-1].get("role") if turn.env_messages else None
    if input_ids:
        close_sample()
    return samples


def load_function(path: str) -> Callable[..., Any]:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def group_advantages(algorithm: AlgorithmConfig, rewards: torch.Tensor, rollouts: list[Rollout]) -> torch.Tensor:
    """Per-rollout advantages of one group's trainable rollouts ([G] rewards -> [G])."""
    kind = algorithm.type
    if kind in ("grpo", "echo", "reinforce_pp"):
        return adv.grpo_advantages(rewards, normalize_std=algorithm.normalize_advantage_std and kind != "reinforce_pp")
    if kind == "rloo":
        return adv.rloo_advantages(rewards)
    if kind == "max_rl":
        return adv.max_rl_advantages(rewards)
    if kind == "reward":
        return rewards.to(torch.float32)
    if kind == "custom":
        values = load_function(algorithm.custom_advantage_fn)(rewards.tolist(), rollouts)
        if len(values) != len(rollouts):
            raise ValueError(f"{algorithm.custom_advantage_fn} returned {len(values)} advantages for {len(rollouts)} rollouts")
        return torch.tensor([float(v) for v in values], dtype=torch.float32)
    return torch.zeros(len(rollouts))  # sft, opd, opsd: no rl credit


@dataclass
class _Pending:
    task: str
    algorithm: AlgorithmConfig
    group: RolloutGroup
    rollouts: list[Rollout]
    advantages: torch.Tensor


class SampleBuilder:
    """Turns a step's scored groups into samples and per-task advantage metrics; algorithm by task name."""

    def __init__(self, algorithms: dict[str, AlgorithmConfig], renderers: dict[str, Any], prompt_logprobs: PromptLogprobsFn):
        self.algorithms = algorithms
        self.renderers = renderers
        self.prompt_logprobs = prompt_logprobs

    def drop_reason(self, group: RolloutGroup, seq_len: int) -> str | None:
        """Why a scored group yields no sample of at most `seq_len` tokens (a metric key), or None if it does.

        The same filters as `build`, without teacher calls: the producer gives a dropped group's slot to
        another row. (reinforce_pp whitens across a step's groups, so its zero-advantage drop waits for `build`.)
        """
        algorithm = self.algorithms[group.task_name]
        trainable = [r for r in group.rollouts if r.status.is_trainable() and r.reward is not None]
        if len(trainable) < (2 if algorithm.type in GROUP_RELATIVE else 1):
            return "rollouts/dropped_groups"
        rewards = torch.tensor([r.reward for r in trainable], dtype=torch.float64)
        p = _Pending(group.task_name, algorithm, group, trainable, group_advantages(algorithm, rewards, trainable))
        kind = algorithm.type
        if algorithm.drop_constant_reward_groups and kind not in ("sft", "opd", "opsd", "reinforce_pp") and bool((p.advantages == 0).all()):
            return "rollouts/dropped_zero_adv_groups"
        samples = self._sft_samples(p) if kind == "sft" else [s for r in trainable for s in rollout_to_samples(r, 0.0)]
        return None if any(len(s.input_ids) <= seq_len for s in samples) else "rollouts/dropped_groups"

    async def build(self, groups: list[RolloutGroup]) -> tuple[list[TrainSample], dict[str, float]]:
        """Samples of every group with something to learn; `rollouts/dropped_groups` counts the others."""
        metrics: dict[str, float] = {"rollouts/dropped_zero_adv_groups": 0, "rollouts/dropped_groups": 0}
        pending: list[_Pending] = []
        for group in groups:
            algorithm = self.algorithms[group.task_name]
            trainable = [r for r in group.rollouts if r.status.is_trainable() and r.reward is not None]
            if len(trainable) < (2 if algorithm.type in GROUP_RELATIVE else 1):
                metrics["rollouts/dropped_groups"] += 1
                continue
            rewards = torch.tensor([r.reward for r in trainable], dtype=torch.float64)
            pending.append(_Pending(group.task_name, algorithm, group, trainable, group_advantages(algorithm, rewards, trainable)))
        for task in sorted({p.task for p in pending}):
            of_task = [p for p in pending if p.task == task]
            if self.algorithms[task].type == "reinforce_pp":
                for p, whitened in zip(of_task, adv.whiten_across_groups([p.advantages for p in of_task])):
                    p.advantages = whitened
            values = torch.cat([p.advantages for p in of_task]).double()
            metrics[f"advantage/{task}/mean"] = float(values.mean())
            metrics[f"advantage/{task}/std"] = float(values.std(unbiased=False))
            metrics[f"advantage/{task}/frac_zero"] = float((values == 0).double().mean())
        samples: list[TrainSample] = []
        for p in pending:
            kind = p.algorithm.type
            if p.algorithm.drop_constant_reward_groups and kind not in ("sft", "opd", "opsd") and bool((p.advantages == 0).all()):
                metrics["rollouts/dropped_zero_adv_groups"] += 1
                metrics["rollouts/dropped_groups"] += 1
                continue
            group_samples = await self._group_samples(p)
            metrics["rollouts/dropped_groups"] += not group_samples
            samples.extend(group_samples)
        return samples, metrics

    async def _group_samples(self, p: _Pending) -> list[TrainSample]:
        algorithm, kind = p.algorithm, p.algorithm.type
        if kind == "sft":
            return self._sft_samples(p)
        env_weights = algorithm.echo_role_weights.model_dump() if kind == "echo" else None
        per_rollout = [rollout_to_samples(r, float(a), env_weights=env_weights) for r, a in zip(p.rollouts, p.advantages.tolist())]
        samples = [s for group in per_rollout for s in group]
        if kind == "opd":
            teacher = await self.prompt_logprobs(algorithm.teacher, [s.input_ids for s in samples])
            return [_distill(s, t) for s, t in zip(samples, teacher)]
        if kind == "opsd":
            return await self._opsd_samples(p, per_rollout)
        return samples

    def _demonstration_ids(self, p: _Pending, prompt_messages: list[dict], prompt_ids: list[int]) -> tuple[list[int], list[int]]:
        """(prompt part, demonstration part) of the prompt rendered with the demonstration as the assistant reply."""
        demo = p.group.example.get(p.algorithm.demo_key)
        if demo is None:
            raise KeyError(f"task {p.task!r}: {p.algorithm.type} needs the dataset key {p.algorithm.demo_key!r} (algorithm.demo_key)")
        full = self.renderers[p.task].render_ids([*prompt_messages, {"role": "assistant", "content": str(demo)}])
        common = next((i for i, (a, b) in enumerate(zip(full, prompt_ids)) if a != b), min(len(full), len(prompt_ids)))
        return list(full[:common]), list(full[common:])

    def _sft_samples(self, p: _Pending) -> list[TrainSample]:
        """Cross-entropy on a frozen sampler's completions, or on the row's demonstration after the prompt."""
        if p.algorithm.sampler != POLICY:
            samples = [s for r in p.rollouts for s in rollout_to_samples(r, 0.0)]
            return [_ce_only(s) for s in samples]
        first = p.rollouts[0].turns[0]
        prefix, demo = self._demonstration_ids(p, first.prompt_messages, first.prompt_token_ids)
        ids = prefix + demo
        return [TrainSample(ids, [False] * len(ids), [0.0] * len(ids), 0.0, 0, ce_weights=[0.0] * len(prefix) + [1.0] * len(demo))]

    async def _opsd_samples(self, p: _Pending, per_rollout: list[list[TrainSample]]) -> list[TrainSample]:
        """The live policy, shown the demonstration in the prompt, scores each sampled token (its teacher)."""
        demo = p.group.example.get(p.algorithm.demo_key)
        if demo is None:
            raise KeyError(f"task {p.task!r}: opsd needs the dataset key {p.algorithm.demo_key!r} (algorithm.demo_key)")
        out: list[TrainSample] = []
        for rollout, samples in zip(p.rollouts, per_rollout):
            if not samples:
                continue
            first = rollout.turns[0]
            messages = [dict(m) for m in first.prompt_messages]
            last_user = max(i for i, m in enumerate(messages) if m.get("role") == "user")
            messages[last_user]["content"] = f"{messages[last_user]['content']}\n\nA correct answer, for reference: {demo}"
            demo_prompt = self.renderers[p.task].render_ids(messages, add_generation_prompt=True)
            sample = samples[0]  # the demonstration conditions the first prompt; later re-rendered samples are dropped
            cut = len(first.prompt_token_ids)
            [teacher] = await self.prompt_logprobs(POLICY, [list(demo_prompt) + sample.input_ids[cut:]])
            aligned = [0.0] * cut + teacher[len(demo_prompt) :]
            out.append(_distill(sample, aligned))
        return out


def _distill(sample: TrainSample, teacher_logprobs: list[float]) -> TrainSample:
    """The sample retargeted to the ref_kl component: its sampled tokens pulled towards the teacher."""
    return TrainSample(
        sample.input_ids, sample.loss_mask, sample.sampling_logprobs, 0.0, sample.policy_version,
        rl_weights=[0.0] * len(sample.input_ids), ref_kl_weights=[float(m) for m in sample.loss_mask],
        ref_logprobs=list(teacher_logprobs),
    )


def _ce_only(sample: TrainSample) -> TrainSample:
    return TrainSample(
        sample.input_ids, [False] * len(sample.input_ids), [0.0] * len(sample.input_ids), 0.0, sample.policy_version,
        ce_weights=[float(m) for m in sample.loss_mask],
    )
