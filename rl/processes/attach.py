"""`scheduler = "attach"`: host meshes over Monarch workers that already run on their hosts.

A user starts one worker per host (`rlmesh worker --address tcp://0.0.0.0:PORT`, e.g. over SSH or from a service
manager) and lists the addresses per role in `cluster.workers`; the launcher attaches to them over TCP
(`monarch.actor.attach_to_workers`) instead of asking a scheduler for hosts. The workers are the user's: a run
stops the processes it started on them, not the workers.
"""

from __future__ import annotations

import ipaddress
import socket
import urllib.parse
from types import SimpleNamespace


def use_tcp(ip: str | None) -> None:
    """Serve this process's Monarch channels over TCP where the other hosts reach it: on `ip` when given, else under
    its hostname (which must resolve to an address other than loopback). Set before the root client starts."""
    from monarch._rust_bindings.monarch_hyperactor.channel import ChannelTransport
    from monarch._rust_bindings.monarch_hyperactor.config import configure

    configure(default_transport=f"tcp://{ip}:0" if ip else ChannelTransport.TcpWithHostname)


def host_and_port(address: str) -> tuple[str, int]:
    """`tcp://HOST:PORT` -> (HOST, PORT)."""
    parsed = urllib.parse.urlsplit(address)
    if parsed.scheme != "tcp" or not parsed.hostname or not parsed.port:
        raise ValueError(f"worker address {address!r}: expected tcp://HOST:PORT")
    return parsed.hostname, parsed.port


def local_ip_towards(address: str) -> str:
    """The address of this machine that the route to `address` leaves from (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(host_and_port(address))
        return probe.getsockname()[0]


class AttachedWorkers:
    """The job of `scheduler = "attach"`: `state()` gives one host mesh per role, attached to its workers."""

    def __init__(self, workers: dict[str, list[str]]):
        first = next(address for addresses in workers.values() for address in addresses)
        use_tcp(local_ip_towards(first))  # the workers dial back to the launcher on the route they are reached by
        self.workers = workers
        self.active = False  # nothing to kill on release: the workers outlive the run

    def state(self, cached_path: str | None = None) -> SimpleNamespace:
        from monarch.actor import attach_to_workers

        return SimpleNamespace(
            **{
                role: attach_to_workers(name=role, ca="trust_all_connections", workers=addresses)
                for role, addresses in self.workers.items()
            }
        )


def run_worker(address: str) -> None:
    """Serve as one host's worker at `address` (tcp://IP_OR_NAME:PORT) until the process is stopped. The run's processes
    it starts serve on the same IP when `address` names one, else under the hostname."""
    from monarch.actor import run_worker_loop_forever

    host, _ = host_and_port(address)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    use_tcp(str(ip) if ip is not None and not ip.is_unspecified else None)
    run_worker_loop_forever(address=address, ca="trust_all_connections")
