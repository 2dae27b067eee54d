"""Scoring a finished group of rollouts with weighted reward functions.

A reward function takes `(rollout, example)` and returns a number, sync or async (a judge
model call, a sandboxed test run). A group reward function takes `(rollouts, example)` -- the
whole group -- and returns one number per rollout (ranks, pairwise preferences, a diversity
bonus). The rubric runs all functions of all rollouts of a group concurrently, combines them
as a weighted mean (weights normalized to sum to 1), and never lets one failing function take the group down:
that rollout gets the rubric's `error_reward` and the exception text, the others are scored
normally (a failing group function fails every rollout it was to score). Sync functions run in
worker processes (`rubrics.workers`), so one that spins past `timeout_s` is killed there (the
rollout becomes TIMEOUT) instead of freezing the scoring process's event loop; each call's `random`
(and numpy's global RNG) is seeded from the run's seed and the rollout's id (`call_seed`).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import pickle
import threading
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rl.components import fn_name
from rl.console import warn
from rollouts.reward_value import MAX_ABS_REWARD, InvalidReward, checked_reward
from rollouts.types import Rollout, RolloutStatus
from rubrics import workers

RewardFnType = Callable[[Rollout, dict[str, Any]], "float | Awaitable[float]"]
GroupRewardFnType = Callable[[list[Rollout], dict[str, Any]], "list[float] | Awaitable[list[float]]"]


def best_value(value: float) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare the largest value a reward function can return (`@best_value(1.0)`): with it for every function a
    rubric can say the largest reward it gives (`Rubric.best_total`), which `rlmesh validate` compares with
    `run.eval_pass_threshold`."""

    def declare(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn.best_value = value
        return fn

    return declare


@dataclass(frozen=True)
class RewardFn:
    """A reward function and its (unnormalized) weight.

    `group=True`: `fn(rollouts, example)` sees the whole group (every rollout, whatever its
    status) and returns one number per rollout; only the numbers of rollouts being graded are used.
    """

    fn: RewardFnType | GroupRewardFnType
    weight: float = 1.0
    name: str = ""
    group: bool = False

    @property
    def key(self) -> str:
        return self.name or fn_name(self.fn)


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
    ABORTED rollouts without running the functions; None grades the turns they kept. It is also
    the reward of a rollout whose reward function failed, and of a PROMPT_OVERFLOW rollout when
    `truncation_reward` is None (0.0 for both when `error_reward` is None too). `timeout_s`:
    longest one reward function may take on one rollout (a group function: on the group).
    `max_abs_reward`: bound on what a function may return (`rollouts.reward_value`); anything
    else (NaN, 1e39, a string) fails that rollout with an error naming the function.
    """

    def __init__(
        self,
        reward_fns: list[RewardFn],
        *,
        truncation_reward: float | None = None,
        error_reward: float | None = 0.0,
        timeout_s: float = 60.0,
        max_abs_reward: float = MAX_ABS_REWARD,
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
        self.max_abs_reward = max_abs_reward
        self.seed = 0
        """The run's seed (`run.seed`, set by the RewardActor): with each rollout's id it seeds the RNG of every call of
        a sync reward function in its worker process (`call_seed`), so what the function draws is the same in a
        resumed or recovered run, whichever worker serves the call."""

    def best_total(self) -> float | None:
        """The largest reward the rubric gives (its weighted mean of each function's declared `best_value`), None when
        a function declares none."""
        best = [getattr(getattr(f.fn, "func", f.fn), "best_value", None) for f in self.reward_fns]  # partials too
        if None in best:
            return None
        return sum(self.weights[f.key] * value for f, value in zip(self.reward_fns, best))

    @property
    def _fallback_reward(self) -> float:
        return self.error_reward if self.error_reward is not None else 0.0

    def short_circuit(self, rollout: Rollout) -> Reward | None:
        """The reward of a rollout that is not graded by the functions, None if it is graded."""
        if rollout.status in (RolloutStatus.ERROR, RolloutStatus.TIMEOUT, RolloutStatus.ABORTED):
            return Reward(total=self.error_reward, error=rollout.error) if self.error_reward is not None else None
        if (
            rollout.status in (RolloutStatus.TRUNCATED, RolloutStatus.PROMPT_OVERFLOW)
            and self.truncation_reward is not None
        ):
            return Reward(total=self.truncation_reward)
        if rollout.status is RolloutStatus.PROMPT_OVERFLOW:
            return Reward(total=self._fallback_reward)
        return None

    async def score_group(self, rollouts: list[Rollout], example: dict[str, Any]) -> list[Reward]:
        """One `Reward` per rollout, in order; all functions of the group run concurrently."""
        fixed = [self.short_circuit(rollout) for rollout in rollouts]
        graded = [index for index, reward in enumerate(fixed) if reward is None]
        group_fns = [reward_fn for reward_fn in self.reward_fns if reward_fn.group and graded]
        group_values, *per_rollout = await asyncio.gather(
            asyncio.gather(*(self._call_group(reward_fn, rollouts, example) for reward_fn in group_fns)),
            *(self._score_components(rollouts[index], example) for index in graded),
        )
        rewards = list(fixed)
        for index, components in zip(graded, per_rollout):
            if isinstance(components, RewardFunctionError):
                rewards[index] = self._failed(components)
                continue
            for reward_fn, values in zip(group_fns, group_values):
                if isinstance(values, RewardFunctionError):
                    rewards[index] = self._failed(values)
                    break
                components[reward_fn.key] = values[index]
            else:
                ordered = {reward_fn.key: components[reward_fn.key] for reward_fn in self.reward_fns}
                total = sum(self.weights[key] * value for key, value in ordered.items())
                rewards[index] = Reward(total=total, components=ordered)
        return rewards

    async def score_one(self, rollout: Rollout, example: dict[str, Any]) -> Reward:
        """A single rollout's reward (group functions see a group of one)."""
        [reward] = await self.score_group([rollout], example)
        return reward

    def _failed(self, exc: RewardFunctionError) -> Reward:
        return Reward(total=self._fallback_reward, error=str(exc), timed_out=exc.timed_out)

    async def _score_components(
        self, rollout: Rollout, example: dict[str, Any]
    ) -> dict[str, float] | RewardFunctionError:
        fns = [reward_fn for reward_fn in self.reward_fns if not reward_fn.group]
        try:
            values = await asyncio.gather(*(self._call(reward_fn, rollout, example) for reward_fn in fns))
        except RewardFunctionError as exc:
            return exc
        return {reward_fn.key: value for reward_fn, value in zip(fns, values)}

    async def _call(self, reward_fn: RewardFn, rollout: Rollout, example: dict[str, Any]) -> float:
        value = await self._guarded(reward_fn, rollout, example)
        return self._checked(reward_fn, value)

    async def _call_group(
        self, reward_fn: RewardFn, rollouts: list[Rollout], example: dict[str, Any]
    ) -> list[float] | RewardFunctionError:
        """One number per rollout of the group, or the failure every graded rollout then gets."""
        try:
            values = await self._guarded(reward_fn, rollouts, example)
            if not isinstance(values, (list, tuple)) or len(values) != len(rollouts):
                raise RewardFunctionError(
                    f"group reward function {reward_fn.key!r} returned {values!r}, not a list of {len(rollouts)} numbers"
                )
            return [self._checked(reward_fn, value) for value in values]
        except RewardFunctionError as exc:
            return exc

    def _checked(self, reward_fn: RewardFn, value: Any) -> float:
        try:
            return checked_reward(value, f"reward function {reward_fn.key!r}", self.max_abs_reward)
        except InvalidReward as exc:
            raise RewardFunctionError(str(exc)) from None

    async def _guarded(self, reward_fn: RewardFn, *args: Any) -> Any:
        try:
            if not _is_async(reward_fn.fn):
                try:
                    seed = call_seed(self.seed, args[0], reward_fn.key)
                    return await workers.pool().call(reward_fn.fn, args, self.timeout_s, seed)
                except (pickle.PicklingError, TypeError, AttributeError) as exc:
                    _warn_thread_fallback(reward_fn.key, exc)
            return await asyncio.wait_for(_call_off_loop(reward_fn.fn, *args), self.timeout_s)
        except (TimeoutError, workers.WorkerTimeout):
            raise RewardFunctionError(
                f"reward function {reward_fn.key!r} took longer than {self.timeout_s} s", timed_out=True
            ) from None
        except workers.FunctionRaised as exc:
            raise RewardFunctionError(f"reward function {reward_fn.key!r} raised: {exc}") from None
        except Exception as exc:
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            raise RewardFunctionError(f"reward function {reward_fn.key!r} raised: {detail}") from exc


def call_seed(run_seed: int, scored: Rollout | list[Rollout], key: str) -> int:
    """The RNG seed of one sync reward call: a stable hash of the run's seed, the rollout's id (a group function's:
    the group's id) and the function's name; 64 bits."""
    scope = scored.rollout_id if isinstance(scored, Rollout) else scored[0].group_id if scored else ""
    return int.from_bytes(hashlib.sha256(f"{run_seed}/{scope}/{key}".encode()).digest()[:8], "little")


def _settle(future: asyncio.Future, value: Any, exc: BaseException | None) -> None:
    """Complete a future from a worker thread's result, unless a timeout already cancelled it."""
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(value)


def _is_async(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004 (a callable object's async __call__)


_WARNED: set[str] = set()


def _warn_thread_fallback(key: str, exc: BaseException) -> None:
    if key in _WARNED:
        return
    _WARNED.add(key)
    warn(
        f"reward function {key!r} cannot be sent to a worker process ({exc}); it runs in a thread, where a call "
        "past its deadline cannot be stopped and holds the event loop while it holds the GIL"
    )


async def _call_off_loop(fn: Callable[..., Any], *args: Any) -> Any:
    """Await an async reward function; run a sync one that cannot go to a worker process in a daemon thread.

    Such a function that blocks (a slow check, a hang) then does not stall the other groups unless it
    holds the GIL, and, being a daemon, does not keep the process alive after its timeout.
    """
    if _is_async(fn):
        return await fn(*args)
    loop = asyncio.get_running_loop()
    result: asyncio.Future = loop.create_future()

    def run() -> None:
        try:
            value = fn(*args)
        except BaseException as exc:
            loop.call_soon_threadsafe(_settle, result, None, exc)
        else:
            loop.call_soon_threadsafe(_settle, result, value, None)

    threading.Thread(target=run, name=f"reward:{fn_name(fn)}", daemon=True).start()
    value = await result
    return await value if inspect.isawaitable(value) else value


def apply_reward(rollout: Rollout, reward: Reward) -> None:
    """Write a reward into its rollout; a failed reward function turns it into ERROR (TIMEOUT if it hung)."""
    rollout.reward = reward.total
    rollout.reward_components = dict(reward.components)
    if reward.error is not None and rollout.status.is_trainable():
        rollout.status = RolloutStatus.TIMEOUT if reward.timed_out else RolloutStatus.ERROR
        rollout.error = reward.error
