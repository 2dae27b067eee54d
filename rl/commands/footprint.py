"""What a run will hold on each of its hosts, estimated from the config and the model's sizes before anything starts
(`rlmesh validate` prints it; a Slurm job without `mem`/`cpus_per_task` is warned with it).

With P parameters (tied weights once), S state-dict elements (tied weights once per name) and b bytes per element:
- **trainer rank, host RAM**: with W > 1 ranks (W in all) each builds the model on the meta device and reads only its
  1/W of every tensor from the files (`rl.training.sharded_load`) in `trainer.param_dtype` (P/W x b; these are the
  master weights AdamW updates, fp32 unless `pure_low_precision`); files in another dtype pass through a read
  buffer of 1/W of each tensor in the files' dtype, freed before the next (the peak: the shards read so far, the
  tensor being read and its buffer: `sharded_load_bytes`), files in that dtype are read straight into the shard;
  a KL reference likewise (another P/W x b). One rank alone, or a LoRA policy (its adapters wrap the loaded layers),
  loads the whole model (P x b; a reference whole after it), and from files in another dtype holds the files'
  tensors too while it casts them (P x f). Every load adds the objects it builds (`load_overhead_bytes`). Training then holds 1/W of the
  weights, their gradients and AdamW's two moments (4 x P/W x b, + P/W x b for a reference) on `trainer.device`, and
  with delta sync (`rl.weights.delta`) its 1/W of the last published version in the generators' dtype (P/W x w). The
  compute dtype (`trainer.dtype`) adds transient copies and activations, not counted.
- **torchstore volumes** (`weight_sync.transport = "torchstore"`): every key of a version in the generators' dtype
  (S elements: a tied weight is put under each name), 2 versions kept and a third while a push lands, held where the
  trainer runs (`rl.weights.sync`): in the launcher's process when the trainer is on its host, else split over the
  trainer hosts (each holds its ranks' shards: 1/H of it). "shared_memory" puts only a handle there.
- **/dev/shm**: "shared_memory" keeps two slot files of P elements in the generators' dtype on rank 0's host;
  "torchstore" stages each generator replica's pull in one file of S elements on its own host (every key the store
  holds, a tied weight under each name); with delta sync each generator replica also keeps the version it serves in
  a file laid out as what it reads (its resident copy: S elements through torchstore, P from a slot).
- **checkpoints** (`rl.checkpoint.estimate`): each trainer host writes its ranks' share of every checkpoint; the run
  directory's filesystem holds `checkpoint.keep` + 1 full ones while a regular one commits.
Hosts of their own for the reward actors or frozen models hold none of the policy's bytes and are not listed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rl.checkpoint.estimate import ModelSize, checkpoint_bytes, model_size
from rl.config import Config
from rl.precision import TORCH_DTYPES

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class RankMemory:
    """One trainer rank's memory."""

    load_peak_bytes: int
    """Host RAM while the model (and a KL reference) load."""
    training_bytes: int
    """Its shard of weights, gradients and AdamW moments (and of a reference, and `published_copy_bytes`), on
    `trainer.device`."""
    device: str
    published_copy_bytes: int = 0
    """With delta sync: its shard of the last published version, in the generators' dtype."""


@dataclass(frozen=True)
class HostFootprint:
    """One kind of host of the run (`count` alike) and what it holds."""

    name: str
    count: int
    roles: list[str]
    trainer_ranks: int
    """Trainer ranks on each such host (each holds `Footprint.rank`)."""
    store_bytes: int
    """Resident in the torchstore volume, at its peak."""
    shm_bytes: int
    """Weight files in /dev/shm."""
    checkpoint_write_bytes: int
    """Bytes of each full checkpoint its ranks write."""


@dataclass(frozen=True)
class Footprint:
    model: ModelSize
    rank: RankMemory
    hosts: list[HostFootprint]
    checkpoint_bytes: int
    """One checkpoint of `checkpoint.final`'s kind, or a full one when regular ones are on."""
    checkpoint_disk_bytes: int
    """Most bytes of checkpoints on the run directory's filesystem at once."""


LOAD_FIXED_BYTES = 12 * 2**20
"""What a trainer rank's load allocates besides the tensors, for any model: the Python code and objects of the model's
transformers module, imported at the first build (4.7 MiB), and of the first model build and FSDP2 sharding. Measured
as a rank's resident growth over its load (`memory/trainer/load_growth_mb`) less its shard, on three models on a
2-core x86-64 CPU (torch 2.10, transformers 5): 12.5 MiB with 2 decoder layers, 16.6 with 30, 18.4 with 42; this
and `LOAD_BYTES_PER_LAYER` are the line through them."""

LOAD_BYTES_PER_LAYER = 150 * 2**10
"""What a load allocates per decoder layer besides its tensors: the layer's modules and parameter objects, built on
the meta device, then FSDP2's unit for it (its sharded parameters' DTensors and their bookkeeping); about 90 KiB of
it are Python objects (counted with `tracemalloc`), the rest torch's C++ objects. Measured with `LOAD_FIXED_BYTES`."""


def load_overhead_bytes(size: ModelSize, models: int = 1) -> int:
    """What a rank's load of `models` models of `size` (2: the policy and a KL reference) holds besides their tensors."""
    return LOAD_FIXED_BYTES + models * size.layers * LOAD_BYTES_PER_LAYER


def sharded_load_bytes(size: ModelSize, ranks: int, master: torch.dtype) -> int:
    """A sharded rank's tensors at the peak of its load: its 1/`ranks` of each tensor in `master`, read in the state
    dict's order, where a tensor stored in another dtype (`size.file_dtype`; unstated counts as another) first lands
    in a buffer of its slice in that dtype, freed before the next: the shards read so far, the one being read and its
    buffer. A tied model's embedding (its largest tensor) comes first, so its buffer costs nothing at the end; an
    untied one's output layer comes last and does."""
    buffer_itemsize = 0 if size.file_dtype == master else (size.file_dtype or master).itemsize
    held = peak = 0
    for elements in size.load_order:
        part = math.ceil(elements / ranks)
        peak = max(peak, held + part * (master.itemsize + buffer_itemsize))
        held += part * master.itemsize
    return peak


def rank_memory(config: Config, size: ModelSize) -> RankMemory:
    """One trainer rank: while loading, its shard (and a reference's) and the read buffers when the files are in
    another dtype than `trainer.param_dtype` (`sharded_load_bytes`), or the whole model when it is alone or the
    policy has LoRA adapters (and from files in another dtype, the files' tensors while they are cast; its shard
    beside a whole reference), and the load's own objects (`load_overhead_bytes`); then its shard of weights,
    gradients and two AdamW moments (and of a reference)."""
    trainer = config.trainer
    master = TORCH_DTYPES[trainer.param_dtype]
    itemsize = master.itemsize
    whole = size.parameters * itemsize
    shard = math.ceil(size.parameters / trainer.ranks) * itemsize
    reference = config.loss.kl_coef > 0
    if trainer.ranks > 1 and not trainer.lora.enabled:
        load_peak = (2 if reference else 1) * sharded_load_bytes(size, trainer.ranks, master)
    else:
        # from_pretrained casts from the files' tensors, mapped and read whole; files in the master dtype stay mapped
        # and are the weights (resident once read)
        files = 0 if size.file_dtype == master else size.parameters * (size.file_dtype or master).itemsize
        load_peak = whole + files + (shard if reference else 0)  # a reference loads whole after the policy is sharded
    load_peak += load_overhead_bytes(size, 2 if reference else 1)
    copy = math.ceil(size.parameters / trainer.ranks) * TORCH_DTYPES[config.generator.dtype].itemsize
    copy = copy if delta_sync(config) else 0
    return RankMemory(load_peak, 4 * shard + (shard if reference else 0) + copy, trainer.device, copy)


def delta_sync(config: Config) -> bool:
    """Whether the run's versions travel as deltas (`rl.weights.delta.sends_deltas`)."""
    from rl.weights.delta import sends_deltas

    wire, master = TORCH_DTYPES[config.generator.dtype], TORCH_DTYPES[config.trainer.param_dtype]
    return sends_deltas(config.weight_sync.delta, wire, master, config.trainer.lora.enabled)


def footprint(config: Config, size: ModelSize) -> Footprint:
    """The run's footprint per host for a model of `size` (`config` resolved: `generator.dtype` is not "auto")."""
    hosts_of = config.cluster.hosts
    wire = TORCH_DTYPES[config.generator.dtype].itemsize
    torchstore = config.weight_sync.transport == "torchstore"
    store = 3 * size.state_elements * wire if torchstore else 0
    slot = size.parameters * wire  # the trainer's file: a tied weight once
    # what a generator replica's files hold of a version: what it read, every key the store holds through torchstore
    staging = size.state_elements * wire if torchstore else slot
    full = checkpoint_bytes(size, config.trainer.param_dtype, "full")
    regular = config.checkpoint.every_steps > 0
    one = full if regular else checkpoint_bytes(size, config.trainer.param_dtype, config.checkpoint.final)
    disk = (config.checkpoint.keep + 1) * full if regular else one

    def host(name: str, count: int, roles: list[str]) -> HostFootprint:
        ranks = config.trainer.num_procs if "trainer" in roles else 0
        replicas = config.generator.num_replicas // max(1, hosts_of.generator) if "generator" in roles else 0
        shm = 0
        if not torchstore and "trainer" in roles:
            shm = 2 * slot  # rank 0's two slots (one trainer host: shared_memory works on one host only)
        elif torchstore:
            shm = replicas * staging
        if delta_sync(config):
            shm += replicas * staging  # each replica's resident copy
        trainer_hosts = max(1, hosts_of.trainer)
        return HostFootprint(
            name,
            count,
            roles,
            ranks,
            math.ceil(store / trainer_hosts) if "torchstore" in roles else 0,
            shm,
            full // trainer_hosts if ranks else 0,
        )

    launcher = ["controller"] + (["torchstore"] if hosts_of.trainer == 0 else [])
    launcher += [role for role in ("trainer", "generator", "reward") if getattr(hosts_of, role) == 0]
    hosts = [host("launcher", 1, launcher)]
    for role, roles in (("trainer", ["trainer", "torchstore"]), ("generator", ["generator"])):
        if getattr(hosts_of, role):
            hosts.append(host(f"{role} host", getattr(hosts_of, role), roles))
    return Footprint(size, rank_memory(config, size), hosts, one, disk)


def run_footprint(config: Config) -> Footprint | None:
    """`footprint` of the config's model, or None when its files are not on this machine (a hub id not cached)."""
    from transformers import AutoConfig

    from rl.assets import BUILTIN_MODELS

    path = config.model.path
    try:
        if path not in BUILTIN_MODELS and not Path(path).is_dir():
            AutoConfig.from_pretrained(path, local_files_only=True)  # a hub id: sized only when already cached
        size = model_size(path)
    except (OSError, ValueError):
        return None
    return footprint(config, size)


SMALL_MODEL_PARAMETERS = 1_000_000_000
"""Below this, the default `trainer.lr` (1e-6, a rate for models of a billion parameters and more) barely moves a
model: the main job's SmolLM2-135M learns at 2e-5."""


def default_lr_warning(config: Config, found: Footprint | None) -> str | None:
    """A warning when `trainer.lr` is left at its default for a model well below a billion parameters."""
    if found is None or "lr" in config.trainer.model_fields_set or found.model.parameters >= SMALL_MODEL_PARAMETERS:
        return None
    return (
        f"trainer.lr is left at its default {config.trainer.lr:g}, a rate for models of a billion parameters and "
        f"more; {config.model.path} has {found.model.parameters / 1e6:.0f}M and barely moves at it (the main job, "
        "SmolLM2-135M in fp32, learns at 2e-5): set trainer.lr"
    )


def _gib(nbytes: int) -> str:
    """`nbytes` in GiB, or in MiB below one GiB."""
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def footprint_lines(found: Footprint, config: Config) -> list[str]:
    """One line per kind of host, then the checkpoints' line."""
    rank, lines = found.rank, []
    copy = f", and of the last published version in {config.generator.dtype}" if rank.published_copy_bytes else ""
    for host in found.hosts:
        parts = [f"{host.name}{f' (x{host.count})' if host.count > 1 else ''} [{', '.join(host.roles)}]:"]
        if host.trainer_ranks:
            parts.append(
                f"{host.trainer_ranks} trainer rank(s), each {_gib(rank.load_peak_bytes)} host RAM while loading "
                f"then {_gib(rank.training_bytes)} on {rank.device} (its 1/{config.trainer.ranks} of weights, "
                f"gradients and AdamW moments in {config.trainer.param_dtype}{copy});"
            )
        if host.store_bytes:
            share = "its ranks' share of " if host.trainer_ranks and config.cluster.hosts.trainer > 1 else ""
            parts.append(
                f"torchstore volume up to {_gib(host.store_bytes)} ({share}3 versions in {config.generator.dtype});"
            )
        parts.append(f"/dev/shm {_gib(host.shm_bytes)};")
        if host.checkpoint_write_bytes:
            parts.append(f"writes {_gib(host.checkpoint_write_bytes)} of each full checkpoint")
        lines.append(" ".join(parts).rstrip(";"))
    lines.append(
        f"checkpoints: {_gib(found.checkpoint_bytes)} each, up to {_gib(found.checkpoint_disk_bytes)} in the run "
        "directory at once"
    )
    return lines


def slurm_memory_warning(config: Config, found: Footprint | None) -> str | None:
    """A Slurm job that leaves `mem` or `cpus_per_task` to the partition's defaults, with what each trainer rank
    will load; None when both are set or no trainer host is allocated."""
    cluster = config.cluster
    if cluster.scheduler != "slurm" or cluster.hosts.trainer == 0:
        return None
    missing = " and ".join(key for key in ("mem", "cpus_per_task") if getattr(cluster.slurm, key) is None)
    if not missing:
        return None
    if found is None:
        load = f"the whole model ({config.model.path} is not on this machine to size it)"
    else:
        rank = found.rank
        load = (
            f"{_gib(rank.load_peak_bytes)} of the model's {found.model.parameters / 1e6:.1f}M parameters in "
            f"{config.trainer.param_dtype}, then keeps {_gib(rank.training_bytes)} of weights, "
            f"gradients and AdamW moments{' and the last published version' if rank.published_copy_bytes else ''} "
            f"on {rank.device}"
        )
    return (
        f"cluster.slurm sets no {missing}: the job gets the partition's defaults, while each of the "
        f"{config.trainer.num_procs} trainer rank(s) per host first loads {load}"
    )
