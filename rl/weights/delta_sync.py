"""Delta versions through the store: the trainer's `DeltaPublisher` and a generator's `DeltaReceiver`.

Every version gets a `Manifest` at `policy/d{N}/MANIFEST` (written last). A delta's chunks sit beside it at
`policy/d{N}/{rank}/{seq}`; a full version travels the transport's usual way (`WeightPublisher`: the shared file or
torchstore's `policy/v{N}`) and its manifest carries its digest alone. A generator whose base is unknown (a new or
replaced replica), or whose delta failed a check, reports `needs_full`; the controller then has the trainer publish the
same version in full from its copy (`DeltaPublisher.publish_again`), and every replica that lacks it loads it.

`weight_sync.delta`: "never" publishes as before (no copy, no manifest). "always" sends a delta whenever a base exists.
"auto" sends one only when the generators' dtype is narrower than the trainer's weights (with fp32 weights published in
fp32 nearly every element changes each step: a delta would be the whole version, and the copy would cost a second fp32
model in the trainer's memory), and sends a full version every `weight_sync.delta_full_every` syncs and whenever the
delta would exceed half the full version's bytes.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor

from rl.training.distributed import Ranks
from rl.weights.attestation import Fingerprints, TensorPrint, fingerprint
from rl.weights.delta import (
    DELTA_PREFIX,
    DeltaMode,
    DeltaRejected,
    Encoded,
    Manifest,
    PublishedCopy,
    ResidentWeights,
    stage,
    whole_manifest,
)
from rl.weights.shared_file import MappedFiles, SharedWeights
from rl.weights.sync import WeightPublisher, WeightReceiver, ts

AUTO_MAX_FRACTION = 0.5
"""`auto` sends a full version instead of a delta larger than this fraction of it."""


def manifest_key(policy_version: int) -> str:
    return f"{DELTA_PREFIX}{policy_version}/MANIFEST"


def chunk_key(policy_version: int, rank: int, seq: int) -> str:
    return f"{DELTA_PREFIX}{policy_version}/{rank}/{seq}"


@dataclass(frozen=True)
class SyncStats:
    """What one publish sent: `weight_sync/bytes`, `weight_sync/changed_fraction`, `weight_sync/delta`."""

    bytes: int
    changed_fraction: float
    delta: bool
    seconds: float


async def _put_manifest(manifest: Manifest) -> None:
    key = manifest_key(manifest.policy_version)
    if await ts.exists(key):
        await ts.delete(key)
    await ts.put(key, manifest)


async def _prune(policy_version: int) -> None:
    """Delete every delta key of versions older than the previous one (generators read only the newest)."""
    stale = [k for k in await ts.keys() if k.startswith(DELTA_PREFIX)]
    stale = [k for k in stale if int(k[len(DELTA_PREFIX) :].split("/", 1)[0]) < policy_version - 1]
    await asyncio.gather(*(ts.delete(k) for k in stale if k.endswith("/MANIFEST")))
    await asyncio.gather(*(ts.delete(k) for k in stale if not k.endswith("/MANIFEST")))


class DeltaPublisher:
    """Trainer side: each version as a delta against the last published one, or in full (module docstring)."""

    def __init__(self, publisher: WeightPublisher, mode: DeltaMode, full_every: int):
        self.publisher = publisher
        self.mode = mode
        self.full_every = full_every
        self.copy = PublishedCopy()
        self.since_full = 0

    async def publish(
        self,
        state_dict: dict[str, torch.Tensor],
        policy_version: int,
        dtype: torch.dtype,
        ranks: Ranks,
        *,
        fingerprint: bool = False,
    ) -> tuple[Fingerprints | None, SyncStats]:
        """Every rank calls this; the version is readable once all have returned. Returns rank 0's fingerprints of the
        version (with `fingerprint`) and what was sent."""
        start = time.perf_counter()
        base = None if self.copy.digest is None else (self.copy.policy_version, self.copy.digest)
        part = self.copy.update(state_dict, dtype, ranks)
        chunks, part.chunks = part.chunks, []
        parts: list[Encoded] = ranks.gather(part)  # [world]: every rank's infos, blocks and counts
        manifest = whole_manifest(policy_version, self.copy.tensors, parts, base=base)
        delta_bytes = sum(info.nbytes for info in manifest.chunks)
        full = base is None or (
            self.mode == "auto"
            and (self.since_full + 1 >= self.full_every or delta_bytes > AUTO_MAX_FRACTION * manifest.full_bytes)
        )
        if full:
            manifest = whole_manifest(policy_version, self.copy.tensors, parts, base=None)
            fingerprints = await self._publish_full(manifest, dtype, ranks, fingerprint)
            self.since_full = 0
        else:
            for seq, chunk in enumerate(chunks):
                await ts.put(chunk_key(policy_version, ranks.rank, seq), chunk)
            ranks.barrier()
            if ranks.rank == 0:
                await _put_manifest(manifest)
                await _prune(policy_version)
            fingerprints = self._fingerprints(policy_version, ranks) if fingerprint else None
            self.since_full += 1
        self.copy.policy_version, self.copy.digest = policy_version, manifest.digest
        fraction = manifest.changed / max(manifest.elements, 1)
        return fingerprints, SyncStats(manifest.payload_bytes, fraction, not full, time.perf_counter() - start)

    async def publish_again(
        self, policy_version: int, dtype: torch.dtype, ranks: Ranks, *, fingerprint: bool = False
    ) -> tuple[Fingerprints | None, SyncStats]:
        """The last published version once more, in full, from the copy (for generators without its base)."""
        if self.copy.policy_version != policy_version or self.copy.digest is None:
            raise ValueError(
                f"asked for version {policy_version} in full, the trainer last published {self.copy.policy_version}"
            )
        start = time.perf_counter()
        blocks = ranks.gather(self.copy.blocks)
        parts = [Encoded([], [], part, 0, 0) for part in blocks]
        manifest = whole_manifest(policy_version, self.copy.tensors, parts, base=None)
        if manifest.digest != self.copy.digest:  # the next delta names the copy's digest as its base
            raise RuntimeError(f"version {policy_version} published again would not be the version first published")
        fingerprints = await self._publish_full(manifest, dtype, ranks, fingerprint)
        self.since_full = 0
        return fingerprints, SyncStats(manifest.payload_bytes, 0.0, False, time.perf_counter() - start)

    async def _publish_full(
        self, manifest: Manifest, dtype: torch.dtype, ranks: Ranks, fingerprint: bool
    ) -> Fingerprints | None:
        state_dict = self.copy.state_dict(ranks)
        fingerprints = await self.publisher.publish(
            state_dict, manifest.policy_version, dtype, ranks, fingerprint=fingerprint
        )
        if ranks.rank == 0:
            await _put_manifest(manifest)
            await _prune(manifest.policy_version)
        return fingerprints

    def _fingerprints(self, policy_version: int, ranks: Ranks) -> Fingerprints | None:
        """The version's fingerprints from the copy, on rank 0 (None elsewhere; every rank calls it). A sharded tensor
        is gathered whole, fingerprinted and dropped before the next: no rank holds more than one whole tensor."""
        start = time.perf_counter()
        seen: set[int] = set()
        tensors: dict[str, TensorPrint] = {}
        for name, tensor in self.copy.state_dict(ranks).items():
            if id(tensor) in seen:  # a tie: one object under each of its names, fingerprinted under the first
                continue
            seen.add(id(tensor))
            whole = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor  # collective
            if ranks.rank == 0:
                tensors[name] = fingerprint(name, whole)
            del whole
        if ranks.rank != 0:
            return None
        return Fingerprints(policy_version, tensors, seconds=time.perf_counter() - start)


class DeltaReceiver:
    """Generator side: the version's handle for vLLM's workers, from this replica's resident file, which a delta
    patches and a full version replaces; `DeltaRejected` when a full version is needed. A run without manifests (deltas
    off) is served by the plain `WeightReceiver`."""

    def __init__(self, receiver: WeightReceiver):
        self.receiver = receiver
        self.resident = ResidentWeights()

    async def pull(self, policy_version: int) -> SharedWeights:
        if not await ts.exists(manifest_key(policy_version)):
            return await self.receiver.pull(policy_version)
        manifest: Manifest = await ts.get(manifest_key(policy_version))
        resident = self.resident
        if (resident.policy_version, resident.digest) == (policy_version, manifest.digest):
            return resident.handle  # already holds it (a repair sync for another replica)
        if not manifest.is_delta:
            handle = await self.receiver.pull(policy_version)
            return await asyncio.to_thread(resident.install, MappedFiles().state_dict(handle), manifest)
        if (resident.policy_version, resident.digest) != (manifest.base_version, manifest.base_digest):
            raise DeltaRejected(
                f"version {policy_version} is a delta against version {manifest.base_version}; this generator holds "
                f"{'no known version' if resident.digest is None else resident.policy_version}"
            )
        received = []
        for info in manifest.chunks:
            try:
                chunk = await ts.get(chunk_key(policy_version, info.rank, info.seq))
            except Exception as exc:
                raise DeltaRejected(f"chunk {info.seq} of rank {info.rank} unreadable: {exc}") from exc
            received.append((info.rank, info.seq, chunk))
        records = await asyncio.to_thread(stage, manifest, received)
        return await asyncio.to_thread(resident.apply, manifest, records)

    def holds(self, policy_version: int) -> bool:
        """Whether the resident file holds `policy_version`, proven (False in a run without deltas)."""
        return self.resident.policy_version == policy_version and self.resident.digest is not None

    def close(self) -> None:
        self.receiver.close()
        self.resident.close()
