"""A local verifiers (v1) environment for the verifiers-adapter tests: single-turn additions over an in-memory
dataset, scored by the task's own `@vf.reward` (the reply's last integer against the sum). No network."""

import re

import verifiers.v1 as vf


class QuizData(vf.TaskData):
    """One addition and its answer."""

    answer: int
    broken_rubric: bool = False


class QuizTask(vf.Task[QuizData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        """1 when the reply's last integer is the sum."""
        if self.data.broken_rubric:
            raise ValueError("the quiz rubric is broken on purpose")
        numbers = re.findall(r"-?\d+", trace.last_reply)
        return float(bool(numbers) and int(numbers[-1]) == self.data.answer)


class QuizConfig(vf.TasksetConfig):
    num_tasks: int = 12
    """How many additions (a + b, a in 1..4, b in 3..5, in order)."""
    broken_rubric: bool = False
    """Every task's reward raises (a rubric that fails)."""


class QuizTaskset(vf.Taskset[QuizTask, QuizConfig]):
    def load(self) -> list[QuizTask]:
        pairs = [(a, b) for a in range(1, 5) for b in range(3, 6)][: self.config.num_tasks]
        return [
            QuizTask(
                QuizData(
                    prompt=f"What is {a} + {b}? Answer with just the number.",
                    answer=a + b,
                    broken_rubric=self.config.broken_rubric,
                ),
                self.config.task,
            )
            for a, b in pairs
        ]


__all__ = ["QuizTaskset"]
