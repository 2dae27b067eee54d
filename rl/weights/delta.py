"""Delta weight sync: only the elements whose wire-dtype bits changed cross, and each version is applied whole or not at all.

The trainer keeps the last published version in the wire dtype (`PublishedCopy`: each rank its own shards, on the
weights' device). Each sync casts the new weights, compares their bits with the copy's, and per tensor block sends the
cheapest of three records (`encode_block`):
    DENSE   the block's values                                   numel · s bytes
    INDEX   int32 offsets of the changed elements + their values k · (4 + s)
    BITMAP  one bit per element, set where changed + the values  numel / 8 + k · s
(s: the wire dtype's element size, k: changed elements). INDEX wins below a changed fraction of 1/32, BITMAP above, DENSE
above 1 - 1/(8s): the choice is made per block, so a tensor that moved everywhere goes dense beside sparse ones.

A rank's records are one byte stream, cut into chunks of at most `CHUNK_BYTES`; the `Manifest` (written last, the
commit marker) names the version, its base version and the base's digest, every chunk's size and CRC, and the version's
exact content digest: a CRC32 per tensor block (`Block`) and a SHA-256 over them. A generator's `ResidentWeights` (its
own shared file, which vLLM's workers load from) stages a delta first: the base it holds must be the manifest's (version
and digest), every chunk must arrive once, whole and with its CRC, every record must parse and stay inside its tensor.
Only then are the records written, and the result must have the version's digest before vLLM is told to load it. Any
failure raises `DeltaRejected` before vLLM loads anything: the replica keeps serving its version and asks for a full
version (`rl.loop.weight_update`), which the trainer publishes from its copy.

A full version goes the transport's usual way (`WeightPublisher`), with a manifest carrying its digest, which the
generator checks after copying it into its resident file: a full version is proven bit for bit too.
"""

from __future__ import annotations

import hashlib
import math
import pickle
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch
from torch.distributed.tensor import DTensor, Shard

from rl.weights.shared_file import SharedWeights, file_path, map_file, plan_layout, view

if TYPE_CHECKING:
    from rl.training.distributed import Ranks

DeltaMode = Literal["auto", "always", "never"]

DELTA_PREFIX = "policy/d"
"""Store keys of version N's delta: `policy/d{N}/{rank}/{chunk}` and `policy/d{N}/MANIFEST` (apart from the full
versions' `policy/v{N}`, whose pruning knows nothing of them)."""

CHUNK_BYTES = 64 * 2**20
"""Largest chunk of a rank's delta stream (one store value)."""

MAGIC = 0x524C4D44
DENSE, INDEX, BITMAP = 1, 2, 3
HEADER = 7
"""int64 words of a record's header: magic, tensor index, kind, start, length, values, body bytes."""
ALIGN = 8

INT_VIEWS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
"""Integer dtype of each element size: a bitwise comparison (NaN and -0.0 included)."""


def sends_deltas(mode: DeltaMode, wire_dtype: torch.dtype, param_dtype: torch.dtype, adapters: bool) -> bool:
    """Whether a run keeps a copy and sends deltas (`weight_sync.delta`): "always", or "auto" with a wire dtype
    narrower than the trainer's weights; an adapter-only sync (LoRA) never does."""
    if adapters or mode == "never":
        return False
    return mode == "always" or torch.finfo(wire_dtype).bits < torch.finfo(param_dtype).bits


class DeltaRejected(RuntimeError):
    """A delta (or a full version's copy) that must not be served: the replica keeps its version and needs a full one."""


@dataclass(frozen=True)
class TensorEntry:
    """One published tensor: its names (tied ones share the bytes), shape and wire dtype."""

    names: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Block:
    """Flat elements [start, end) of tensor `tensor` (an index into `Manifest.tensors`), and the CRC32 of their bytes."""

    tensor: int
    start: int
    end: int
    crc: int


@dataclass(frozen=True)
class ChunkInfo:
    rank: int
    seq: int
    nbytes: int
    crc: int


@dataclass(frozen=True)
class Manifest:
    """What a version is and how it travels; written last, so a reader never sees a half-published version."""

    policy_version: int
    tensors: tuple[TensorEntry, ...]
    blocks: tuple[Block, ...]
    base_version: int | None = None
    """None: a full version (the transport's usual keys carry it)."""
    base_digest: str | None = None
    chunks: tuple[ChunkInfo, ...] = ()
    full_bytes: int = 0
    """What the version costs sent whole."""
    changed: int = 0
    elements: int = 0

    @property
    def digest(self) -> str:
        return digest(self.blocks)

    @property
    def is_delta(self) -> bool:
        return self.base_version is not None

    @property
    def payload_bytes(self) -> int:
        """Bytes this version carries: the chunks (a delta) or the whole state (a full version), plus the manifest."""
        body = sum(chunk.nbytes for chunk in self.chunks) if self.is_delta else self.full_bytes
        return body + len(pickle.dumps(self))


def digest(blocks: tuple[Block, ...] | list[Block]) -> str:
    """The version's exact content, as one string (SHA-256 over every block's place and CRC)."""
    ordered = sorted((block.tensor, block.start, block.end, block.crc) for block in blocks)
    return hashlib.sha256(repr(ordered).encode()).hexdigest()


def crc(tensor: torch.Tensor) -> int:
    """CRC32 of a contiguous tensor's bytes (read on the host)."""
    flat = tensor.detach().reshape(-1)
    flat = flat if flat.device.type == "cpu" else flat.cpu()
    return zlib.crc32(memoryview(flat.contiguous().view(torch.uint8).numpy()))


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(INT_VIEWS[tensor.element_size()])


BIT_GATHER = 0x0102040810204080
"""Multiplying 8 bytes of 0/1 (as one little-endian int64) by this moves byte i's bit to bit 56 + i: one multiply and a
shift pack 8 flags (the shifts-and-sum form costs twice the time on a CPU)."""


def pack_bits(mask: torch.Tensor) -> torch.Tensor:
    """bool [n] -> uint8 [ceil(n / 8)], element i at bit i % 8 of byte i // 8."""
    flags = mask.view(torch.uint8)
    if mask.numel() % 8:
        flags = torch.nn.functional.pad(flags, (0, -mask.numel() % 8))
    return ((flags.view(torch.int64) * BIT_GATHER) >> 56).to(torch.uint8)


def unpack_bits(packed: torch.Tensor, n: int) -> torch.Tensor:
    """uint8 [ceil(n / 8)] -> bool [n] (`pack_bits` undone)."""
    shifts = torch.arange(8, dtype=torch.uint8, device=packed.device)
    return ((packed.unsqueeze(1) >> shifts) & 1).view(-1)[:n].bool()


def _padded(data: torch.Tensor) -> torch.Tensor:
    raw = data.reshape(-1).view(torch.uint8)
    return torch.nn.functional.pad(raw, (0, -raw.numel() % ALIGN))


def _record(tensor: int, kind: int, start: int, length: int, values: torch.Tensor, *prefix: torch.Tensor) -> list:
    body = [_padded(part) for part in prefix] + [_padded(values)]
    nbytes = sum(part.numel() for part in body)
    header = torch.tensor([MAGIC, tensor, kind, start, length, values.numel(), nbytes], dtype=torch.int64)
    return [header.view(torch.uint8), *body]


def record_sizes(length: int, changed: int, element_size: int) -> dict[int, int]:
    """Bytes each record kind takes for a block of `length` elements, `changed` of them changed (headers left out)."""
    up = lambda n: -(-n // ALIGN) * ALIGN
    sizes = {DENSE: up(length * element_size), BITMAP: up(-(-length // 8)) + up(changed * element_size)}
    if length < 2**31:  # offsets are int32
        sizes[INDEX] = up(4 * changed) + up(changed * element_size)
    return sizes


def encode_block(tensor: int, start: int, new: torch.Tensor, old: torch.Tensor) -> tuple[list[torch.Tensor], int]:
    """The cheapest record taking flat block `old` to `new` (same dtype; none when no bit changed), as host uint8
    pieces, and the changed element count. `start`: the block's first element in the whole tensor."""
    mask = _bits(new) != _bits(old)  # [n] bool
    changed = int(torch.count_nonzero(mask))
    if changed == 0:
        return [], 0
    sizes = record_sizes(new.numel(), changed, new.element_size())
    kind = min(sizes, key=sizes.get)
    if kind == DENSE:
        return _record(tensor, DENSE, start, new.numel(), new.cpu()), changed
    if kind == INDEX:
        offsets = mask.nonzero().view(-1)
        return _record(tensor, INDEX, start, new.numel(), new[offsets].cpu(), offsets.to(torch.int32).cpu()), changed
    return _record(tensor, BITMAP, start, new.numel(), new[mask].cpu(), pack_bits(mask).cpu()), changed


def chunks_of(pieces: list[torch.Tensor], rank: int) -> tuple[list[torch.Tensor], list[ChunkInfo]]:
    """A rank's record stream cut into chunks of at most `CHUNK_BYTES`, and what the manifest says of each."""
    stream = torch.cat(pieces) if pieces else torch.empty(0, dtype=torch.uint8)
    chunks = [stream[at : at + CHUNK_BYTES].clone() for at in range(0, stream.numel(), CHUNK_BYTES)]
    return chunks, [ChunkInfo(rank, seq, chunk.numel(), crc(chunk)) for seq, chunk in enumerate(chunks)]


def local_block(tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The elements of a published tensor this rank holds, flat, and where they start in the whole (flat) tensor: a
    DTensor's dim-0 shard (FSDP2's placement), or the tensor itself."""
    if not isinstance(tensor, DTensor):
        return tensor.detach().reshape(-1), 0
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    local = tensor.to_local().detach()
    if tensor.placements != (Shard(0),):  # a replicated placement would be sent, and counted, by every rank
        raise NotImplementedError(f"delta sync needs dim-0 shards on a 1-D mesh, got placements {tensor.placements}")
    _, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
    return local.reshape(-1), offset[0] * math.prod(tensor.shape[1:])


@dataclass
class _Kept:
    entry: TensorEntry
    start: int
    copy: torch.Tensor
    """[n] flat, in the wire dtype: this rank's block of the last published version."""
    source: torch.Tensor
    """The tensor it was taken from (a DTensor keeps its mesh and placements, to publish the copy in full again)."""


@dataclass
class Encoded:
    """One rank's part of a version: its records as chunks, its blocks' CRCs, and what changed."""

    chunks: list[torch.Tensor]
    infos: list[ChunkInfo]
    blocks: list[Block]
    changed: int
    elements: int


class PublishedCopy:
    """The trainer's copy of the last published version in the wire dtype (this rank's shards, on the weights' device).

    `update` brings it to the new weights and returns the records that take a generator from the old copy to the
    new one; `state_dict` is the copy as a state dict of the original shapes (DTensors again when sharded), what a full
    version publishes, so a full version and the deltas after it describe the same bytes."""

    def __init__(self) -> None:
        self.kept: list[_Kept] = []
        self.blocks: list[Block] = []
        """This rank's blocks of the copy, as the last `update` described them (a version published again whole from the
        copy names the same blocks, so it has the same digest and the next delta applies onto it)."""
        self.policy_version: int | None = None
        self.digest: str | None = None

    def update(self, state_dict: dict[str, torch.Tensor], dtype: torch.dtype, ranks: Ranks) -> Encoded:
        """Cast `state_dict` to `dtype` into the copy; the records from the previous copy (none when there was no copy
        yet: only a full version can follow). Tied tensors once; replicated (non-DTensor) entries of a sharded state dict
        by rank 0 alone."""
        groups: dict[int, list[str]] = {}
        first: dict[int, torch.Tensor] = {}
        for name, tensor in state_dict.items():
            key = id(tensor) if isinstance(tensor, DTensor) else tensor.data_ptr()
            groups.setdefault(key, []).append(name)
            first.setdefault(key, tensor)
        fresh = not self.kept
        pieces: list[torch.Tensor] = []
        blocks: list[Block] = []
        changed = elements = 0
        with torch.no_grad():
            for index, (key, names) in enumerate(groups.items()):
                tensor = first[key]
                out = dtype if tensor.is_floating_point() else tensor.dtype
                entry = TensorEntry(tuple(names), tuple(tensor.shape), str(out).removeprefix("torch."))
                if fresh:
                    self.kept.append(_Kept(entry, 0, torch.empty(0), tensor))
                kept = self.kept[index]
                if kept.entry != entry:
                    raise ValueError(f"published tensors changed: {kept.entry} became {entry}")
                if not isinstance(tensor, DTensor) and ranks.world > 1 and ranks.rank != 0:
                    continue
                local, start = local_block(tensor)
                new = local.to(out)
                if fresh:
                    kept.copy, kept.start, kept.source = new.clone(), start, tensor
                    changed += new.numel()
                else:
                    record, count = encode_block(index, start, new, kept.copy)
                    pieces += record
                    changed += count
                    if count:
                        kept.copy.copy_(new)
                elements += new.numel()
                blocks.append(Block(index, start, start + new.numel(), crc(kept.copy)))
        chunks, infos = chunks_of(pieces, ranks.rank)
        self.blocks = blocks
        return Encoded(chunks, infos, blocks, changed, elements)

    @property
    def tensors(self) -> tuple[TensorEntry, ...]:
        return tuple(kept.entry for kept in self.kept)

    def state_dict(self, ranks: Ranks) -> dict[str, torch.Tensor]:
        """The copy under every published name, in its original shapes (DTensor shards again; ties one object)."""
        out: dict[str, torch.Tensor] = {}
        for kept in self.kept:
            source = kept.source
            if isinstance(source, DTensor):
                local = kept.copy.view(source.to_local().shape)
                tensor = DTensor.from_local(
                    local, source.device_mesh, source.placements, run_check=False, shape=source.shape,
                    stride=source.stride(),
                )  # fmt: skip
            elif ranks.world > 1 and ranks.rank != 0:
                tensor = torch.empty(kept.entry.shape, dtype=getattr(torch, kept.entry.dtype), device=source.device)
            else:
                tensor = kept.copy.view(kept.entry.shape)
            for name in kept.entry.names:
                out[name] = tensor
        return out


def whole_manifest(
    policy_version: int,
    tensors: tuple[TensorEntry, ...],
    parts: list[Encoded],
    *,
    base: tuple[int, str] | None,
) -> Manifest:
    """The manifest of a version from every rank's part (`base`: (version, digest) of a delta's base; None: full)."""
    blocks = tuple(block for part in parts for block in part.blocks)
    full_bytes = sum(
        entry.numel * torch.empty((), dtype=getattr(torch, entry.dtype)).element_size() for entry in tensors
    )
    return Manifest(
        policy_version,
        tensors,
        blocks,
        base_version=None if base is None else base[0],
        base_digest=None if base is None else base[1],
        chunks=tuple(info for part in parts for info in part.infos) if base is not None else (),
        full_bytes=full_bytes,
        changed=sum(part.changed for part in parts),
        elements=sum(part.elements for part in parts),
    )


@dataclass(frozen=True)
class Record:
    """One parsed, checked record: what to write into tensor `tensor` (flat element positions)."""

    tensor: int
    kind: int
    start: int
    length: int
    values: torch.Tensor
    where: torch.Tensor | None = None
    """INDEX: int64 offsets in the block; BITMAP: bool mask over the block; DENSE: None."""


def parse_stream(stream: torch.Tensor, tensors: tuple[TensorEntry, ...]) -> list[Record]:
    """Every record of a rank's byte stream, each checked against the tensor it writes; raises `DeltaRejected` on any
    inconsistency (bad magic, unknown tensor or kind, a range outside the tensor, a body that overruns the stream,
    offsets not strictly increasing, a bitmap whose set bits are not the value count, bytes left over)."""
    records: list[Record] = []
    at = 0
    total = stream.numel()
    while at < total:
        if total - at < HEADER * 8:
            raise DeltaRejected(f"truncated record header at byte {at} of {total}")
        magic, tensor, kind, start, length, count, nbytes = stream[at : at + HEADER * 8].view(torch.int64).tolist()
        at += HEADER * 8
        if magic != MAGIC:
            raise DeltaRejected(f"no record at byte {at - HEADER * 8} (bad magic)")
        if not 0 <= tensor < len(tensors) or kind not in (DENSE, INDEX, BITMAP):
            raise DeltaRejected(f"record names tensor {tensor}, kind {kind}: unknown")
        entry = tensors[tensor]
        if not (start >= 0 and length > 0 and start + length <= entry.numel and 0 < count <= length):
            raise DeltaRejected(f"record of {entry.names[0]}: elements [{start}, {start + length}) of {entry.numel}")
        if nbytes < 0 or at + nbytes > total:
            raise DeltaRejected(f"record of {entry.names[0]} runs past the end of the payload (truncated)")
        body = stream[at : at + nbytes]
        at += nbytes
        dtype = getattr(torch, entry.dtype)
        size = torch.empty((), dtype=dtype).element_size()
        prefix = {DENSE: 0, INDEX: 4 * count, BITMAP: -(-length // 8)}[kind]
        prefix_padded = -(-prefix // ALIGN) * ALIGN
        if kind == DENSE and count != length:
            raise DeltaRejected(f"dense record of {entry.names[0]} holds {count} of {length} values")
        if prefix_padded + count * size > nbytes:
            raise DeltaRejected(f"record of {entry.names[0]} is shorter than its values (truncated)")
        values = body[prefix_padded : prefix_padded + count * size].view(dtype)
        where = None
        if kind == INDEX:
            where = body[: 4 * count].view(torch.int32).to(torch.int64)
            if where[0] < 0 or where[-1] >= length or (count > 1 and not bool((where[1:] > where[:-1]).all())):
                raise DeltaRejected(f"offsets of {entry.names[0]} out of range or not strictly increasing")
        elif kind == BITMAP:
            where = unpack_bits(body[:prefix], length)
            if (marked := int(torch.count_nonzero(where))) != count:
                raise DeltaRejected(f"bitmap of {entry.names[0]} marks {marked} elements, {count} values")
        records.append(Record(tensor, kind, start, length, values, where))
    return records


def apply_record(target: torch.Tensor, record: Record) -> None:
    """Write one record into `target` (the whole tensor, flat [numel]; the record's tensors on its device)."""
    block = target[record.start : record.start + record.length]
    if record.kind == DENSE:
        block.copy_(record.values)
    else:
        block[record.where] = record.values


def stage(manifest: Manifest, received: list[tuple[int, int, torch.Tensor]]) -> list[Record]:
    """Check the chunks of a delta against `manifest` and parse them; nothing is written. `received`: (rank, seq,
    bytes) as they arrived. Raises `DeltaRejected` on a missing, duplicated, unexpected, truncated or corrupted chunk."""
    expected = {(info.rank, info.seq): info for info in manifest.chunks}
    seen: dict[tuple[int, int], torch.Tensor] = {}
    for rank, seq, chunk in received:
        if (rank, seq) in seen:
            raise DeltaRejected(f"chunk {seq} of rank {rank} arrived twice")
        if (rank, seq) not in expected:
            raise DeltaRejected(f"chunk {seq} of rank {rank} is not in version {manifest.policy_version}'s manifest")
        info = expected[(rank, seq)]
        if chunk.numel() != info.nbytes:
            raise DeltaRejected(f"chunk {seq} of rank {rank}: {chunk.numel()} bytes, {info.nbytes} published")
        if crc(chunk) != info.crc:
            raise DeltaRejected(f"chunk {seq} of rank {rank}: CRC mismatch")
        seen[(rank, seq)] = chunk
    if missing := sorted(set(expected) - set(seen)):
        raise DeltaRejected(f"chunks missing (rank, seq): {missing[:5]}")
    records: list[Record] = []
    for rank in sorted({rank for rank, _ in expected}):
        stream = torch.cat([seen[(rank, seq)] for seq in sorted(seq for r, seq in expected if r == rank)])
        records += parse_stream(stream, manifest.tensors)
    return records


@dataclass
class ResidentWeights:
    """A generator's own copy of the version it serves: one shared file vLLM's workers load from, its version, and its
    digest (None once its content is not known: a failed apply)."""

    handle: SharedWeights | None = None
    buffer: torch.Tensor | None = None
    policy_version: int | None = None
    digest: str | None = None

    def tensor(self, manifest: Manifest, index: int) -> list[torch.Tensor]:
        """Every flat view of published tensor `index` in the file (one per copy of a tied tensor)."""
        entry = manifest.tensors[index]
        offsets: dict[int, torch.Tensor] = {}
        for name in entry.names:
            if name not in self.handle.layout:
                raise DeltaRejected(f"{name}: not in this generator's weights")
            where = self.handle.layout[name]
            if tuple(where[1]) != entry.shape or where[2] != entry.dtype:
                raise DeltaRejected(f"{name}: held as {where[1]} {where[2]}, published {entry.shape} {entry.dtype}")
            offsets.setdefault(where[0], view(self.buffer, *where).view(-1))
        return list(offsets.values())

    def install(self, state_dict: dict[str, torch.Tensor], manifest: Manifest) -> SharedWeights:
        """A full version: `state_dict` copied into the file (made anew when the layout differs), then proven to have
        the manifest's digest."""
        layout, nbytes = plan_layout(state_dict, None, key=lambda tensor: tensor.data_ptr())
        if self.handle is None or self.handle.layout != layout:
            self.close()
            path = file_path(f"resident-{manifest.policy_version}")  # a new name: workers map files by name
            self.handle, self.buffer = SharedWeights(path, nbytes, layout), map_file(path, nbytes, create=True)
        self.policy_version = self.digest = None
        with torch.no_grad():
            written: set[int] = set()
            for name, tensor in state_dict.items():
                if layout[name][0] not in written:
                    written.add(layout[name][0])
                    view(self.buffer, *layout[name]).copy_(tensor)
        self._prove(manifest)
        return self.handle

    def apply(self, manifest: Manifest, records: list[Record]) -> SharedWeights:
        """A staged delta (`stage`), applied only onto its base; raises `DeltaRejected` before writing when this copy is
        not the base, and after writing (the copy then counts as unknown) when the result is not the version."""
        if self.handle is None or self.digest is None:
            raise DeltaRejected(f"no known base here for the delta of version {manifest.policy_version}")
        if (self.policy_version, self.digest) != (manifest.base_version, manifest.base_digest):
            raise DeltaRejected(
                f"delta of version {manifest.policy_version} is against version {manifest.base_version} "
                f"({str(manifest.base_digest)[:12]}), this generator holds {self.policy_version} ({self.digest[:12]})"
            )
        targets = {index: self.tensor(manifest, index) for index in {record.tensor for record in records}}
        self.policy_version = self.digest = None  # from the first write until proven
        with torch.no_grad():
            for record in records:
                for target in targets[record.tensor]:
                    apply_record(target, record)
        self._prove(manifest)
        return self.handle

    def _prove(self, manifest: Manifest) -> None:
        """The file holds exactly `manifest`'s version: every block's CRC (every copy of a tied tensor), the blocks
        covering every tensor once."""
        covered = [0] * len(manifest.tensors)
        for block in manifest.blocks:
            covered[block.tensor] += block.end - block.start
            for target in self.tensor(manifest, block.tensor):
                if crc(target[block.start : block.end]) != block.crc:
                    raise DeltaRejected(
                        f"version {manifest.policy_version}: {manifest.tensors[block.tensor].names[0]} "
                        f"[{block.start}, {block.end}) differs from the published bytes"
                    )
        if covered != [entry.numel for entry in manifest.tensors]:
            raise DeltaRejected(f"version {manifest.policy_version}: its blocks do not cover every tensor once")
        self.policy_version, self.digest = manifest.policy_version, manifest.digest

    def close(self) -> None:
        if self.handle is not None:
            Path(self.handle.path).unlink(missing_ok=True)
        self.handle = self.buffer = None
        self.policy_version = self.digest = None
