"""Scoring a finished group of rollouts with weighted reward functions.

A reward function takes `(rollout, example)` and returns a number, sync or async (a judge
model call, a sandboxed test run). The rubric runs all functions of all rollouts of a group
concurrently, combines them with weights normalized to sum to 1, and never lets one failing
function take the group down: that rollout gets the rubric's `error_reward` and the
exception text, the others are scored normally.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import traceback
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from pydantic import BaseModel, ConfigDict, Field

from rollouts.types import Rollout, RolloutStatus

RewardFnType = Callable[[Rollout, dict[str, Any]], "float | Awaitable[float]"]


@dataclass(frozen=True)
class RewardFn:
    """A reward function and its (unnormalized) weight."""

    fn: RewardFnType
    weight: float = 1.0
    name: str = ""

    @property
    def key(self) -> str:
        return self.name or getattr(self.fn, "__name__", type(self.fn).__name__)


class Reward(BaseModel):
    """A rollout's scalar reward and the raw output of each reward function by name."""

    model_config = ConfigDict(extra="forbid")

    total: float
    components: dict[str, float] = Field(default_factory=dict)
    error: str | None = None
    """Set when a reward function raised or returned a non-number."""


class RewardFunctionError(Exception):
    """A reward function raised or returned something that is not a finite number."""


class Rubric:
    """Weighted reward functions plus short-circuit rewards for rollouts that did not finish.

    `truncation_reward`: reward of TRUNCATED / PROMPT_OVERFLOW rollouts without running the
    functions; None scores their partial response. `error_reward`: reward of ERROR / TIMEOUT /
    ABORTED rollouts and of rollouts whose reward function failed.
    """

    def __init__(
        self,
        reward_fns: list[RewardFn],
        *,
        truncation_reward: float | None = None,
        error_reward: float = 0.0,
    ):
        if not reward_fns:
            raise ValueError("a Rubric needs at least one reward function")
        keys = [reward_fn.key for reward_fn in reward_fns]
        if len(set(keys)) != len(keys):
            raise ValueError(f"reward function names must be unique, got {keys}")
        total_weight = sum(reward_fn.weight for reward_fn in reward_fns)
        if any(reward_fn.weight < 0 for reward_fn in reward_fns) or total_weight <= 0:
            raise ValueError(f"reward weights must be >= 0 with a positive sum, got {[f.weight for f in reward_fns]}")
        self.reward_fns = reward_fns
        self.weights = {reward_fn.key: reward_fn.weight / total_weight for reward_fn in reward_fns}
        self.truncation_reward = truncation_reward
        self.error_reward = error_reward

    async def score_group(self, rollouts: list[Rollout], example: dict[str, Any]) -> list[Reward]:
        """One `Reward` per rollout, in order; the group's functions run concurrently."""
        return list(await asyncio.gather(*(self.score_one(rollout, example) for rollout in rollouts)))

    async def score_one(self, rollout: Rollout, example: dict[str, Any]) -> Reward:
        if rollout.status in (RolloutStatus.ERROR, RolloutStatus.TIMEOUT, RolloutStatus.ABORTED):
            return Reward(total=self.error_reward, error=rollout.error)
        if rollout.status in (RolloutStatus.TRUNCATED, RolloutStatus.PROMPT_OVERFLOW) and self.truncation_reward is not None:
            return Reward(total=self.truncation_reward)
        if rollout.status is RolloutStatus.PROMPT_OVERFLOW:
            return Reward(total=self.error_reward)
        try:
            values = await asyncio.gather(*(self._call(reward_fn, rollout, example) for reward_fn in self.reward_fns))
        except RewardFunctionError as exc:
            return Reward(total=self.error_reward, error=str(exc))
        components = {reward_fn.key: value for reward_fn, value in zip(self.reward_fns, values)}
        total = sum(self.weights[key] * value for key, value in components.items())
        return Reward(total=total, components=components)

    @staticmethod
    async def _call(reward_fn: RewardFn, rollout: Rollout, example: dict[str, Any]) -> float:
        try:
            value = reward_fn.fn(rollout, example)
            if inspect.isawaitable(value):
                value = await value
        except Exception as exc:
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            raise RewardFunctionError(f"reward function {reward_fn.key!r} raised: {detail}") from exc
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise RewardFunctionError(f"reward function {reward_fn.key!r} returned {value!r}, not a finite number")
        return float(value)


def apply_reward(rollout: Rollout, reward: Reward) -> None:
    """Write a reward into its rollout; a failed reward function turns the rollout into ERROR."""
    rollout.reward = reward.total
    rollout.reward_components = dict(reward.components)
    if reward.error is not None and rollout.status.is_trainable():
        rollout.status = RolloutStatus.ERROR
        rollout.error = reward.error
