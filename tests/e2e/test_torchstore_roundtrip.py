"""Real torchstore round trip between two Monarch actor processes (no mocks).

A writer actor pushes versioned state dicts through rl.weights.sync, a reader actor in another process
pulls them; the launcher (this test) owns the store and checks exact equality, old-version deletion
and that no child process survives ``stop()``.
"""

import asyncio
import gc
import os
import time

import psutil
import pytest
import torch
from monarch.actor import Actor, endpoint, this_host

from rl.metrics.memory import peak_rss_bytes, reset_peaks, rss_bytes
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


MIB = 2**20


def make_large_state_dict(policy_version: int, rows: int = 1024) -> dict[str, torch.Tensor]:
    """Five fp32 tensors of 36 MiB, a bf16 and an int64 one (~188 MiB), different per version; `rows` reshapes the
    last. Tensors above glibc's largest mmap threshold (32 MiB) go back to the system when freed, so the resident
    size before a pull holds no freed copy of an earlier one that the pull could reuse unseen."""
    g = torch.Generator().manual_seed(policy_version)
    state_dict = {f"layers.{i}.weight": torch.randn(3072, 3072, generator=g) for i in range(5)}
    state_dict["norm.weight"] = torch.randn(1024, generator=g).to(torch.bfloat16)
    state_dict["positions"] = torch.arange(rows * 1024, dtype=torch.int64) * policy_version
    return state_dict


class LargeWriter(_Proc):
    @endpoint
    async def push(self, policy_version: int, rows: int) -> None:
        """Version 0: a small state dict of other names."""
        state_dict = make_large_state_dict(policy_version, rows) if policy_version else make_state_dict(0)
        await weight_sync.push_state_dict(state_dict, policy_version, keep_versions=2)


class StagingReader(_Proc):
    """Generator stand-in on the torchstore transport: pulls into its staging file and measures its own peak."""

    def __init__(self):
        self.receiver = weight_sync.WeightReceiver("torchstore")

    @endpoint
    async def pull(self, policy_version: int, rows: int) -> tuple[int, str, bool]:
        """The pull's growth of this process's resident high-water mark (`VmHWM`) over its resident size before it,
        the staging file's path, and whether the file holds the version exactly."""
        gc.collect()
        reset_peaks()
        before = rss_bytes()
        handle = await self.receiver.pull(policy_version)
        growth = peak_rss_bytes() - before
        got = MappedFiles().state_dict(handle)
        want = make_large_state_dict(policy_version, rows)
        exact = got.keys() == want.keys() and all(
            got[k].dtype == w.dtype and got[k].shape == w.shape and torch.equal(got[k], w) for k, w in want.items()
        )
        return growth, handle.path, exact

    @endpoint
    async def warm_up(self) -> None:
        """A first pull of a small version: the store's client and transport start here, not in a measured pull."""
        await self.receiver.pull(0)

    @endpoint
    async def close(self) -> None:
        self.receiver.close()


async def test_torchstore_pull_holds_one_tensor_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A generator's pull grows its resident peak by about one tensor (36 MiB here), not by the version (188 MiB): the
    tensors are fetched one at a time into the staging file, which this process writes without mapping."""
    here = os.path.dirname(os.path.abspath(__file__))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
    await weight_sync.initialize_store()
    writer_procs = this_host().spawn_procs(per_host={"procs": 1})
    reader_procs = this_host().spawn_procs(per_host={"procs": 1})
    largest = 36 * MIB
    # torchstore's transport holds a fetched tensor up to three times at once (the message's bytes, the tensor read
    # from them, its copy out of the transport buffer); allocator slack
    bound = 3 * largest + 16 * MIB
    try:
        writer = writer_procs.spawn("large_writer", LargeWriter)
        reader = reader_procs.spawn("staging_reader", StagingReader)
        await writer.push.call_one(0, 0)
        await reader.warm_up.call_one()
        paths = []
        for policy_version, rows in ((1, 1024), (2, 1024), (3, 2048)):  # version 3 changes a shape: a new file
            await writer.push.call_one(policy_version, rows)  # the store keeps two versions
            growth, path, exact = await reader.pull.call_one(policy_version, rows)
            assert exact, f"version {policy_version}'s staging file differs from what was pushed"
            assert growth <= bound, (
                f"pulling version {policy_version} grew the reader's peak by {growth / MIB:.1f} MiB "
                f"(bound {bound / MIB:.0f} MiB, a version is ~188 MiB)"
            )
            paths.append(path)
        assert paths[0] == paths[1] != paths[2], "the staging file is reused while the layout holds, replaced after"
        assert not os.path.exists(paths[0])
        await reader.close.call_one()
        assert not os.path.exists(paths[2])
    finally:
        await asyncio.gather(writer_procs.stop(), reader_procs.stop())
        await weight_sync.shutdown_store()
