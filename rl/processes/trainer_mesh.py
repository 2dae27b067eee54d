"""The PolicyTrainer as a proc mesh of `trainer.num_hosts` x `trainer.num_procs` ranks that acts as one actor.

Ranks learn their rendezvous from the launcher, not from an inherited environment (processes on
other hosts have none of it): before the trainer is spawned, monarch's SPMD helper actor asks rank 0's
process for its host name and a free port and sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT in every rank's process (`monarch.spmd.setup_torch_elastic_env_async`, with the helper's mesh
named after the trainer's, so a failure report of either names the trainer incarnation it belongs to). The trainer then joins the group in its constructor.

`SpmdActor` wraps the mesh: every endpoint call runs on every rank (FSDP2's collectives need all of
them) and `call_one` returns rank 0's answer, the same on every rank. With one rank it is a plain
single-actor mesh and no process group is created.
"""

from __future__ import annotations

from typing import Any

from monarch._src.spmd.actor import SPMDActor

from rl.config.roles import TrainerConfig

RENDEZVOUS_SUFFIX = "_rendezvous"
"""The rendezvous helpers' mesh is the trainer mesh's name with this suffix."""


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
        helpers = procs.spawn(f"{mesh_name}{RENDEZVOUS_SUFFIX}", SPMDActor)
        master_addr, master_port = await helpers.slice(**dict.fromkeys(procs._labels, 0)).get_host_port.call_one(None)
        await helpers.setup_env.call(master_addr, master_port)
    return SpmdActor(procs.spawn(mesh_name, trainer_cls, *args, **kwargs)), procs
