"""Real torchstore round trip between two Monarch actor processes (no mocks).

A writer actor pushes versioned state dicts through rl.weights.sync, a reader actor in another process
pulls them; the launcher (this test) owns the store and checks exact equality, old-version deletion
and that no child process survives ``stop()``.
"""

import asyncio
import os
import time

import psutil
import pytest
import torch
from monarch.actor import Actor, endpoint, this_host

from rl.weights import sync as weight_sync
from rl.weights.shared_file import MappedFiles

# torchstore 0.1.2 calls monarch's deprecated is_rdma_available() on every transfer.
pytestmark = pytest.mark.filterwarnings("ignore:is_rdma_available is deprecated:DeprecationWarning")


def make_state_dict(policy_version: int) -> dict[str, torch.Tensor]:
    """Small deterministic state dict: mixed dtypes (incl. bf16) and shapes, different per version."""
    g = torch.Generator().manual_seed(policy_version)
    return {
        "embed.weight": torch.randn(16, 8, generator=g),
        "layers.0.attn.q_proj.weight": torch.randn(8, 8, generator=g).to(torch.bfloat16),
        "layers.0.norm.weight": torch.randn(8, generator=g),
        "lm_head.bias": torch.arange(5, dtype=torch.int64) * policy_version,
        "scalar": torch.tensor(float(policy_version)),
    }


class _Proc(Actor):
    @endpoint
    async def pid(self) -> int:
        return os.getpid()


class Writer(_Proc):
    """Trainer stand-in: pushes a version to the store."""

    @endpoint
    async def push(self, policy_version: int) -> None:
        await weight_sync.push_state_dict(make_state_dict(policy_version), policy_version)


class Reader(_Proc):
    """Generator stand-in: pulls a version (optionally into a template) and returns it."""

    @endpoint
    async def pull(self, policy_version: int, into_template: bool) -> dict[str, torch.Tensor]:
        template = None
        if into_template:
            template = {k: torch.zeros_like(v) for k, v in make_state_dict(0).items()}
        pulled = await weight_sync.pull_state_dict(policy_version, template=template)
        if template is not None:
            assert all(pulled[k] is template[k] for k in template), "template tensors were not reused"
        return pulled


def assert_exactly_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for k, w in want.items():
        assert got[k].dtype == w.dtype and got[k].shape == w.shape, k
        assert torch.equal(got[k], w), k


async def test_push_pull_between_actor_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    # Monarch pickles actor classes by reference: spawned procs (which inherit the launcher's env)
    # must be able to import this module by the name pytest gave it.
    here = os.path.dirname(os.path.abspath(__file__))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
    me = psutil.Process()
    children_before = {p.pid for p in me.children(recursive=True)}

    await weight_sync.initialize_store()
    writer_procs = this_host().spawn_procs(per_host={"procs": 1})
    reader_procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        writer = writer_procs.spawn("writer", Writer)
        reader = reader_procs.spawn("reader", Reader)
        pids = {os.getpid(), await writer.pid.call_one(), await reader.pid.call_one()}
        assert len(pids) == 3, "writer, reader and launcher must be distinct processes"

        await writer.push.call_one(1)
        assert_exactly_equal(await reader.pull.call_one(1, False), make_state_dict(1))
        assert await weight_sync.stored_versions() == [1]

        await writer.push.call_one(2)  # keep_versions=1: v1 must be gone
        assert await weight_sync.stored_versions() == [2]
        assert not await weight_sync.ts.exists("policy/v1/MAPPING")
        assert not any(k.startswith("policy/v1/") for k in await weight_sync.ts.keys())
        assert_exactly_equal(await reader.pull.call_one(2, True), make_state_dict(2))
        assert_exactly_equal(await weight_sync.pull_state_dict(2), make_state_dict(2))  # launcher too
    finally:
        await asyncio.gather(writer_procs.stop(), reader_procs.stop())
        await weight_sync.shutdown_store()

    deadline = time.monotonic() + 10
    while left := {p.pid for p in me.children(recursive=True)} - children_before:
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert not left, f"child processes survived stop(): {left}"


class SharedWriter(_Proc):
    """Trainer stand-in on the shared-memory transport: bytes in a shared file, the handle in the store."""

    def __init__(self):
        self.publisher = weight_sync.WeightPublisher("shared_memory")

    @endpoint
    async def publish(self, policy_version: int) -> list[str]:
        state_dict = make_state_dict(policy_version)
        state_dict["tied.weight"] = state_dict["embed.weight"]  # a tied weight: stored once
        await self.publisher.publish(state_dict, policy_version, torch.bfloat16)
        return sorted({handle.path for handle, _ in self.publisher._slots.values()})

    @endpoint
    async def close(self) -> None:
        self.publisher.close()


class SharedReader(_Proc):
    def __init__(self):
        self.receiver = weight_sync.WeightReceiver("shared_memory")

    @endpoint
    async def pull(self, policy_version: int) -> dict[str, torch.Tensor]:
        handle = await self.receiver.pull(policy_version)  # what a generator hands its vLLM workers
        return {name: tensor.clone() for name, tensor in MappedFiles().state_dict(handle).items()}


async def test_shared_memory_transport_between_actor_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
    await weight_sync.initialize_store()
    writer_procs = this_host().spawn_procs(per_host={"procs": 1})
    reader_procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        writer = writer_procs.spawn("shared_writer", SharedWriter)
        reader = reader_procs.spawn("shared_reader", SharedReader)
        for policy_version in (1, 2, 3):  # two slots, alternating: version 3 overwrites version 1's file
            paths = await writer.publish.call_one(policy_version)
            want = {
                k: v.to(torch.bfloat16) if v.is_floating_point() else v
                for k, v in make_state_dict(policy_version).items()
            }
            want["tied.weight"] = want["embed.weight"]
            assert_exactly_equal(await reader.pull.call_one(policy_version), want)
        assert len(paths) == 2 and all(os.path.exists(path) for path in paths)
        stored = {k for k in await weight_sync.ts.keys() if k.endswith("/HANDLE")}
        assert stored == {"policy/v2/HANDLE", "policy/v3/HANDLE"}  # the handle is the commit marker; old ones go
        await writer.close.call_one()
        assert not any(os.path.exists(path) for path in paths)
    finally:
        await asyncio.gather(writer_procs.stop(), reader_procs.stop())
        await weight_sync.shutdown_store()
