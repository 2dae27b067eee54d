"""The actor side of metric gathering: an endpoint that hands over the process's accumulators."""

from __future__ import annotations

import asyncio
from typing import Any

from monarch.actor import Actor, endpoint

from rl.metrics.reduce import State, drain_states
from rl.metrics.run_log import redirect_actor_process

redirect_actor_process()  # every actor module imports this one before its heavy dependencies


class MetricsActor(Actor):
    """Base of every rlmesh actor: `record_metric` inside it reaches the controller's step metrics."""

    @endpoint
    async def metric_states(self) -> dict[str, State]:
        """What this process recorded since the last call (and forget it)."""
        return drain_states()


async def gather_states(meshes: list[Any], timeout_s: float) -> tuple[list[dict[str, State]], list[Any]]:
    """Drain the accumulators of every process of every actor mesh, concurrently, each within `timeout_s`.

    Returns the states, and the meshes that did not answer in time or failed (their states are left out)."""

    async def one(mesh: Any) -> Any:
        try:
            return await asyncio.wait_for(mesh.metric_states.call(), timeout_s)
        except Exception:  # a hung or dead process: the caller decides what that means
            return None

    replies = await asyncio.gather(*(one(mesh) for mesh in meshes))
    states = [states for reply in replies if reply is not None for states in reply.values()]
    return states, [mesh for mesh, reply in zip(meshes, replies) if reply is None]
