"""Distillation algorithms: no reward credit; the policy learns by cross-entropy (sft) or reverse KL (opd, opsd)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from env_types.renderer import render_prompt
from rl.algorithms.base import Algorithm
from rl.algorithms.streams import ce_only, distill, rollout_to_samples, sample_first_turns
from rl.config.algorithm import POLICY, AlgorithmConfig
from rl.packing.rows import TrainSample
from rollouts.types import Rollout, RolloutGroup, RolloutStatus, RolloutTurn

if TYPE_CHECKING:
    from rollouts.fanout import RolloutContext

DATASET = "dataset"
"""The `sampler` mark of a demonstration rollout: written from the dataset, it never goes stale."""


class SFT(Algorithm):
    """Cross-entropy on a frozen sampler's completions, or on the row's demonstration (`demo_key`) after its prompt.

    With the policy as sampler nothing is generated: each row becomes one demonstration rollout, rendered
    from the task's first prompt and the demonstration as the assistant's reply.
    """

    trains_rl = False

    def rollouts_per_row(self, group_size: int) -> int:
        return 1 if self.config.sampler == POLICY else group_size

    def rollout_fn(self) -> Any:
        return self.demonstration_rollout if self.config.sampler == POLICY else None

    async def demonstration_rollout(self, row: dict[str, Any], context: RolloutContext) -> Rollout:
        """The row's demonstration as a one-turn rollout; its tokens carry logprob 0 and were not sampled."""
        demo = row.get(self.config.demo_key)
        if demo is None:
            raise KeyError(
                f"task {self.task!r}: sft needs the dataset key {self.config.demo_key!r} (algorithm.demo_key)"
            )
        env = context.task.make_env(row)
        timeout = context.env_config.env_timeout_s
        reset = await asyncio.wait_for(env.reset(), timeout)
        await asyncio.wait_for(env.close(), timeout)
        prompt_ids = render_prompt(context.renderer, list(reset.messages), tools=reset.tools)
        reply = {"role": "assistant", "content": str(demo)}
        full = list(context.renderer.render_ids([*reset.messages, reply], tools=reset.tools))
        common = next((i for i, (a, b) in enumerate(zip(full, prompt_ids)) if a != b), min(len(full), len(prompt_ids)))
        rollout = context.new_rollout()
        rollout.turns.append(
            RolloutTurn(
                prompt_messages=list(reset.messages),
                prompt_token_ids=full[:common],
                completion_token_ids=full[common:],
                completion_logprobs=[0.0] * (len(full) - common),
                assistant_message=reply,
                finish_reason="stop",
            )
        )
        rollout.status = rollout.status.transition(RolloutStatus.COMPLETED)
        rollout.metadata["sampler"] = DATASET
        return rollout

    async def samples(self, group: RolloutGroup, rollouts: list[Rollout]) -> list[TrainSample]:
        return [ce_only(sample) for rollout in rollouts for sample in rollout_to_samples(rollout, 0.0)]


class OPD(Algorithm):
    """On-policy distillation: the policy's sampled tokens pulled towards a frozen `teacher` by reverse KL."""

    trains_rl = False

    @classmethod
    def check(cls, config: AlgorithmConfig, where: str, group_size: int) -> None:
        super().check(config, where, group_size)
        if config.teacher is None:
            raise ValueError(f"{where}.type = 'opd' needs {where}.teacher = '<a [models.<name>]>'")
        if config.teacher == POLICY:
            raise ValueError(f"{where}.teacher = 'policy' with type 'opd': the KL of the policy to itself is 0")

    async def samples(self, group: RolloutGroup, rollouts: list[Rollout]) -> list[TrainSample]:
        samples = [sample for rollout in rollouts for sample in rollout_to_samples(rollout, 0.0)]
        teacher = await self.prompt_logprobs(self.config.teacher, [sample.input_ids for sample in samples])
        return [distill(sample, logprobs) for sample, logprobs in zip(samples, teacher)]


class OPSD(Algorithm):
    """On-policy self-distillation: the teacher is the live policy shown the demonstration in the prompt."""

    trains_rl = False

    @classmethod
    def check(cls, config: AlgorithmConfig, where: str, group_size: int) -> None:
        super().check(config, where, group_size)
        if config.teacher is not None:
            raise ValueError(
                f"{where}.teacher = {config.teacher!r} with type 'opsd': its teacher is the live policy shown the "
                f"demonstration ({where}.demo_key); remove teacher, or use type 'opd' for a frozen teacher"
            )

    async def samples(self, group: RolloutGroup, rollouts: list[Rollout]) -> list[TrainSample]:
        """The live policy, shown the demonstration in the first prompt, scores each sampled token: every sample of a
        rollout, a later one (a re-rendered prompt) from its own first prompt with the same demonstration."""
        demo = group.example.get(self.config.demo_key)
        if demo is None:
            raise KeyError(
                f"task {self.task!r}: opsd needs the dataset key {self.config.demo_key!r} (algorithm.demo_key)"
            )
        samples: list[tuple[TrainSample, int, int]] = []  # (sample, its own prompt's length, the demo prompt's)
        teacher_inputs: list[list[int]] = []
        for rollout in rollouts:
            if not rollout.turns:
                continue
            last_user = max(i for i, m in enumerate(rollout.turns[0].prompt_messages) if m.get("role") == "user")
            for sample, turn in zip(rollout_to_samples(rollout, 0.0), sample_first_turns(rollout), strict=True):
                messages = [dict(m) for m in turn.prompt_messages]
                messages[last_user]["content"] = (
                    f"{messages[last_user]['content']}\n\nA correct answer, for reference: {demo}"
                )
                demo_prompt = list(self.renderer.render_ids(messages, add_generation_prompt=True))
                cut = len(turn.prompt_token_ids)
                samples.append((sample, cut, len(demo_prompt)))
                teacher_inputs.append(demo_prompt + sample.input_ids[cut:])
        teacher = await self.prompt_logprobs(POLICY, teacher_inputs) if teacher_inputs else []
        return [
            distill(sample, [0.0] * cut + logprobs[demo_len:])
            for (sample, cut, demo_len), logprobs in zip(samples, teacher, strict=True)
        ]
