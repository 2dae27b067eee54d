"""Sum the digits of a number: a small task a 135M model gets partly right, with room to learn."""

from __future__ import annotations

import random
import re
from typing import Any

from env_types.message_env import MessageEnv, ResetOutput, StepOutput
from rollouts.types import Message, Rollout
from rubrics.rubric import RewardFn, Rubric, best_value
from tasks.task import Split, Task

_INTEGER = re.compile(r"-?\d+")


def parse_last_integer(text: str) -> int | None:
    """The last integer in a reply, the usual way to read a short numeric answer."""
    matches = _INTEGER.findall(text.replace(",", ""))
    return int(matches[-1]) if matches else None


@best_value(1.0)
def digit_sum_correct(rollout: Rollout, example: dict[str, Any]) -> float:
    """1 when the last integer of the reply is the digit sum, else 0."""
    return float(parse_last_integer(rollout.last_assistant_text()) == example["answer"])


@best_value(1.0)
def answer_is_number(rollout: Rollout, example: dict[str, Any]) -> float:
    """1 when the reply is just a number, as the prompt asks."""
    return float(re.fullmatch(r"\s*-?\d+\s*\.?\s*", rollout.last_assistant_text()) is not None)


class SumDigitsEnv(MessageEnv):
    """Single turn: ask for the digit sum, accept one answer."""

    def __init__(self, prompt: str, system_prompt: str | None):
        self.prompt = prompt
        self.system_prompt = system_prompt

    async def reset(self) -> ResetOutput:
        messages: list[Message] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": self.prompt})
        return ResetOutput(messages=messages)

    async def step(self, assistant_message: Message) -> StepOutput:
        return StepOutput(done=True)


class SumDigitsTask(Task):
    """Numbers with `num_digits` digits; a seeded, disjoint held-out split of `num_validation` numbers."""

    def __init__(
        self,
        num_digits: int = 2,
        num_validation: int = 32,
        seed: int = 0,
        prompt_template: str = "What is the sum of the digits of {number}? Answer with just the number.",
        system_prompt: str | None = None,
        format_weight: float = 0.0,
    ):
        if num_digits < 1:
            raise ValueError(f"num_digits must be >= 1, got {num_digits}")
        low, high = (0 if num_digits == 1 else 10 ** (num_digits - 1)), 10**num_digits
        numbers = list(range(low, high))
        if not 0 < num_validation < len(numbers):
            raise ValueError(f"num_validation must be in (0, {len(numbers)}) for {num_digits}-digit numbers")
        random.Random(seed).shuffle(numbers)
        self.validation_numbers = sorted(numbers[:num_validation])
        self.train_numbers = numbers[num_validation:]
        self.prompt_template = prompt_template
        self.system_prompt = system_prompt
        self.format_weight = format_weight

    def load_dataset(self, split: Split) -> list[dict[str, Any]]:
        numbers = self.train_numbers if split == "train" else self.validation_numbers
        return [
            {
                "number": number,
                "answer": sum(int(d) for d in str(number)),
                "prompt": self.prompt_template.format(number=number),
            }
            for number in numbers
        ]

    def target(self, example: dict[str, Any]) -> str | None:
        return str(example["answer"])

    def make_env(self, example: dict[str, Any]) -> MessageEnv:
        return SumDigitsEnv(example["prompt"], self.system_prompt)

    def build_rubric(self) -> Rubric:
        reward_fns = [RewardFn(digit_sum_correct, weight=1.0)]
        if self.format_weight > 0:
            reward_fns.append(RewardFn(answer_is_number, weight=self.format_weight))
        return Rubric(reward_fns, truncation_reward=None, error_reward=0.0)
