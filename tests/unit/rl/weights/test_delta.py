"""Delta weight sync on real tensors: the trainer's copy encodes what changed in bf16, a generator's resident file stages
and applies it, and every fault (dropped, duplicated or corrupted chunk, truncated payload, wrong or corrupted base) is
rejected before the resident bytes change or, when detected only after writing, leaves the copy marked unknown until a
full version heals it. The expected bytes are always the trainer's fp32 weights cast to bf16 by torch, independently of
the delta code."""

import dataclasses

import pytest
import torch

from rl.training.distributed import Ranks
from rl.weights import delta
from rl.weights.delta import (
    BITMAP,
    DENSE,
    INDEX,
    DeltaRejected,
    Encoded,
    PublishedCopy,
    ResidentWeights,
    TensorEntry,
    chunks_of,
    encode_block,
    pack_bits,
    parse_stream,
    record_sizes,
    sends_deltas,
    stage,
    unpack_bits,
    whole_manifest,
)

WIRE = torch.bfloat16


def weights(seed: int = 0) -> dict[str, torch.Tensor]:
    """fp32 master weights with a tied embedding / lm_head, like SmolLM2's."""
    generator = torch.Generator().manual_seed(seed)
    embedding = torch.randn(64, 32, generator=generator) * 0.05
    return {
        "embed.weight": embedding,
        "layer.q.weight": torch.randn(32, 32, generator=generator) * 0.05,
        "layer.mlp.weight": torch.randn(96, 32, generator=generator) * 0.05,
        "norm.weight": torch.ones(32),
        "lm_head.weight": embedding,
    }


def step(state: dict[str, torch.Tensor], lr: dict[str, float], seed: int) -> dict[str, torch.Tensor]:
    """An Adam-like step: every element moves by lr (its sign random), in place, ties kept."""
    generator = torch.Generator().manual_seed(seed)
    for name, tensor in state.items():
        if name != "lm_head.weight":
            tensor.add_(lr.get(name, 0.0) * torch.sign(torch.randn(tensor.shape, generator=generator)))
    return state


def publish(copy: PublishedCopy, state, version: int, *, as_delta: bool):
    """What `DeltaPublisher.publish` computes on one rank: the manifest and the chunks."""
    base = None if copy.digest is None else (copy.policy_version, copy.digest)
    part = copy.update(state, WIRE, Ranks())
    manifest = whole_manifest(version, copy.tensors, [part], base=base if as_delta else None)
    copy.policy_version, copy.digest = version, manifest.digest
    return manifest, [(info.rank, info.seq, chunk) for info, chunk in zip(part.infos, part.chunks)]


def install_full(resident: ResidentWeights, copy: PublishedCopy, manifest) -> None:
    resident.install(copy.state_dict(Ranks()), manifest)


def served(resident: ResidentWeights) -> dict[str, torch.Tensor]:
    return {name: delta.view(resident.buffer, *where).clone() for name, where in resident.handle.layout.items()}


def assert_serves(resident: ResidentWeights, state: dict[str, torch.Tensor]) -> None:
    held = served(resident)
    assert set(held) == set(state)
    for name, tensor in state.items():
        assert torch.equal(held[name].view(torch.int16), tensor.to(WIRE).view(torch.int16)), name


@dataclasses.dataclass
class Chain:
    state: dict
    copy: PublishedCopy
    resident: ResidentWeights
    manifest: delta.Manifest
    chunks: list
    before: dict
    """Version 1's bytes (bf16)."""

    def __iter__(self):
        return iter((self.state, self.copy, self.resident, self.manifest, self.chunks))


@pytest.fixture
def chain():
    """Version 1 whole on a generator, version 2 as a delta (embedding: few bf16 changes, q: about a tenth, mlp: all)."""
    state = weights()
    copy, resident = PublishedCopy(), ResidentWeights()
    full, _ = publish(copy, state, 1, as_delta=False)
    install_full(resident, copy, full)
    before = {name: tensor.to(WIRE) for name, tensor in state.items()}
    step(state, {"embed.weight": 2e-7, "layer.q.weight": 2e-5, "layer.mlp.weight": 5e-2}, seed=1)
    manifest, chunks = publish(copy, state, 2, as_delta=True)
    yield Chain(state, copy, resident, manifest, chunks, before)
    resident.close()


def test_pack_bits_matches_a_hand_packed_mask():
    mask = torch.tensor([1, 0, 1, 1, 0, 0, 0, 0, 1], dtype=torch.bool)
    assert pack_bits(mask).tolist() == [0b1101, 0b1]
    assert torch.equal(unpack_bits(pack_bits(mask), 9), mask)


def test_record_sizes_by_hand_and_the_cheapest_kind_is_chosen():
    # 1000 bf16 elements: dense 2000 B; 10 changed: index 40 + 24 (20 padded) = 64, bitmap 128 (125 padded) + 24
    assert record_sizes(1000, 10, 2) == {DENSE: 2000, INDEX: 64, BITMAP: 152}
    assert INDEX not in record_sizes(2**31, 10, 2)  # int32 offsets cannot address it
    old = torch.zeros(1000, dtype=WIRE)
    for changed, kind in ((10, INDEX), (200, BITMAP), (900, BITMAP), (990, DENSE)):  # dense above 15/16
        new = old.clone()
        new[torch.randperm(1000, generator=torch.Generator().manual_seed(changed))[:changed]] = 1.0
        pieces, count = encode_block(0, 0, new, old)
        assert count == changed
        header = pieces[0].view(torch.int64).tolist()
        assert header[2] == kind and header[5] == (1000 if kind == DENSE else changed)


def test_a_delta_applies_to_the_trainer_weights_cast_to_bf16_bit_for_bit(chain):
    state, _copy, resident, manifest, chunks = chain
    kinds = {record.tensor: record.kind for record in stage(manifest, chunks)}
    names = [entry.names[0] for entry in manifest.tensors]
    assert kinds[names.index("embed.weight")] == INDEX
    assert kinds[names.index("layer.q.weight")] == BITMAP
    assert kinds[names.index("layer.mlp.weight")] == DENSE
    assert names.index("norm.weight") not in kinds  # unchanged: nothing sent
    assert manifest.tensors[0].names == ("embed.weight", "lm_head.weight")  # tied: one entry, both names
    resident.apply(manifest, stage(manifest, chunks))
    assert_serves(resident, state)
    assert (resident.policy_version, resident.digest) == (2, manifest.digest)
    assert sum(chunk.numel() for _, _, chunk in chunks) < manifest.full_bytes
    old, new = chain.before, {name: state[name].to(WIRE) for name in names}  # counted by torch, apart from the encoder
    assert manifest.changed == sum(int((old[n].view(torch.int16) != new[n].view(torch.int16)).sum()) for n in names)
    assert manifest.elements == sum(new[n].numel() for n in names)


def test_a_dropped_chunk_is_rejected_and_nothing_is_written(chain, monkeypatch):
    monkeypatch.setattr(delta, "CHUNK_BYTES", 512)
    state, copy, resident, _, _ = chain
    step(state, {"layer.mlp.weight": 5e-2}, seed=2)
    before = served(resident)
    manifest, chunks = publish(copy, state, 3, as_delta=True)
    assert len(chunks) > 3
    with pytest.raises(DeltaRejected, match="missing"):
        stage(manifest, chunks[:1] + chunks[2:])
    assert all(torch.equal(before[name], tensor) for name, tensor in served(resident).items())


def test_a_duplicated_chunk_is_rejected(chain, monkeypatch):
    monkeypatch.setattr(delta, "CHUNK_BYTES", 512)
    state, copy, _resident, _, _ = chain
    step(state, {"layer.mlp.weight": 5e-2}, seed=2)
    manifest, chunks = publish(copy, state, 3, as_delta=True)
    with pytest.raises(DeltaRejected, match="twice"):
        stage(manifest, [*chunks, chunks[1]])


def test_a_truncated_payload_is_rejected_whether_or_not_the_manifest_agrees(chain):
    _, _, _resident, manifest, chunks = chain
    rank, seq, chunk = chunks[-1]
    with pytest.raises(DeltaRejected, match="bytes"):
        stage(manifest, [*chunks[:-1], (rank, seq, chunk[:-100])])
    # a stream cut short at the source (its manifest describing the short chunk): the parser finds a record overrun
    short = chunk[:-100].clone()
    infos = tuple(dataclasses.replace(info, nbytes=short.numel(), crc=delta.crc(short)) if (info.rank, info.seq) == (rank, seq) else info for info in manifest.chunks)  # fmt: skip
    with pytest.raises(DeltaRejected, match="truncated|shorter|past the end"):
        stage(dataclasses.replace(manifest, chunks=infos), [*chunks[:-1], (rank, seq, short)])


def test_a_corrupted_chunk_is_rejected(chain):
    _, _, _, manifest, chunks = chain
    rank, seq, chunk = chunks[0]
    bad = chunk.clone()
    bad[-1] ^= 1
    with pytest.raises(DeltaRejected, match="CRC"):
        stage(manifest, [(rank, seq, bad), *chunks[1:]])


def test_a_delta_against_another_base_is_rejected_before_writing_then_a_full_version_heals(chain):
    state, copy, resident, manifest, chunks = chain
    records = stage(manifest, chunks)
    other = dataclasses.replace(manifest, base_digest="0" * 64)  # version 1 as another trainer published it
    with pytest.raises(DeltaRejected, match="against version 1"):
        resident.apply(other, records)
    assert resident.policy_version == 1
    resident.apply(manifest, records)  # now at 2
    before = served(resident)
    with pytest.raises(DeltaRejected, match="against version 1 .*holds 2"):
        resident.apply(manifest, records)  # version 2's delta again: its base (1) is not what this file holds
    wrong = dataclasses.replace(manifest, policy_version=4, base_version=3)
    with pytest.raises(DeltaRejected, match="against version 3"):
        resident.apply(wrong, records)
    assert all(torch.equal(before[name], tensor) for name, tensor in served(resident).items())
    assert resident.policy_version == 2
    step(state, {"layer.q.weight": 3e-4}, seed=3)
    publish(copy, state, 3, as_delta=True)
    full, _ = publish(copy, state, 4, as_delta=False)  # nothing changed since 3: version 4 = 3, whole
    install_full(resident, copy, full)
    assert_serves(resident, state)


def test_a_corrupted_base_is_caught_after_applying_and_only_a_full_version_heals_it(chain):
    state, copy, resident, manifest, chunks = chain
    resident.buffer[7] ^= 0x40  # a bit of the embedding flips in the generator's copy, its digest still claims v1
    with pytest.raises(DeltaRejected, match="differs from the published bytes"):
        resident.apply(manifest, stage(manifest, chunks))
    assert resident.digest is None  # the file is never served as version 2
    step(state, {"layer.q.weight": 3e-4}, seed=4)
    manifest3, chunks3 = publish(copy, state, 3, as_delta=True)
    with pytest.raises(DeltaRejected, match="no known base"):
        resident.apply(manifest3, stage(manifest3, chunks3))
    full, _ = publish(copy, state, 4, as_delta=False)
    install_full(resident, copy, full)
    assert_serves(resident, state)
    step(state, {"embed.weight": 2e-5}, seed=5)
    manifest5, chunks5 = publish(copy, state, 5, as_delta=True)
    resident.apply(manifest5, stage(manifest5, chunks5))
    assert_serves(resident, state)


def test_a_full_copy_that_differs_from_its_manifest_is_refused(chain):
    _state, copy, resident, manifest, _chunks = chain
    wrong = {name: tensor.clone() for name, tensor in copy.state_dict(Ranks()).items()}
    wrong["layer.q.weight"][0, 0] += 1
    with pytest.raises(DeltaRejected):
        resident.install(wrong, dataclasses.replace(manifest, base_version=None, base_digest=None, chunks=()))
    assert resident.digest is None


def test_two_ranks_shards_apply_at_their_offsets():
    """A sharded trainer's two ranks: each encodes its dim-0 shard at its flat offset and sends its own stream."""
    full_old = torch.randn(10, 6).to(WIRE)
    full_new = full_old.clone()
    full_new[1, 2] += 1.0  # rank 0's rows 0..4
    full_new[7] += 1.0  # rank 1's rows 5..9: a whole row
    entry = TensorEntry(("w",), (10, 6), "bfloat16")
    parts = []
    for rank, rows in ((0, slice(0, 5)), (1, slice(5, 10))):
        start = rows.start * 6
        pieces, changed = encode_block(0, start, full_new[rows].reshape(-1), full_old[rows].reshape(-1))
        chunks, infos = chunks_of(pieces, rank)
        block = delta.Block(0, start, start + 30, delta.crc(full_new[rows]))
        parts.append(Encoded(chunks, infos, [block], changed, 30))
    resident = ResidentWeights()
    base_blocks = [delta.Block(0, 0, 60, delta.crc(full_old))]
    base = whole_manifest(1, (entry,), [Encoded([], [], base_blocks, 0, 60)], base=None)
    resident.install({"w": full_old.clone()}, base)
    manifest = whole_manifest(2, (entry,), parts, base=(1, base.digest))
    received = [(info.rank, info.seq, chunk) for part in parts for info, chunk in zip(part.infos, part.chunks)]
    resident.apply(manifest, stage(manifest, received))
    assert torch.equal(served(resident)["w"].view(torch.int16), full_new.view(torch.int16))
    resident.close()


def test_the_parser_refuses_a_record_outside_its_tensor():
    entry = TensorEntry(("w",), (4,), "bfloat16")
    pieces, _ = encode_block(0, 2, torch.ones(4, dtype=WIRE), torch.zeros(4, dtype=WIRE))  # elements 2..6 of 4
    with pytest.raises(DeltaRejected, match="elements"):
        parse_stream(torch.cat(pieces), (entry,))


def test_the_gpu_suites_extract_and_apply_path_runs_on_the_cpu_at_a_reduced_size():
    """The GPU suite's measurement (tests/gpu/test_delta_sync.py) end to end on the CPU: 1% of the elements of
    Llama-3-8B-shaped tensors (every dimension / 64) change; the patched copy must be the new weights bit for bit, and
    the payload near the offsets' 6 bytes per changed element over 2 per element (3%), plus headers."""
    from tests.support.delta_bench import measure

    measured = measure("cpu", layers=1, fraction=0.01, scale=64, repeats=1)
    assert 0.02 < measured["payload_fraction"] < 0.04
    assert measured["extract_s"] > 0 and measured["apply_s"] > 0


def test_auto_sends_deltas_only_below_the_trainers_precision_and_never_for_adapters():
    fp32, bf16 = torch.float32, torch.bfloat16
    assert sends_deltas("auto", bf16, fp32, adapters=False)
    assert not sends_deltas("auto", fp32, fp32, adapters=False)  # fp32 on the wire: every touched element changes
    assert sends_deltas("always", fp32, fp32, adapters=False)
    assert not sends_deltas("never", bf16, fp32, adapters=False)
    assert not sends_deltas("always", bf16, fp32, adapters=True)


def test_a_dtensor_shard_is_kept_at_its_offset_and_published_again_as_a_dtensor(tmp_path):
    """The sharded trainer's path in one process (a one-rank gloo group): a dim-0 DTensor's local block, its flat
    offset, and the copy rebuilt as a DTensor of the same placement (what a full version publishes)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        weight = distribute_tensor(torch.randn(6, 4), mesh, [Shard(0)])
        local, start = delta.local_block(weight)
        assert start == 0 and torch.equal(local, weight.to_local().reshape(-1))
        copy = PublishedCopy()
        ranks = Ranks(0, 1)
        copy.update({"w": weight, "tied": weight}, WIRE, ranks)
        rebuilt = copy.state_dict(ranks)
        assert rebuilt["w"] is rebuilt["tied"] and isinstance(rebuilt["w"], DTensor)
        assert rebuilt["w"].placements == weight.placements and rebuilt["w"].shape == weight.shape
        assert torch.equal(
            rebuilt["w"].full_tensor().view(torch.int16), weight.full_tensor().to(WIRE).view(torch.int16)
        )
        replicated = distribute_tensor(torch.randn(6, 4), mesh, [Replicate()])  # every rank would send it whole
        with pytest.raises(NotImplementedError, match="dim-0 shards"):
            delta.local_block(replicated)
    finally:
        dist.destroy_process_group()
