"""Checks of a multi-host run against the machine it is launched from, before anything is allocated.

- Slurm and Kubernetes runs talk TCP by hostname: Monarch panics ("hostname resolved to no non-loopback,
  non-link-local address") at the first actor spawn, after the allocation is granted, when the launcher's
  hostname resolves only to loopback (Debian's default `127.0.1.1 <hostname>`, containers). Refused here instead.
- A Slurm job without `mem`/`cpus_per_task` gets the partition's defaults, while every trainer rank loads the
  whole fp32 model in host RAM before sharding it: warned, with that size.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import struct
from pathlib import Path

from rl.config import Config

_BYTES_OF_DTYPE = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def launcher_addresses(hostname: str) -> list[str]:
    """The addresses `hostname` resolves to here (empty when it does not resolve)."""
    try:
        return sorted({info[4][0] for info in socket.getaddrinfo(hostname, None)})
    except socket.gaierror:
        return []


def launcher_address_problem(config: Config, hostname: str | None = None) -> str | None:
    """Why a TCP scheduler cannot be launched from this host (its name resolves to no address other hosts could
    dial), or None. `rlmesh train` refuses to start on it; `rlmesh validate` warns (the config may be meant for
    another host)."""
    if config.cluster.scheduler not in ("slurm", "kubernetes"):
        return None
    hostname = hostname or socket.gethostname()
    addresses = launcher_addresses(hostname)
    reachable = [
        a for a in addresses if not (ipaddress.ip_address(a).is_loopback or ipaddress.ip_address(a).is_link_local)
    ]
    if reachable:
        return None
    shown = ", ".join(addresses) or "nothing"
    return (
        f"cluster.scheduler = {config.cluster.scheduler!r}: this host's name {hostname!r} resolves to {shown}, no "
        "address another host can dial back (Monarch's TCP transport would panic at the first actor spawn). "
        "Map the hostname to the address of the cluster network in /etc/hosts, or launch from a host whose "
        "name resolves there"
    )


def parameter_count(model_dir: Path) -> int | None:
    """Parameters in a Hugging Face folder's safetensors files, from their headers alone (None: no such files)."""
    total, files = 0, sorted(model_dir.glob("*.safetensors"))
    for path in files:
        with path.open("rb") as file:
            (header_len,) = struct.unpack("<Q", file.read(8))
            header = json.loads(file.read(header_len))
        for name, entry in header.items():
            if name != "__metadata__":
                count = 1
                for size in entry["shape"]:
                    count *= size
                total += count
    return total if files else None


def host_ram_per_rank_bytes(config: Config) -> int | None:
    """Host RAM one trainer rank needs to load the model in fp32 before sharding (None: the size is unknown here)."""
    from rl.assets import BUILTIN_MODELS, resolve_model_path

    path = config.model.path
    if path not in BUILTIN_MODELS and not os.path.isdir(path):
        return None  # a hub id: not downloaded from here
    count = parameter_count(Path(resolve_model_path(path)))
    return None if count is None else count * 4


def cluster_warnings(config: Config) -> list[str]:
    """What a multi-host config leaves to chance, one sentence each."""
    warnings = []
    cluster = config.cluster
    if (
        cluster.scheduler == "slurm"
        and cluster.hosts.trainer > 0
        and (cluster.slurm.mem is None or cluster.slurm.cpus_per_task is None)
    ):
        ranks_per_host = config.trainer.num_procs // max(1, config.trainer.num_hosts)
        per_rank = host_ram_per_rank_bytes(config)
        size = f"the whole model (~{per_rank / 2**30:.2f} GiB)" if per_rank is not None else "the whole model"
        missing = " and ".join(key for key in ("mem", "cpus_per_task") if getattr(cluster.slurm, key) is None)
        warnings.append(
            f"cluster.slurm sets no {missing}: the job gets the partition's defaults, while each of the "
            f"{ranks_per_host} trainer rank(s) per host loads {size} in host RAM (fp32) before sharding"
        )
    return warnings
