"""The actor side of metric gathering: an endpoint that hands over the process's accumulators, and one that hands over
its peak memory since the last call (`rl.metrics.memory`)."""

from __future__ import annotations

import asyncio
from typing import Any

from monarch.actor import Actor, concurrent_endpoint, endpoint

from rl.metrics.memory import peak_states
from rl.metrics.reduce import State, drain_states
from rl.metrics.run_log import redirect_actor_process

redirect_actor_process()  # every actor module imports this one before its heavy dependencies


class MetricsActor(Actor):
    """Base of every rlmesh actor: `record_metric` inside it reaches the controller's step metrics."""

    memory_role = "actor"
    """The role this process's peak memory is reported under (`memory/<role>/peak_rss_mb`)."""

    @endpoint
    async def metric_states(self) -> dict[str, State]:
        """What this process recorded since the last call (and forget it)."""
        return drain_states()

    @concurrent_endpoint
    async def memory_states(self) -> dict[str, State]:
        """This process's peak memory since the last call, as metric states (`rl.metrics.memory.peak_states`);
        answered beside running requests (it reads /proc only), so a generator mid-generation answers at once."""
        return peak_states(self.memory_role)


async def gather_states(
    meshes: list[Any], timeout_s: float, endpoint: str = "metric_states"
) -> tuple[list[dict[str, State]], list[Any]]:
    """Drain the accumulators of every process of every actor mesh, concurrently, each within `timeout_s`
    (`endpoint`: "memory_states" for their peak memory alone).

    Returns the states, and the meshes that did not answer in time or failed (their states are left out)."""

    async def one(mesh: Any) -> Any:
        try:
            return await asyncio.wait_for(getattr(mesh, endpoint).call(), timeout_s)
        except Exception:  # a hung or dead process: the caller decides what that means
            return None

    replies = await asyncio.gather(*(one(mesh) for mesh in meshes))
    states = [states for reply in replies if reply is not None for states in reply.values()]
    return states, [mesh for mesh, reply in zip(meshes, replies) if reply is None]
