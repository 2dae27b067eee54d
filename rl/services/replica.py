"""What an actor needs to be served as a replica: a health probe, an identity, and the fault a drill injects."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

from monarch import actor as monarch_actor
from monarch.actor import Actor, Endpoint, this_host

P = ParamSpec("P")
R = TypeVar("R")

FAULT_ENV = "RLMESH_FAULT"
"""Fault injection, for drills of the services' fault handling (docs/checkpoints.md, "Fault tolerance"):
`hang:<replica id>` (e.g. `hang:generator/0#0`) makes that replica take calls and never answer them, as a wedged
engine does. Read by the replica's own process: set it where the run starts, its actor processes inherit it."""


def concurrent_endpoint(method: Callable[Concatenate[Any, P], Awaitable[R]]) -> Endpoint[P, R]:
    """Monarch's `concurrent_endpoint`, typed as Monarch's `endpoint` is (its own returns `Any`): a service's endpoint
    of the method (`Service.endpoint`) is then typed from the method's parameters and result."""
    return monarch_actor.concurrent_endpoint(method)


@dataclass(frozen=True)
class ReplicaId:
    service: str
    index: int
    incarnation: int = 0
    """0 for the first process of slot `index`, then 1, 2, ... for its replacements."""

    def __str__(self) -> str:
        return f"{self.service}/{self.index}#{self.incarnation}"


class ServiceReplica(Actor):
    @concurrent_endpoint
    async def ping(self) -> int:
        """The health probe; answers with the process id (tests kill a replica by it)."""
        return os.getpid()

    @concurrent_endpoint
    async def host(self) -> str:
        """The name of the host this actor runs on (as it sees it: the start-up line of a run on allocated hosts)."""
        return socket.gethostname()


async def injected_fault(replica: ReplicaId | None) -> None:
    """The fault `RLMESH_FAULT` injects into a call on `replica`: it never returns when the fault hangs this replica."""
    if replica is not None and os.environ.get(FAULT_ENV) == f"hang:{replica}":
        await asyncio.Event().wait()


SpawnProcs = Callable[[int], Any]
"""Replica index -> a new one-process proc mesh for it (where replica `index` runs: host, GPUs)."""


def local_procs() -> SpawnProcs:
    """Each replica in a process of its own on this host."""

    def spawn(index: int) -> Any:
        return this_host().spawn_procs(per_host={"procs": 1})

    return spawn
