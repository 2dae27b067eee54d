"""Versioned policy weights in torchstore: the trainer pushes, generators pull.

Topology: ``initialize_store()`` runs once in the launcher. torchstore's ``Controller`` (metadata only) is a
named singleton ("TorchStore") spawned in the launcher's process by monarch's ``_ControllerController``; every
actor spawned from the launcher (directly or transitively) inherits that handle, so ``push_state_dict`` /
``pull_state_dict`` find the store by name from any process, without passing handles around. The tensors live in
``StorageVolume`` actors, and where depends on where the trainer runs:
- trainer on the launcher's host: one volume in the launcher's process (``ControllerStorageVolumes``, as
  torchforge does it): no extra process to start or stop;
- trainer on hosts of its own (a cluster): one volume per trainer host, in a process of its own there
  (``TrainerHostVolumes``). Each rank puts its shards into its own host's volume and generators read them from
  the trainer hosts, so the launcher (on Slurm, the login node) holds no weight bytes and carries none over
  its network.
Modules defining such actors must import this module (or ``rl.weights.torchstore_compat``) at top level so
the compat patch also runs in their process.

Each version is stored as ``policy/v{N}/<param>`` plus ``policy/v{N}/MAPPING``; torchstore writes
``MAPPING`` last, so pulling a version whose push has not finished fails instead of returning a
partial state dict. On one host the bytes can skip the store instead (``WeightPublisher`` with
``weight_sync.transport = "shared_memory"``): they go through a shared-memory file and the store
carries only a versioned handle, written last as the commit marker.

A sharded trainer (FSDP2 ranks) publishes from every rank and no rank ever holds a full copy: through
the store each rank puts its own DTensor shards (torchstore assembles whole tensors for the readers, so
a generator of any tensor-parallel size loads them), and rank 0 writes ``MAPPING`` after a barrier; through
shared memory the ranks gather one parameter at a time and rank 0 copies it into the file.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.tensor import DTensor

from rl.training.distributed import Ranks
from rl.weights.attestation import Fingerprints, TensorPrint, fingerprint, fingerprint_state_dict
from rl.weights.shared_file import (
    ALIGN,
    SHM_DIR,
    SHM_PREFIX,
    SharedWeights,
    file_path,
    map_file,
    pin_for_device_copies,
    plan_layout,
    shm_free_bytes,
    view,
    write,
)
from rl.weights.torchstore_compat import import_torchstore

if TYPE_CHECKING:
    from rl.config import Config

ts = import_torchstore()

KEY_PREFIX = "policy/v"


def policy_key(policy_version: int) -> str:
    """The torchstore key of one policy version's state dict."""
    return f"{KEY_PREFIX}{policy_version}"


class TrainerHostVolumes(ts.TorchStoreStrategy):
    """One storage volume per trainer host; a trainer rank puts into its own host's volume.

    The volumes are spawned on a mesh of one process per trainer host, so a volume's rank in it is its host's
    index; a rank's host index is its GROUP_RANK (set by the trainer's rendezvous, `rl.processes.trainer_mesh`;
    absent for a one-rank trainer, whose one host is 0). Readers find each key's volumes through the controller.
    """

    @classmethod
    def get_volume_id(cls) -> str:
        from monarch.actor import current_rank

        return str(current_rank().rank)

    @classmethod
    def get_client_id(cls) -> str:
        return os.environ.get("GROUP_RANK", "0")


async def initialize_store(volume_procs: Any = None) -> None:
    """Start the store; call once, from the launcher, before any actor pushes or pulls. `volume_procs`: a proc mesh of
    one process per trainer host to hold the tensors (None: the launcher's process holds them)."""
    if volume_procs is None:
        await ts.initialize(strategy=ts.ControllerStorageVolumes())
    else:
        hosts = volume_procs.extent["hosts"]
        await ts.initialize(num_storage_volumes=hosts, strategy=TrainerHostVolumes(), mesh=volume_procs)


async def shutdown_store(timeout_s: float = 10) -> None:
    """Drop all stored data and metadata (launcher only); ``initialize_store()`` may follow again. A volume on a lost
    host may never answer: after `timeout_s` this process's client is dropped anyway, so a next run builds its own."""
    try:
        await asyncio.wait_for(ts.shutdown(), timeout_s)
    finally:
        ts.reset_client()


async def stored_versions() -> list[int]:
    """Policy versions currently in the store, ascending.

    Filters ``keys()`` here: torchstore's prefix filter splits keys on "." and misses "/" prefixes.
    """
    keys = [k for k in await ts.keys() if k.startswith(KEY_PREFIX)]
    return sorted({int(k[len(KEY_PREFIX) :].split("/", 1)[0]) for k in keys})


async def _delete_version(policy_version: int) -> None:
    """Delete all keys of one version; ``MAPPING`` first so readers fail fast, not half-read."""
    prefix = policy_key(policy_version) + "/"
    await ts.delete(prefix + "MAPPING")
    keys = [k for k in await ts.keys() if k.startswith(prefix)]
    await asyncio.gather(*(ts.delete(k) for k in keys))


async def push_state_dict(state_dict: dict[str, torch.Tensor], policy_version: int, *, keep_versions: int = 1) -> None:
    """Store ``state_dict`` as ``policy_version`` and delete all but the newest ``keep_versions``.

    Use ``keep_versions >= 2`` if generators may still be pulling the previous version.
    """
    if keep_versions < 1:
        raise ValueError(f"keep_versions must be >= 1, got {keep_versions}")
    await ts.put_state_dict(state_dict, policy_key(policy_version))
    for stale in (await stored_versions())[:-keep_versions]:
        await _delete_version(stale)


async def push_sharded_state_dict(
    state_dict: dict[str, torch.Tensor], policy_version: int, ranks: Ranks, *, keep_versions: int = 1
) -> None:
    """``push_state_dict`` from every rank of a sharded trainer: each puts its shards, rank 0 commits and prunes.

    torchstore makes a DTensor key whole only once every rank has put its shard, so ``MAPPING`` (the marker
    readers wait for) is written after a barrier; replicated (non-DTensor) entries are put by rank 0 alone.
    """
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    flat, mapping = flatten_state_dict(state_dict)
    prefix = policy_key(policy_version) + "/"
    for name, value in flat.items():
        if isinstance(value, DTensor) or ranks.rank == 0:
            await ts.put(prefix + name, value)
    ranks.barrier()
    if ranks.rank == 0:
        await ts.put(prefix + "MAPPING", mapping)
        for stale in (await stored_versions())[:-keep_versions]:
            await _delete_version(stale)


async def pull_state_dict(
    policy_version: int, *, template: dict[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """Fetch ``policy_version``; with ``template`` (same keys) the values are copied into its tensors."""
    return await ts.get_state_dict(policy_key(policy_version), user_state_dict=template)


def parameter_bytes(model_path: str, dtype: torch.dtype) -> int | None:
    """Bytes of the model's parameters in `dtype` (tied ones once), from its config alone; None for a hub id
    whose files are not on this machine."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rl.assets import resolve_model_path

    path = resolve_model_path(model_path)
    if not Path(path).is_dir():
        return None
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    return sum(p.numel() for p in model.parameters()) * torch.empty((), dtype=dtype).element_size()


def shared_memory_needed(config: Config) -> int | None:
    """Bytes the weight files take in `SHM_DIR` on the launcher's host: the trainer's two slots ("shared_memory"),
    or a staging file per local generator replica ("torchstore"), and with delta sync a resident copy per local
    generator replica (`rl.weights.delta`); None when the model's size is not known here."""
    from rl.precision import TORCH_DTYPES
    from rl.weights.delta import sends_deltas

    local_generators = 0 if config.cluster.hosts.generator else config.generator.num_replicas
    files = 2 if config.weight_sync.transport == "shared_memory" else local_generators
    wire, master = TORCH_DTYPES[config.generator.dtype], TORCH_DTYPES[config.trainer.param_dtype]
    files += local_generators * sends_deltas(config.weight_sync.delta, wire, master, config.trainer.lora.enabled)
    if files == 0:
        return 0
    size = parameter_bytes(config.model.path, TORCH_DTYPES[config.generator.dtype])
    return None if size is None else files * size


def check_shared_memory(config: Config) -> None:
    """Refuse a run whose weight files do not fit in `SHM_DIR` (Docker sizes /dev/shm at 64 MB: the first sync
    would die of SIGBUS). Weight files of dead runs are removed first."""
    remove_dead_shared_files()
    needed = shared_memory_needed(config)
    free = shm_free_bytes()
    if needed is not None and needed > free:
        raise ValueError(
            f"weight sync needs {needed / 2**20:.0f} MiB in {SHM_DIR} ({config.weight_sync.transport}: "
            f"{config.model.path} in {config.generator.dtype}), only {free / 2**20:.0f} MiB free. Enlarge it "
            "(docker run --shm-size=16g; Kubernetes: a memory-backed emptyDir on /dev/shm)"
        )


def remove_dead_shared_files() -> None:
    """Delete weight files left by trainer processes that no longer exist (a killed run)."""
    for path in SHM_DIR.glob(f"{SHM_PREFIX}*"):
        pid = int(path.name[len(SHM_PREFIX) :].split("-", 1)[0])
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            path.unlink(missing_ok=True)
        except PermissionError:
            pass


def payload_bytes(state_dict: dict[str, torch.Tensor], dtype: torch.dtype) -> int:
    """Bytes a version of `state_dict` carries when floating tensors travel in `dtype` (tied tensors once, whole
    sizes for DTensor shards): what `weight_sync/bytes` reports."""
    seen: set[int] = set()
    total = 0
    for tensor in state_dict.values():
        key = id(tensor) if isinstance(tensor, DTensor) else tensor.data_ptr()
        if key in seen:
            continue
        seen.add(key)
        out_dtype = dtype if tensor.is_floating_point() else tensor.dtype
        total += tensor.numel() * torch.empty((), dtype=out_dtype).element_size()
    return total


def fingerprint_sharded(state_dict: dict[str, torch.Tensor], policy_version: int, ranks: Ranks) -> Fingerprints | None:
    """`fingerprint_state_dict` of a sharded state dict, on rank 0 (None elsewhere); every rank must call it.

    Each DTensor is gathered whole (a collective), fingerprinted and freed before the next: a rank holds one whole
    tensor at a time, never the whole model. Plain (replicated) entries are read where they are, a tied one once."""
    seen: set[int] = set()
    tensors: dict[str, TensorPrint] = {}
    for name, tensor in state_dict.items():
        if isinstance(tensor, DTensor):
            tensor = tensor.full_tensor()  # collective; the next iteration drops it
        elif tensor.data_ptr() in seen:
            continue
        else:
            seen.add(tensor.data_ptr())  # kept alive by `state_dict`: no later tensor reuses the address
        if ranks.rank == 0:
            tensors[name] = fingerprint(name, tensor)
        del tensor  # before the next gather: one whole tensor at a time
    return Fingerprints(policy_version, tensors) if ranks.rank == 0 else None


def _timed(fingerprints: Fingerprints, start: float) -> Fingerprints:
    return dataclasses.replace(fingerprints, seconds=time.perf_counter() - start)


class WeightPublisher:
    """Trainer side: publish a state dict as a policy version.

    "torchstore" sends every tensor through the store. "shared_memory" copies (and casts) the
    tensors into one of two shared files on this host, alternating by version parity so a version
    being read is never overwritten by the next, then puts only the `SharedWeights` handle in the
    store. The controller reloads every generator before the next push, so two slots suffice.
    """

    def __init__(self, transport: str, namespace: str = ""):
        """`namespace`: prefixes this publisher's store keys and files, so that several policies (LoRA tenants,
        `rl.loop.tenants`) publish their own version numbers side by side (shared memory only)."""
        self.transport = transport
        self.namespace = namespace
        self._slots: dict[int, tuple[SharedWeights, torch.Tensor]] = {}

    def _slot(
        self, policy_version: int, state_dict: dict[str, torch.Tensor], dtype: torch.dtype
    ) -> tuple[SharedWeights, torch.Tensor]:
        slot = policy_version % 2
        if slot not in self._slots:
            layout, nbytes = plan_layout(  # DTensor parameters: tied ones are one object
                state_dict, dtype, key=lambda tensor: id(tensor) if isinstance(tensor, DTensor) else tensor.data_ptr()
            )
            path = file_path(f"{self.namespace}{slot}")
            self._slots[slot] = (SharedWeights(path, nbytes, layout), map_file(path, nbytes, create=True))
            if any(tensor.is_cuda for tensor in state_dict.values()):
                pin_for_device_copies(self._slots[slot][1])  # GPU weights reach the file at pinned speed
        return self._slots[slot]

    async def publish(
        self,
        state_dict: dict[str, torch.Tensor],
        policy_version: int,
        dtype: torch.dtype,
        ranks: Ranks = Ranks(),
        *,
        fingerprint: bool = False,
    ) -> Fingerprints | None:
        """Every rank calls this with its (sharded) state dict; the version is readable once all have returned.

        `fingerprint`: rank 0 also returns the version's fingerprints (`rl.weights.attestation`), taken from the
        bytes as published (the shared file itself, or the cast tensors put in the store)."""
        if self.transport == "torchstore":
            cast = {k: v.detach().to(dtype) if v.is_floating_point() else v.detach() for k, v in state_dict.items()}
            if ranks.world == 1:
                await push_state_dict(cast, policy_version, keep_versions=2)
            else:
                await push_sharded_state_dict(cast, policy_version, ranks, keep_versions=2)
            if not fingerprint:
                return None
            start = time.perf_counter()
            fingerprints = fingerprint_sharded(cast, policy_version, ranks)
            return _timed(fingerprints, start) if fingerprints is not None else None
        handle, buffer = self._slot(policy_version, state_dict, dtype) if ranks.rank == 0 else (None, None)
        written: set[int] = set()
        with torch.no_grad():
            for name, tensor in state_dict.items():
                if isinstance(tensor, DTensor):
                    tensor = tensor.full_tensor()  # collective: one parameter whole at a time, on every rank
                if ranks.rank != 0:
                    continue
                offset = handle.layout[name][0]
                if offset not in written:  # a tied weight is copied once
                    written.add(offset)
                    write(buffer, handle.layout[name], tensor)
        if ranks.rank != 0:
            return None
        await ts.put(self.namespace + policy_key(policy_version) + "/HANDLE", handle)
        stale = self.namespace + policy_key(policy_version - 2) + "/HANDLE"
        if policy_version >= 2 and await ts.exists(stale):
            await ts.delete(stale)
        if not fingerprint:
            return None
        start = time.perf_counter()
        published = {name: view(buffer, *entry) for name, entry in handle.layout.items()}  # ties share their bytes
        return _timed(fingerprint_state_dict(published, policy_version), start)

    def close(self) -> None:
        """Remove the shared files (the generators' mappings stay valid until they exit)."""
        for handle, _ in self._slots.values():
            Path(handle.path).unlink(missing_ok=True)
        self._slots.clear()


class WeightReceiver:
    """Generator side: the `SharedWeights` handle of a published version, for vLLM's workers to load.

    With "shared_memory" it is the trainer's own file. With "torchstore" the version's tensors are fetched one at a
    time and written into a file of this process (one, reused: each reload finishes before the next pull), so vLLM's
    workers, which may be other processes, load every version the same way, and a pull holds one fetched tensor at a
    time (torchstore's transport keeps up to three copies of it while it arrives) beside what the process held before. The file is written with `pwrite`, never mapped here, so its pages
    are not this process's resident memory.
    """

    def __init__(self, transport: str):
        self.transport = transport
        self._staging: SharedWeights | None = None

    async def pull(self, policy_version: int, namespace: str = "") -> SharedWeights:
        """`namespace`: the publisher's (`WeightPublisher`)."""
        if self.transport == "shared_memory":
            return await ts.get(namespace + policy_key(policy_version) + "/HANDLE")
        names = list(await ts.get(policy_key(policy_version) + "/MAPPING"))  # written last: the version is whole
        if self._staging is not None and list(self._staging.layout) == names:
            handle = await self._fetch_into(policy_version, names, self._staging)
            if handle is not None:
                return handle
        self.close()  # first pull, or the version's tensors no longer fit the file's layout
        self._staging = await self._fetch_into(policy_version, names, None)
        return self._staging

    async def _fetch_into(
        self, policy_version: int, names: list[str], staging: SharedWeights | None
    ) -> SharedWeights | None:
        """Fetch each tensor of the version and write it at its place: into `staging` when given (None when a tensor's
        shape or dtype differs from that file's layout), else into a new file laid out as `plan_layout` would."""
        path = staging.path if staging is not None else file_path(f"staging-{policy_version}")  # workers map by name
        layout: dict[str, tuple[int, tuple[int, ...], str]] = {}
        nbytes = 0
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            for name in names:
                tensor = await ts.get(f"{policy_key(policy_version)}/{name}")
                entry = (nbytes, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."))
                if staging is not None and staging.layout[name] != entry:
                    return None
                layout[name] = entry
                _pwrite_all(fd, tensor, nbytes, path)
                nbytes += -(-tensor.numel() * tensor.element_size() // ALIGN) * ALIGN
                del tensor  # before the next fetch: one tensor at a time
            os.ftruncate(fd, nbytes)
        except BaseException:
            if staging is None:  # a new file no handle names yet (a full /dev/shm, a failed fetch)
                Path(path).unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        return SharedWeights(path, nbytes, layout)

    def close(self) -> None:
        """Remove the staging file (mappings stay valid until their processes exit)."""
        if self._staging is not None:
            Path(self._staging.path).unlink(missing_ok=True)
            self._staging = None


def _pwrite_all(fd: int, tensor: torch.Tensor, offset: int, path: str) -> None:
    """Write `tensor`'s bytes at `offset` of the open file `fd` (`os.pwrite` may write fewer bytes than asked)."""
    data = memoryview(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    while len(data):
        try:
            written = os.pwrite(fd, data, offset)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot write weights to {path}: {exc.strerror}") from None
        data, offset = data[written:], offset + written
