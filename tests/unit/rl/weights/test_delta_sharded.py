"""Delta sync from a sharded trainer: two gloo ranks hold dim-0 shards (an uneven split, and a one-row tensor whose
second shard is empty), a tied embedding and a replicated norm; each keeps only its shards' copy and sends its own
records. Through the real `DeltaPublisher` (shared-memory transport; its store calls on a `DirectoryStore` both ranks and
the generator share) a generator's `DeltaReceiver` must hold, after every version, the whole fp32 weights cast to bf16 by
torch, bit for bit; the version's fingerprints (gathered one tensor at a time from the copy) must be those of the same
cast weights; a receiver without a base is refused the delta and heals from the version published again whole from the
ranks' copies."""

import tempfile
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

pytestmark = pytest.mark.processes

WIRE = torch.bfloat16
VERSIONS = 5
LATE_AT = 3
SHAPES = {"embed.weight": (9, 8), "q.weight": (7, 8), "row.weight": (1, 8)}


def full_state(version: int) -> dict[str, torch.Tensor]:
    """The whole fp32 weights at `version` (both ranks and the check compute the same): every element moves by 1e-3."""
    generator = torch.Generator().manual_seed(0)
    state = {name: torch.randn(shape, generator=generator) * 0.05 for name, shape in SHAPES.items()}
    state["norm.weight"] = torch.ones(8)
    moved = torch.Generator().manual_seed(version)
    for tensor in state.values():
        tensor.add_((version - 1) * 1e-3 * torch.sign(torch.randn(tensor.shape, generator=moved)))
    return state | {"lm_head.weight": state["embed.weight"]}


def _rank(rank: int, world: int, tmp: str) -> None:
    import asyncio

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from rl.training.distributed import Ranks
    from rl.weights import delta
    from rl.weights.attestation import fingerprint_state_dict
    from rl.weights.delta_sync import DeltaPublisher, DeltaReceiver
    from rl.weights.shared_file import view
    from rl.weights.sync import WeightPublisher, WeightReceiver
    from tests.support.directory_store import use_directory_store

    use_directory_store(Path(tmp) / "store")
    dist.init_process_group("gloo", init_method=f"file://{tmp}/init", rank=rank, world_size=world)
    ranks, mesh = Ranks(rank, world), init_device_mesh("cpu", (world,))
    first = full_state(1)
    sharded = {name: distribute_tensor(first[name], mesh, [Shard(0)]) for name in SHAPES}
    state = {**sharded, "norm.weight": first["norm.weight"].clone(), "lm_head.weight": sharded["embed.weight"]}
    publisher = DeltaPublisher(WeightPublisher("shared_memory"), "always", 50)
    receivers = [DeltaReceiver(WeightReceiver("shared_memory"))] if rank == 0 else []
    sent = []

    def holds(receiver: DeltaReceiver, whole: dict[str, torch.Tensor], version: int) -> None:
        resident = receiver.resident
        assert receiver.holds(version) and set(resident.handle.layout) == set(whole)
        for name, tensor in whole.items():
            held = view(resident.buffer, *resident.handle.layout[name]).view(torch.int16)
            assert torch.equal(held, tensor.to(WIRE).view(torch.int16)), (version, name)

    async def run() -> None:
        for version in range(1, VERSIONS + 1):
            whole = full_state(version)
            for name, tensor in state.items():  # this rank's part of the new weights, in place
                local, start = delta.local_block(tensor)
                local.copy_(whole[name].reshape(-1)[start : start + local.numel()])
            prints, stats = await publisher.publish(state, version, WIRE, ranks, fingerprint=True)
            ranks.barrier()
            if rank == 0:
                cast = cast_once(whole)
                assert prints.tensors == fingerprint_state_dict(cast, version).tensors
                sent.append(stats.delta)
                await receivers[0].pull(version)
                holds(receivers[0], whole, version)
            if version == LATE_AT:  # a replica without a base joins: the ranks publish the version again, whole
                if rank == 0:
                    receivers.append(DeltaReceiver(WeightReceiver("shared_memory")))
                    try:
                        await receivers[1].pull(version)
                        raise AssertionError("a delta was applied without its base")
                    except delta.DeltaRejected:
                        pass
                await publisher.publish_again(version, WIRE, ranks)
                ranks.barrier()
                for receiver in receivers:
                    await receiver.pull(version)
                    holds(receiver, whole, version)
            ranks.barrier()

    try:
        asyncio.run(run())
        if rank == 0:
            torch.save({"sent": sent, "copy": publisher.copy.kept[1].copy.numel()}, f"{tmp}/out")
        else:
            torch.save({"copy": [kept.copy.numel() for kept in publisher.copy.kept]}, f"{tmp}/out1")
    finally:
        publisher.publisher.close()
        for receiver in receivers:
            receiver.close()
        dist.destroy_process_group()


def test_two_ranks_deltas_keep_a_generator_bitwise_on_the_whole_bf16_weights():
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank, args=(2, tmp), nprocs=2, join=True)
        rank0, rank1 = torch.load(f"{tmp}/out", weights_only=False), torch.load(f"{tmp}/out1", weights_only=False)
    assert rank0["sent"] == [False] + [True] * (VERSIONS - 1)
    # rank 1 keeps only its shards: rows 5..8 of the embedding, 4..6 of q, none of the one-row tensor, no norm
    assert rank1["copy"] == [4 * 8, 3 * 8, 0, 0]
    assert rank0["copy"] == 4 * 8  # q: rows 0..3


def cast_once(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` in bf16 by torch, a tie one tensor under each of its names (what the trainer publishes)."""
    cast: dict[int, torch.Tensor] = {}
    return {name: cast.setdefault(tensor.data_ptr(), tensor.to(WIRE)) for name, tensor in state.items()}
