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


async def gather_states(meshes: list[Any]) -> list[dict[str, State]]:
    """Drain the accumulators of every process of every actor mesh, concurrently."""
    replies = await asyncio.gather(*(mesh.metric_states.call() for mesh in meshes))
    return [states for reply in replies for states in reply.values()]
