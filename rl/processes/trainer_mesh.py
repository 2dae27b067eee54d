"""The PolicyTrainer as a proc mesh of `trainer.num_hosts` x `trainer.num_procs` ranks that acts as one actor.

Ranks learn their rendezvous from the launcher, not from an inherited environment (processes on
other hosts have none of it): before the trainer is spawned, monarch's SPMD helper actor asks rank 0's
process for its host name and a free port (`rendezvous_port`: below the host's ephemeral range) and sets RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT in every rank's process (monarch's SPMD helper actor, with the
helper's mesh named after the trainer's, so a failure report of either names the trainer incarnation it belongs to).
The trainer then joins the group in its constructor.

`SpmdActor` wraps the mesh: every endpoint call runs on every rank (FSDP2's collectives need all of
them) and `call_one` returns rank 0's answer, the same on every rank. With one rank it is a plain
single-actor mesh and no process group is created.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path
from typing import Any

from monarch._src.spmd.actor import SPMDActor
from monarch.actor import endpoint

from rl.config.roles import TrainerConfig

RENDEZVOUS_SUFFIX = "_rendezvous"
"""The rendezvous helpers' mesh is the trainer mesh's name with this suffix."""


EPHEMERAL_PORTS = Path("/proc/sys/net/ipv4/ip_local_port_range")
"""The host's (network namespace's) ephemeral range: the ports the kernel hands to bind(0) and to outgoing connections."""


def rendezvous_port(ephemeral_ports: Path = EPHEMERAL_PORTS, rng: random.Random | None = None) -> int:
    """A free TCP port for rank 0's TCPStore, below this host's ephemeral range.

    Monarch's helper returns a port that bind(0) gave and that was closed again: it is back in the ephemeral pool, and
    any process on the host that binds or connects before rank 0 listens may be handed it (EADDRINUSE in
    `init_process_group`, seen with two test workers starting runs side by side). Below the range only an explicit
    bind can take it."""
    low = int(ephemeral_ports.read_text().split()[0])
    candidates = range(max(1024, low - 16384), low)
    rng = rng or random.SystemRandom()
    for port in rng.sample(candidates, min(64, len(candidates))):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("", port))
            except OSError:
                continue
            return port
    raise RuntimeError(
        f"no free TCP port among 64 tried in {candidates.start}-{candidates.stop - 1} for the trainer's rendezvous"
    )


class RendezvousActor(SPMDActor):
    """Monarch's SPMD helper (it sets every rank's RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), with rank 0's
    port from `rendezvous_port`."""

    @endpoint
    def rendezvous_address(self) -> tuple[str, int]:
        return socket.gethostname(), rendezvous_port()


class SpmdEndpoint:
    def __init__(self, endpoint: Any):
        self._endpoint = endpoint

    async def call_one(self, *args: Any, **kwargs: Any) -> Any:
        """Run on every rank; rank 0's result."""
        values = await self._endpoint.call(*args, **kwargs)
        return next(iter(values.values()))

    def call(self, *args: Any, **kwargs: Any) -> Any:
        return self._endpoint.call(*args, **kwargs)


class SpmdActor:
    """An actor mesh whose ranks act as one actor (see the module docstring)."""

    def __init__(self, mesh: Any):
        self.mesh = mesh

    @property
    def initialized(self) -> Any:
        return self.mesh.initialized

    def __getattr__(self, name: str) -> SpmdEndpoint:
        return SpmdEndpoint(getattr(self.mesh, name))


async def spawn_trainer(
    spawn_procs: Any,
    trainer_config: TrainerConfig,
    trainer_cls: type,
    *args: Any,
    mesh_name: str = "trainer",
    **kwargs: Any,
) -> tuple[SpmdActor, Any]:
    """The trainer actor over its ranks and their proc mesh; `spawn_procs` is `rl.processes.cluster.Placement.spawn_procs`;
    `mesh_name`: the actor mesh's name (a restarted trainer's differs, so a late report of the old one is told apart)."""
    procs = spawn_procs("trainer", per_host={"procs": trainer_config.num_procs}, gpus_per_proc=1)
    if trainer_config.ranks > 1:  # a new rendezvous port each time
        helpers = procs.spawn(f"{mesh_name}{RENDEZVOUS_SUFFIX}", RendezvousActor)
        master_addr, master_port = await helpers.slice(**dict.fromkeys(procs._labels, 0)).rendezvous_address.call_one()
        await helpers.setup_env.call(master_addr, master_port)
    return SpmdActor(procs.spawn(mesh_name, trainer_cls, *args, **kwargs)), procs
