r"""Arithmetic word problems over several turns: a wrong or missing `\boxed{}` answer gets "try again".

The environment checks each answer with `math-verify` and asks again, up to `max_tries` turns;
each turn's reward (1 right, 0 wrong) is recorded on the turn. The rubric grades the last
answer with `math-verify`, optionally with a `retry_penalty` for the extra turns used.
"""

from __future__ import annotations

import asyncio
import functools
import random
from typing import Any

from env_types.message_env import MessageEnv, ResetOutput, StepOutput
from rollouts.types import Message, Rollout
from rubrics.builtins import last_boxed, math_verify, numbers_equal, verified_equal
from rubrics.rubric import RewardFn, Rubric
from tasks.task import Split, Task

INSTRUCTION = "Solve the problem. Put your final answer in \\boxed{}."
RETRY = "That is not correct. Try again and put your final answer in \\boxed{}."
NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivo", "Jun")
ITEMS = ("apples", "books", "coins", "stamps", "marbles", "pencils")


def make_problem(rng: random.Random) -> dict[str, Any]:
    """One seeded word problem with an integer answer."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(2, 60), rng.randint(2, 40)
    kind = rng.choice(["add", "sub", "mul", "two_step"])
    if kind == "add":
        return {
            "question": f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?",
            "answer": str(a + b),
        }
    if kind == "sub":
        a += b
        return {
            "question": f"{name} has {a} {item} and gives away {b}. How many {item} are left?",
            "answer": str(a - b),
        }
    if kind == "mul":
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        return {
            "question": f"{name} has {a} boxes with {b} {item} in each. How many {item} is that in total?",
            "answer": str(a * b),
        }
    c = rng.randint(1, 9)
    return {
        "question": f"{name} buys {a} {item}, then {b} more, then loses {c}. How many {item} does {name} have?",
        "answer": str(a + b - c),
    }


def is_correct(text: str, answer: str) -> bool:
    r"""Whether a reply's last `\boxed{}` answer equals the reference: by math-verify, else by its number (the
    numeric fallback of `rubrics.builtins.math_verify`)."""
    boxed = last_boxed(text)
    if boxed is None:
        return False
    found = f"\\boxed{{{boxed}}}"
    return verified_equal(found, answer) or numbers_equal(found, answer)


def retry_penalty(rollout: Rollout, example: dict[str, Any], *, max_tries: int) -> float:
    """-(turns used - 1) / (max_tries - 1): 0 when answered on the first turn, -1 when every try was used."""
    return -max(0, len(rollout.turns) - 1) / max(1, max_tries - 1)


class ArithmeticRetryEnv(MessageEnv):
    def __init__(self, question: str, answer: str, max_tries: int):
        self.question, self.answer, self.max_tries = question, answer, max_tries
        self.tries = 0

    async def reset(self) -> ResetOutput:
        return ResetOutput(messages=[{"role": "user", "content": f"{self.question}\n{INSTRUCTION}"}])

    async def step(self, assistant_message: Message) -> StepOutput:
        self.tries += 1
        correct = await asyncio.to_thread(is_correct, assistant_message.get("content") or "", self.answer)
        if correct or self.tries >= self.max_tries:
            return StepOutput(done=True, reward=float(correct))
        return StepOutput(messages=[{"role": "user", "content": RETRY}], done=False, reward=0.0)


class ArithmeticRetryTask(Task):
    """Seeded word problems (or rows `{question, answer}` from a file); the retry budget is `max_tries` turns."""

    row_fields = ("question", "answer")

    def __init__(
        self,
        num_train: int = 2000,
        num_validation: int = 64,
        max_tries: int = 3,
        retry_penalty: float = 0.0,
        seed: int = 0,
    ):
        if max_tries < 1:
            raise ValueError(f"max_tries must be >= 1, got {max_tries}")
        rng = random.Random(seed)
        problems: dict[str, dict[str, Any]] = {}
        while len(problems) < num_train + num_validation:
            problem = make_problem(rng)
            problems.setdefault(problem["question"], problem)
        ordered = list(problems.values())
        self.splits = {"validation": ordered[:num_validation], "train": ordered[num_validation:]}
        self.max_tries = max_tries
        self.retry_penalty = retry_penalty

    def load_dataset(self, split: Split) -> list[dict[str, Any]]:
        return [dict(row) for row in self.splits[split]]

    def target(self, example: dict[str, Any]) -> str | None:
        """The number the story asks for."""
        return str(example["answer"])

    def make_env(self, example: dict[str, Any]) -> MessageEnv:
        return ArithmeticRetryEnv(example["question"], str(example["answer"]), self.max_tries)

    def build_rubric(self) -> Rubric:
        reward_fns = [RewardFn(math_verify, weight=1.0)]
        if self.retry_penalty > 0:
            penalty = functools.partial(retry_penalty, max_tries=self.max_tries)
            reward_fns.append(RewardFn(penalty, weight=self.retry_penalty))
        return Rubric(reward_fns, truncation_reward=None, error_reward=0.0)
