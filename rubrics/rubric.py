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
import threading
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
    """Set when a reward function raised, returned a non-number or timed out."""
    timed_out: bool = False


class RewardFunctionError(Exception):
    """A reward function raised, timed out, or returned something that is not a finite number."""

    def __init__(self, message: str, *, timed_out: bool = False):
        super().__init__(message)
        self.timed_out = timed_out


class Rubric:
    """Weighted reward functions plus short-circuit rewards for rollouts that did not finish.

    `truncation_reward`: reward of TRUNCATED / PROMPT_OVERFLOW rollouts without running the
    functions; None scores their partial response. `error_reward`: reward of ERROR / TIMEOUT /
    ABORTED rollouts and of rollouts whose reward function failed. `timeout_s`: longest one
    reward function may take on one rollout.
    """

    def __init__(
        self,
        reward_fns: list[RewardFn],
        *,
        truncation_reward: float | None = None,
        error_reward: float = 0.0,
        timeout_s: float = 60.0,
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
        self.timeout_s = timeout_s

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
            return Reward(total=self.error_reward, error=str(exc), timed_out=exc.timed_out)
        components = {reward_fn.key: value for reward_fn, value in zip(self.reward_fns, values)}
        total = sum(self.weights[key] * value for key, value in components.items())
        return Reward(total=total, components=components)

    async def _call(self, reward_fn: RewardFn, rollout: Rollout, example: dict[str, Any]) -> float:
        try:
            value = await asyncio.wait_for(_call_off_loop(reward_fn.fn, rollout, example), self.timeout_s)
        except asyncio.TimeoutError:
            raise RewardFunctionError(
                f"reward function {reward_fn.key!r} took longer than {self.timeout_s} s", timed_out=True
            ) from None
        except Exception as exc:
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            raise RewardFunctionError(f"reward function {reward_fn.key!r} raised: {detail}") from exc
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise RewardFunctionError(f"reward function {reward_fn.key!r} returned {value!r}, not a finite number")
        return float(value)


def _settle(future: asyncio.Future, value: Any, exc: BaseException | None) -> None:
    """Complete a future from a worker thread's result, unless a timeout already cancelled it."""
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(value)


async def _call_off_loop(fn: RewardFnType, rollout: Rollout, example: dict[str, Any]) -> Any:
    """Await an async reward function; run a sync one in a daemon thread.

    A sync function that blocks (a slow check, a hang) then neither stalls the other groups nor,
    being a daemon, keeps the process alive after its timeout.
    """
    if inspect.iscoroutinefunction(fn):
        return await fn(rollout, example)
    loop = asyncio.get_running_loop()
    result: asyncio.Future = loop.create_future()

    def run() -> None:
        try:
            value = fn(rollout, example)
        except BaseException as exc:
            loop.call_soon_threadsafe(_settle, result, None, exc)
        else:
            loop.call_soon_threadsafe(_settle, result, value, None)

    threading.Thread(target=run, name=f"reward:{getattr(fn, '__name__', 'fn')}", daemon=True).start()
    value = await result
    return await value if inspect.isawaitable(value) else value


def apply_reward(rollout: Rollout, reward: Reward) -> None:
    """Write a reward into its rollout; a failed reward function turns it into ERROR (TIMEOUT if it hung)."""
    rollout.reward = reward.total
    rollout.reward_components = dict(reward.components)
    if reward.error is not None and rollout.status.is_trainable():
        rollout.status = RolloutStatus.TIMEOUT if reward.timed_out else RolloutStatus.ERROR
        rollout.error = reward.error
