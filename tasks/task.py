"""A Task bundles what travels together in RL: data, environment, rubric.

The framework reads rows from `load_dataset`, tags each with the task's name, builds one
environment per sample with `make_env` (the default rollout, `rollouts.fanout.task_rollout`),
and scores the finished group with the rubric.
A user's task is any `Task` subclass importable by path; its constructor receives the
`args` table of the task's config entry as keyword arguments.
"""

from __future__ import annotations

import abc
from typing import Any, Literal

from env_types.message_env import MessageEnv
from rubrics.rubric import Rubric

Split = Literal["train", "validation"]


class Task(abc.ABC):
    """Dataset + environment factory + rubric of one kind of problem."""

    @abc.abstractmethod
    def load_dataset(self, split: Split) -> list[dict[str, Any]]:
        """Rows of a split, in a deterministic order; each row is a JSON-able dict."""

    @abc.abstractmethod
    def make_env(self, example: dict[str, Any]) -> MessageEnv:
        """A fresh environment for one rollout of `example`."""

    @abc.abstractmethod
    def build_rubric(self) -> Rubric:
        """The task's default rubric; a config can replace it."""
