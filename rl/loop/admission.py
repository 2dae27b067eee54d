"""Row-granular admission: how many more rows may start generating now.

A row (a task example, whose whole group of `group_size` samples starts together) is admitted
only while both budgets allow it (AReaL's staleness controller):

    capacity = min(max_concurrent − running,
                   (policy_version + max_staleness + 1) × rows_per_step − (accepted + running))

`accepted` counts finished rows that will be trained on (in the buffer or consumed); a row that
is rejected (dropped, evicted) gives its slot back. Training consumes `rows_per_step` rows per
policy version, so if rows were trained in admission order the k-th (0-based) would train at
version `k // rows_per_step` and the staleness term admits it no earlier than version
`k // rows_per_step − max_staleness`. Rows finish out of order, so the buffer still checks each
group's sampled version when it is taken (`rl.loop.buffer.is_fresh`) and evicts the few that finished
too late: admission and eviction read the same clock, the policy version.
"""

from __future__ import annotations

import asyncio

from rl.config.run import RunConfig


class Admission:
    """Slot accounting for rows: `acquire` waits for capacity, `finish`/`reject` give slots back."""

    def __init__(self, *, max_concurrent: int, max_staleness: int, rows_per_step: int, policy_version: int = 0):
        """`policy_version` > 0 on a resume: the rows of the steps already trained count as accepted."""
        self.max_concurrent = max_concurrent
        self.max_staleness = max_staleness
        self.rows_per_step = rows_per_step
        self.policy_version = policy_version
        self.running = 0
        self.accepted = policy_version * rows_per_step
        self._changed = asyncio.Condition()

    @classmethod
    def for_run(cls, run: RunConfig, policy_version: int) -> Admission:
        """The admission of a run's `[run]` budgets, at `policy_version` (a resume's)."""
        return cls(
            max_concurrent=run.max_concurrent_rollouts,
            max_staleness=run.max_policy_staleness,
            rows_per_step=run.groups_per_step,
            policy_version=policy_version,
        )

    def capacity(self) -> int:
        staleness_room = (self.policy_version + self.max_staleness + 1) * self.rows_per_step - (
            self.accepted + self.running
        )
        return min(self.max_concurrent - self.running, staleness_room)

    async def acquire(self) -> int:
        """Wait until a row may start; returns the policy version it was admitted at."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.capacity() > 0)
            self.running += 1
            return self.policy_version

    async def finish(self, accepted: bool) -> None:
        """A running row ended: accepted into the buffer, or rejected (its slot is free again)."""
        async with self._changed:
            self.running -= 1
            self.accepted += accepted
            self._changed.notify_all()

    async def release_accepted(self, rows: int = 1) -> None:
        """Accepted rows that will not be trained after all (evicted as stale): free their slots."""
        async with self._changed:
            self.accepted -= rows
            self._changed.notify_all()

    async def set_policy_version(self, policy_version: int) -> None:
        async with self._changed:
            self.policy_version = policy_version
            self._changed.notify_all()
