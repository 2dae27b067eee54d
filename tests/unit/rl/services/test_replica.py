"""The fault a drill injects into a replica (`RLMESH_FAULT`): the named replica hangs, every other answers."""

import asyncio

import pytest

from rl.services.replica import FAULT_ENV, ReplicaId, injected_fault


async def test_a_hang_holds_only_the_replica_it_names(monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "hang:generator/0#1")
    for other in (ReplicaId("generator", 0), ReplicaId("generator", 1, 1), ReplicaId("reward", 0, 1), None):
        await asyncio.wait_for(injected_fault(other), 1)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(injected_fault(ReplicaId("generator", 0, 1)), 0.2)


async def test_no_fault_without_the_variable(monkeypatch):
    monkeypatch.delenv(FAULT_ENV, raising=False)
    await asyncio.wait_for(injected_fault(ReplicaId("generator", 0)), 1)
