"""Checks of a multi-host run against the machine it is launched from, before anything is allocated.

- Slurm and Kubernetes runs talk TCP by hostname: Monarch panics ("hostname resolved to no non-loopback,
  non-link-local address") at the first actor spawn, after the allocation is granted, when the launcher's
  hostname resolves only to loopback (Debian's default `127.0.1.1 <hostname>`, containers). Refused here instead.

A Slurm job without `mem`/`cpus_per_task` is warned about with what each rank loads: `rl.commands.footprint`.
"""

from __future__ import annotations

import ipaddress
import socket

from rl.config import Config


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
