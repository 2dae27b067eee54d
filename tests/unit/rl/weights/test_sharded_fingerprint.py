"""An attested sync from a sharded trainer fingerprints the version one gathered tensor at a time.

Two gloo ranks on the CPU hold row shards of 8 tensors of 32 MiB (256 MiB whole, 128 MiB per rank). Each rank's
resident high-water mark (`VmHWM`, reset just before) may grow by one whole tensor and the gather's buffer (gloo
gathers into a staging buffer of the whole tensor's size: 68 MiB measured), not by the model: gathering every tensor
before fingerprinting any grows rank 0 by 289 MiB. Large blocks are returned to the system when freed
(`rl.processes.heap`): otherwise glibc serves the later 32 MiB blocks from its heap, whose holes the alternating
gathers and buffers fragment (129 MiB seen once), which measures the allocator, not what the code keeps alive.
"""

import os
import tempfile

import pytest
import torch
import torch.multiprocessing as mp

from rl.weights.attestation import fingerprint

TENSORS, ROWS, COLS = 8, 1024, 4096  # each rank's shard: [1024, 4096] fp32 = 16 MiB; whole: 32 MiB
MIB = 2**20


def _shard(index: int, rank: int) -> torch.Tensor:
    """Rank `rank`'s rows of tensor `index` (seeded by both: the test rebuilds the whole tensor from them)."""
    return torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(1000 * index + rank))


def _rank(rank: int, world: int, init_file: str, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    from rl.metrics.memory import peak_rss_bytes, reset_peaks, rss_bytes
    from rl.processes.heap import return_large_blocks_to_the_system
    from rl.training.distributed import Ranks
    from rl.weights.sync import fingerprint_sharded

    return_large_blocks_to_the_system()
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    norm = torch.linspace(0.5, 1.5, COLS)  # a replicated entry, tied under two names
    state = {f"layer{i}.weight": DTensor.from_local(_shard(i, rank), mesh, [Shard(0)]) for i in range(TENSORS)}
    state |= {"norm.weight": norm, "tied_norm.weight": norm}
    dist.barrier()
    reset_peaks()
    before = rss_bytes()
    prints = fingerprint_sharded(state, 3, Ranks(rank, world))
    growth = peak_rss_bytes() - before
    torch.save({"growth": growth, "prints": prints}, f"{out}.{rank}")
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.processes  # two gloo ranks in their own processes
def test_a_sharded_version_is_fingerprinted_one_whole_tensor_at_a_time() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank")
        mp.spawn(_rank, args=(2, os.path.join(tmp, "init"), out), nprocs=2, join=True)
        results = [torch.load(f"{out}.{rank}", weights_only=False) for rank in range(2)]
    largest = 2 * ROWS * COLS * 4  # one whole tensor, fp32
    for rank, result in enumerate(results):
        assert result["growth"] <= 3 * largest, (
            f"rank {rank} grew {result['growth'] / MIB:.0f} MiB while fingerprinting (one whole tensor: "
            f"{largest / MIB:.0f} MiB; the whole model: {TENSORS * largest / MIB:.0f} MiB)"
        )
    assert results[1]["prints"] is None
    prints = results[0]["prints"]
    assert prints.policy_version == 3
    assert list(prints.tensors) == [*(f"layer{i}.weight" for i in range(TENSORS)), "norm.weight"]  # a tie once
    for i in range(TENSORS):  # each gathered tensor is the two ranks' rows in order
        name = f"layer{i}.weight"
        assert prints.tensors[name] == fingerprint(name, torch.cat([_shard(i, 0), _shard(i, 1)]))
    assert prints.tensors["norm.weight"] == fingerprint("norm.weight", torch.linspace(0.5, 1.5, COLS))
