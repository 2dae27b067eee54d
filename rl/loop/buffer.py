"""The buffer between rollout production and training, with a staleness budget.

A group is fresh enough for the optimizer step that would produce policy version `v + 1`
when its oldest sampled token came from version `>= v - max_staleness`. With a budget of 0
training is synchronous: every group was sampled by the weights being trained. The buffer is
not bounded itself: admission (`rl.loop.admission`) bounds how many rows can be in it.
"""

from __future__ import annotations

import asyncio

from rollouts.types import RolloutGroup, is_frozen_sampled


def is_fresh(group_policy_version: int, trainer_policy_version: int, max_staleness: int) -> bool:
    """Whether a group sampled at `group_policy_version` may train the policy at `trainer_policy_version`."""
    return trainer_policy_version - group_policy_version <= max_staleness


class RolloutBuffer:
    """FIFO of scored groups; `get` evicts groups that are too stale; `close` marks the end of production."""

    def __init__(self, max_staleness: int):
        self._queue: asyncio.Queue[RolloutGroup | None] = asyncio.Queue()
        self.max_staleness = max_staleness

    async def put(self, group: RolloutGroup) -> None:
        await self._queue.put(group)

    def close(self) -> None:
        """No more groups will come: `get` returns what is left instead of waiting."""
        self._queue.put_nowait(None)

    async def get(self, count: int, trainer_policy_version: int) -> tuple[list[RolloutGroup], list[RolloutGroup]]:
        """The next `count` fresh groups (fewer once closed), and the stale ones evicted on the way."""
        groups: list[RolloutGroup] = []
        evicted: list[RolloutGroup] = []
        while len(groups) < count:
            group = await self._queue.get()
            if group is None:
                self._queue.put_nowait(None)  # later gets see the end too
                break
            if is_frozen_sampled(group) or is_fresh(
                group.min_policy_version, trainer_policy_version, self.max_staleness
            ):
                groups.append(group)
            else:
                evicted.append(group)
        return groups, evicted

    async def next_batch(
        self, count: int, trainer_policy_version: int, producer: asyncio.Task
    ) -> tuple[list[RolloutGroup], list[RolloutGroup]]:
        """`get`, beside the task that puts the groups: when `producer` crashes its error is raised here instead of
        the run hanging (the producer closes the buffer when the data runs out)."""
        get = asyncio.ensure_future(self.get(count, trainer_policy_version))
        await asyncio.wait([get, producer], return_when=asyncio.FIRST_COMPLETED)
        if producer.done() and producer.exception() is not None:
            get.cancel()
            producer.result()
        return await get
