"""200 delta syncs through the trainer's `DeltaPublisher` and a generator's `DeltaReceiver` (the shared-memory transport,
its store calls on a `DirectoryStore`), on a small Qwen-shaped fp32 state with a tied embedding, each step an Adam-like
update (every element moves by the step's lr, 1e-7 to 3e-6, around RL's 1e-6; its sign random) and a bf16 wire. After
every sync the generator's resident file must be the trainer's weights cast to bf16 by torch, bit for bit; a version
goes whole exactly every `delta_full_every` syncs (counted from the last whole one); every 20th version's fingerprints
are those of the cast weights; a replica that joins mid-chain has no base, is refused the delta, and loads the version
the trainer publishes again whole (the other replica keeps its copy)."""

import asyncio
import time

import torch

from rl.training.distributed import Ranks
from rl.weights.attestation import fingerprint_state_dict
from rl.weights.delta import DeltaRejected
from rl.weights.delta_sync import DeltaPublisher, DeltaReceiver
from rl.weights.shared_file import view
from rl.weights.sync import WeightPublisher, WeightReceiver
from tests.support.directory_store import use_directory_store

WIRE = torch.bfloat16
SYNCS = 200
FULL_EVERY = 25
LATE_REPLICA_AT = 113
VOCAB, HIDDEN, MLP, LAYERS = 1024, 64, 176, 2


def qwen_shaped(seed: int) -> dict[str, torch.Tensor]:
    """A decoder's fp32 state dict, the embedding tied to the LM head (one tensor under both names)."""
    generator = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=generator) * 0.05
    embedding = rand(VOCAB, HIDDEN)
    state = {"model.embed_tokens.weight": embedding}
    for layer in range(LAYERS):
        at = f"model.layers.{layer}."
        state |= {at + f"self_attn.{p}_proj.weight": rand(HIDDEN, HIDDEN) for p in "qkvo"}
        state |= {at + f"mlp.{p}_proj.weight": rand(MLP, HIDDEN) for p in ("gate", "up")}
        state |= {at + "mlp.down_proj.weight": rand(HIDDEN, MLP), at + "input_layernorm.weight": torch.ones(HIDDEN)}
    return state | {"model.norm.weight": torch.ones(HIDDEN), "lm_head.weight": embedding}


def adam_like_step(state: dict[str, torch.Tensor], generator: torch.Generator) -> None:
    """Every element moves by this step's lr, its sign random (in place: the tie stays one tensor)."""
    lr = float(torch.empty(()).uniform_(1e-7, 3e-6, generator=generator))
    for name, tensor in state.items():
        if name != "lm_head.weight":
            tensor.sub_(lr * torch.sign(torch.randn(tensor.shape, generator=generator)))


def assert_holds(receiver: DeltaReceiver, state: dict[str, torch.Tensor], version: int) -> None:
    resident = receiver.resident
    assert resident.policy_version == version and receiver.holds(version)
    assert set(resident.handle.layout) == set(state)
    for name, tensor in state.items():
        held = view(resident.buffer, *resident.handle.layout[name])
        assert torch.equal(held.view(torch.int16), tensor.to(WIRE).view(torch.int16)), (version, name)


async def soak(tmp_path) -> dict:
    state = qwen_shaped(0)
    generator = torch.Generator().manual_seed(1)
    publisher = DeltaPublisher(WeightPublisher("shared_memory"), "auto", FULL_EVERY)
    replicas = [DeltaReceiver(WeightReceiver("shared_memory"))]
    full_at, last_full, delta_bytes, full_bytes, fractions = [], None, [], None, []
    try:
        for version in range(1, SYNCS + 1):
            if version > 1:
                adam_like_step(state, generator)
            check = version % 20 == 0  # the version's fingerprints, as a sync that attests takes them
            prints, stats = await publisher.publish(state, version, WIRE, Ranks(), fingerprint=check)
            if check:
                cast = cast_once(state)
                assert prints.tensors == fingerprint_state_dict(cast, version).tensors
            if version == LATE_REPLICA_AT:  # a replica that joins mid-chain holds no base
                replicas.append(DeltaReceiver(WeightReceiver("shared_memory")))
            try:
                for replica in replicas:
                    await replica.pull(version)
            except DeltaRejected:
                assert version == LATE_REPLICA_AT and stats.delta
                _, again = await publisher.publish_again(version, WIRE, Ranks())
                assert not again.delta and abs(again.bytes - full_bytes) < 64  # the manifests differ in counts
                for replica in replicas:
                    await replica.pull(version)
                last_full = version
            expected_full = last_full is None or version - last_full >= FULL_EVERY
            assert stats.delta != expected_full, (version, last_full)
            if stats.delta:
                delta_bytes.append(stats.bytes)
                fractions.append(stats.changed_fraction)
                assert 0 < stats.changed_fraction < 0.1, (version, stats)
            else:
                full_at.append(version)
                full_bytes = stats.bytes
                last_full = version
            for replica in replicas:
                assert_holds(replica, state, version)
    finally:
        publisher.publisher.close()
        for replica in replicas:
            replica.close()
    return {"full_at": full_at, "delta_bytes": delta_bytes, "full_bytes": full_bytes, "fractions": fractions}


def test_200_delta_syncs_keep_every_replica_bitwise_on_the_trainers_bf16_weights(tmp_path, monkeypatch):
    use_directory_store(tmp_path / "store", monkeypatch)
    start = time.perf_counter()
    result = asyncio.run(soak(tmp_path))
    seconds = time.perf_counter() - start
    # whole: the first, then every 25 syncs, with the count restarting at the late replica's repair (113)
    assert result["full_at"] == [1, 26, 51, 76, 101, 138, 163, 188], result["full_at"]
    assert len(result["delta_bytes"]) == SYNCS - 8
    assert max(result["delta_bytes"]) < 0.5 * result["full_bytes"]
    print(
        f"{SYNCS} syncs in {seconds:.1f} s; full {result['full_bytes']} B, deltas "
        f"{min(result['delta_bytes'])}-{max(result['delta_bytes'])} B, changed "
        f"{min(result['fractions']):.4f}-{max(result['fractions']):.4f}"
    )


def test_always_never_sends_a_scheduled_whole_version(tmp_path, monkeypatch):
    """`always` sends a delta whenever a base exists: 30 syncs, one whole (the first)."""
    use_directory_store(tmp_path / "store", monkeypatch)

    async def run() -> list[bool]:
        state, generator = qwen_shaped(2), torch.Generator().manual_seed(3)
        publisher = DeltaPublisher(WeightPublisher("shared_memory"), "always", 5)
        receiver = DeltaReceiver(WeightReceiver("shared_memory"))
        sent = []
        try:
            for version in range(1, 31):
                if version > 1:
                    adam_like_step(state, generator)
                _, stats = await publisher.publish(state, version, WIRE, Ranks())
                await receiver.pull(version)
                assert_holds(receiver, state, version)
                sent.append(stats.delta)
        finally:
            publisher.publisher.close()
            receiver.close()
        return sent

    assert asyncio.run(run()) == [False] + [True] * 29


def cast_once(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` in bf16 by torch, a tie one tensor under each of its names (what the trainer publishes)."""
    cast: dict[int, torch.Tensor] = {}
    return {name: cast.setdefault(tensor.data_ptr(), tensor.to(WIRE)) for name, tensor in state.items()}


def test_a_version_published_again_whole_is_the_same_version_and_the_next_delta_applies_onto_it(tmp_path, monkeypatch):
    """A replica without a base gets the version again whole, then both replicas apply the next delta. The state holds
    a tensor of no elements (what a rank of a sharded trainer holds of a tensor with fewer rows than ranks): the whole
    version must name the same blocks as the delta that made the version, or its digest differs and every later delta
    is refused as against another base."""
    use_directory_store(tmp_path / "store", monkeypatch)

    async def run() -> None:
        state, generator = qwen_shaped(4) | {"empty.weight": torch.zeros(0, HIDDEN)}, torch.Generator().manual_seed(5)
        publisher = DeltaPublisher(WeightPublisher("shared_memory"), "always", 50)
        first, late = DeltaReceiver(WeightReceiver("shared_memory")), DeltaReceiver(WeightReceiver("shared_memory"))
        try:
            await publisher.publish(state, 1, WIRE, Ranks())
            await first.pull(1)
            adam_like_step(state, generator)
            await publisher.publish(state, 2, WIRE, Ranks())
            await first.pull(2)
            try:
                await late.pull(2)
                raise AssertionError("a delta was applied without its base")
            except DeltaRejected:
                pass
            await publisher.publish_again(2, WIRE, Ranks())
            for version in (2, 3, 4):
                if version > 2:
                    adam_like_step(state, generator)
                    _, stats = await publisher.publish(state, version, WIRE, Ranks())
                    assert stats.delta
                for replica in (first, late):
                    await replica.pull(version)  # a delta refused here would need a full version each time
                    assert_holds(replica, state, version)
        finally:
            publisher.publisher.close()
            first.close()
            late.close()

    asyncio.run(run())
