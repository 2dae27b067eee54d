"""The rollout contract: one trajectory per call, fanned out per row, joined by row id.

    async def rollout_fn(row: dict, context: RolloutContext) -> Rollout | None

The framework calls it `group_size` times per row, concurrently, each call with its own
`RolloutContext` (sample index, a `generate` bound to the row's generator replica, the task's
renderer and limits) and its own copy of the row. The results are joined by row id into one
`RolloutGroup` for scoring and training: `None` drops that sample, an exception becomes that
sample's ERROR record and the rest of the group goes on. `task_rollout` (the task's `MessageEnv`
driven turn by turn through a `RendererEnv`) is the default rollout_fn; a task's config can name
another by import path (`tasks.rollout_fn`).
"""

from __future__ import annotations

import asyncio
import copy
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from env_types.message_env import MessageEnv
from rl.components import fn_name
from rl.config.tasks import RendererEnvConfig
from rollouts.renderer_env import RendererEnv
from rollouts.reward_value import MAX_ABS_REWARD, InvalidReward, checked_reward
from rollouts.types import Completion, GenerationRequest, Rollout, RolloutGroup, RolloutStatus


class EnvMaker(Protocol):
    """What `task_rollout` needs of a task (`tasks.task.Task` is one): a fresh environment per row."""

    def make_env(self, example: dict[str, Any]) -> MessageEnv: ...


@dataclass
class RolloutContext:
    """What one sample's rollout needs besides its row."""

    row_id: str
    sample_index: int
    task_name: str
    task: EnvMaker
    renderer: Any
    env_config: RendererEnvConfig
    generate: Callable[[GenerationRequest], Awaitable[Completion]]
    """One completion from the row's generator replica; raises when the generator fails the request."""
    run_seed: int | None = None
    """With it, each request carries a sampling seed derived from it and the rollout id (`sampling_seed`)."""

    def new_rollout(self) -> Rollout:
        return Rollout(
            rollout_id=f"{self.row_id}/{self.sample_index}",
            group_id=self.row_id,
            task_name=self.task_name,
            sample_index=self.sample_index,
        )


RolloutFn = Callable[[dict[str, Any], RolloutContext], Awaitable["Rollout | None"]]


async def task_rollout(row: dict[str, Any], context: RolloutContext) -> Rollout:
    """The task's environment for this row, run to a terminal status."""
    rollout = context.new_rollout()
    env = RendererEnv(
        context.task.make_env(row), context.renderer, context.env_config, rollout, run_seed=context.run_seed
    )
    request = await env.start()
    while request is not None:
        try:
            completion = await context.generate(request)
        except Exception as exc:
            await env.abort(RolloutStatus.ERROR, f"generator call failed: {exc!r}")
            break
        request = await env.step(completion)
    return rollout


async def run_sample(rollout_fn: RolloutFn, row: dict[str, Any], context: RolloutContext) -> Rollout | None:
    """One call of `rollout_fn`; what it raises or returns malformed becomes an ERROR record."""
    try:
        result = await rollout_fn(copy.deepcopy(row), context)
        if result is not None and not isinstance(result, Rollout):
            raise TypeError(f"rollout_fn returned {type(result).__name__}, expected Rollout or None")
        if result is not None and result.reward is not None:
            _check_own_reward(result, rollout_fn, context.task)
        return result
    except Exception as exc:
        failed = context.new_rollout()
        failed.fail(RolloutStatus.ERROR, "".join(traceback.format_exception(exc))[-4000:])
        return failed


def _check_own_reward(rollout: Rollout, rollout_fn: RolloutFn, task: EnvMaker) -> None:
    """A reward the rollout_fn set itself gets the rubric's checks; a bad one makes the rollout an ERROR."""
    rubric = getattr(task, "rubric", None)
    bound = rubric.max_abs_reward if rubric is not None else MAX_ABS_REWARD
    try:
        rollout.reward = checked_reward(rollout.reward, f"rollout_fn {fn_name(rollout_fn)!r}", bound)
    except InvalidReward as exc:
        rollout.status, rollout.error = RolloutStatus.ERROR, str(exc)
        rollout.reward = rubric.error_reward if rubric is not None and rubric.error_reward is not None else 0.0


def join_by_row(
    row_id: str, task_name: str, row: dict[str, Any], results: list[tuple[int, Rollout | None]]
) -> RolloutGroup:
    """The group of one row from its `(sample_index, result)` pairs; None results are dropped."""
    rollouts = []
    for sample_index, rollout in sorted(results, key=lambda item: item[0]):
        if rollout is None:
            continue
        rollout.rollout_id, rollout.group_id = f"{row_id}/{sample_index}", row_id
        rollout.task_name, rollout.sample_index = task_name, sample_index
        rollouts.append(rollout)
    return RolloutGroup(group_id=row_id, task_name=task_name, example=row, rollouts=rollouts)


async def rollout_group(
    row_id: str,
    task_name: str,
    row: dict[str, Any],
    group_size: int,
    rollout_fn: RolloutFn,
    context: Callable[[int], RolloutContext],
) -> RolloutGroup:
    """Fan a row out to `group_size` concurrent `rollout_fn` calls and join them by row id."""

    async def sample(index: int) -> tuple[int, Rollout | None]:
        return index, await run_sample(rollout_fn, row, context(index))

    return join_by_row(
        row_id, task_name, row, list(await asyncio.gather(*(sample(index) for index in range(group_size))))
    )
