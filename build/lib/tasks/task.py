"""A Task bundles what travels together in RL: data, environment, rubric.

The framework reads rows from `load_dataset` (or from files named in config), tags each with
the task's name, builds one environment per sample with `make_env` (the default rollout,
`rollouts.fanout.task_rollout`), and scores the finished group with `score_group` -- by default
the task's rubric.
A user's task is any `Task` subclass importable by path; its constructor receives the
`args` table of the task's config entry as keyword arguments.
"""

from __future__ import annotations

import abc
from typing import Any, Literal

from env_types.message_env import MessageEnv
from rollouts.fanout import RolloutFn, task_rollout
from rollouts.types import Rollout
from rubrics.rubric import Reward, Rubric

Split = Literal["train", "validation"]


class Task(abc.ABC):
    """Dataset + environment factory + rubric of one kind of problem.

    `rubric` is set when the task is built from config: the config's `rubric` table if given,
    else `build_rubric()`.
    """

    rubric: Rubric
    row_fields: tuple[str, ...] = ()
    """Fields `make_env` and the rubric read from a row; rows loaded from files must have them."""

    @abc.abstractmethod
    def load_dataset(self, split: Split) -> list[dict[str, Any]]:
        """Rows of a split, in a deterministic order; each row is a JSON-able dict."""

    @abc.abstractmethod
    def make_env(self, example: dict[str, Any]) -> MessageEnv:
        """A fresh environment for one rollout of `example`."""

    @abc.abstractmethod
    def build_rubric(self) -> Rubric:
        """The task's default rubric; a config can replace it."""

    def rollout_fn(self) -> RolloutFn:
        """How one sample of a row is played: by default the task's environment (`rollouts.fanout.task_rollout`);
        a task whose rollouts are something else (an agent through the gateway, `tasks.agent`) returns its own.
        A config's `rollout_fn` takes precedence."""
        return task_rollout

    def target(self, example: dict[str, Any]) -> str | None:
        """The reference answer of a row as text, shown next to samples in logs; None if the task has none."""
        return None

    async def score_group(self, rollouts: list[Rollout], example: dict[str, Any]) -> list[Reward]:
        """One `Reward` per rollout of a finished group, in order: the one place scoring goes through.

        The default asks the rubric; override to score with the environment's state, a sandbox
        the rollouts share, or anything else that needs the whole task.
        """
        return await self.rubric.score_group(rollouts, example)
