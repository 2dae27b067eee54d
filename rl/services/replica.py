"""What an actor needs to be served as a replica: a health probe, an identity, and the test-only hang hook."""

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

TEST_ONLY_HANG_ENV = "RLMESH_TEST_ONLY_HANG_REPLICA"
"""Test-only fault injection: a replica whose `ReplicaId` (e.g. "generator/0#0") this names never answers a generate call."""


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


async def test_only_hang(replica: ReplicaId | None) -> None:
    """Never return if `RLMESH_TEST_ONLY_HANG_REPLICA` names this replica (the hang-detection test's fault)."""
    if replica is not None and os.environ.get(TEST_ONLY_HANG_ENV) == str(replica):
        await asyncio.Event().wait()


SpawnProcs = Callable[[int], Any]
"""Replica index -> a new one-process proc mesh for it (where replica `index` runs: host, GPUs)."""


def local_procs() -> SpawnProcs:
    """Each replica in a process of its own on this host."""

    def spawn(index: int) -> Any:
        return this_host().spawn_procs(per_host={"procs": 1})

    return spawn
