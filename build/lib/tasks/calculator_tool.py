"""Arithmetic a small model cannot do in its head, with a calculator tool it calls through the
renderer's tool-call format; the sandbox runs the tool and the result comes back as a tool message."""

from __future__ import annotations

import random
from typing import Any

from env_types.message_env import ResetOutput, StepOutput
from rollouts.types import Message, Rollout
from rubrics.builtins import numeric_match
from rubrics.rubric import RewardFn, Rubric
from tasks.task import Split, Task
from tools.sandbox import SandboxLimits
from tools.tool import Tool, ToolEnv

CALCULATOR = Tool(
    name="calculator",
    description="Evaluate an arithmetic expression with + - * / // % ** and parentheses; returns its value.",
    fn="tools.calculator:calculate",
    parameters={
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "e.g. (12 + 7) * 3"}},
        "required": ["expression"],
    },
)
PROMPT = "Compute {expression}. Use the calculator tool, then reply with just the final number."


def used_calculator(rollout: Rollout, example: dict[str, Any]) -> float:
    """1 when some turn called the calculator and it returned a value (not an error), else 0."""
    for turn in rollout.turns:
        calls = (turn.assistant_message or {}).get("tool_calls") or []
        failed = {error.tool for error in turn.tool_call_errors}
        if any(call["function"]["name"] == "calculator" and "calculator" not in failed for call in calls):
            return 1.0
    return 0.0


class CalculatorEnv(ToolEnv):
    def __init__(self, expression: str, limits: SandboxLimits, isolate: bool):
        super().__init__([CALCULATOR], limits=limits, isolate=isolate)
        self.expression = expression

    async def reset(self) -> ResetOutput:
        return ResetOutput(
            messages=[{"role": "user", "content": PROMPT.format(expression=self.expression)}], tools=self.tool_specs()
        )

    async def answer(self, assistant_message: Message) -> StepOutput:
        return StepOutput(done=True)


def make_expression(rng: random.Random) -> tuple[str, int]:
    a, b, c = rng.randint(100, 9999), rng.randint(11, 999), rng.randint(10, 9999)
    op = rng.choice(["+", "-"])
    expression = f"{a} * {b} {op} {c}"
    return expression, a * b + c if op == "+" else a * b - c


class CalculatorToolTask(Task):
    """Seeded `a * b +/- c` problems with 3-4 digit numbers; disjoint held-out split.

    `tool_use_weight` adds `used_calculator` to the rubric (0 = correctness only).
    """

    row_fields = ("expression", "answer")

    def __init__(
        self,
        num_train: int = 2000,
        num_validation: int = 64,
        seed: int = 0,
        tool_use_weight: float = 0.0,
        timeout_s: float = 5.0,
        memory_mb: int = 256,
        isolate: bool = True,
    ):
        rng = random.Random(seed)
        rows: dict[str, int] = {}
        while len(rows) < num_train + num_validation:
            expression, answer = make_expression(rng)
            rows.setdefault(expression, answer)
        ordered = [{"expression": expression, "answer": answer} for expression, answer in rows.items()]
        self.splits = {"validation": ordered[:num_validation], "train": ordered[num_validation:]}
        self.tool_use_weight = tool_use_weight
        self.limits = SandboxLimits(timeout_s=timeout_s, cpu_s=max(1, int(timeout_s)), memory_mb=memory_mb)
        self.isolate = isolate

    def load_dataset(self, split: Split) -> list[dict[str, Any]]:
        return [dict(row) for row in self.splits[split]]

    def target(self, example: dict[str, Any]) -> str | None:
        """The value of the expression."""
        return str(example["answer"])

    def make_env(self, example: dict[str, Any]) -> ToolEnv:
        return CalculatorEnv(example["expression"], self.limits, self.isolate)

    def build_rubric(self) -> Rubric:
        reward_fns = [RewardFn(numeric_match, weight=1.0)]
        if self.tool_use_weight > 0:
            reward_fns.append(RewardFn(used_calculator, weight=self.tool_use_weight))
        return Rubric(reward_fns, truncation_reward=None, error_reward=0.0)
