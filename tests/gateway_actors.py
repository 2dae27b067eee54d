"""Actors of the gateway test: a replica that answers with its pid, and a caller in another process."""

import os

from monarch.actor import Actor, endpoint

from rl.services.replica import ServiceReplica


class Echo(ServiceReplica):
    @endpoint
    async def generate(self, x: int) -> tuple[int, int]:
        return os.getpid(), x


class Caller(Actor):
    """Stands for a RewardActor: calls a service only through the gateway it was handed."""

    @endpoint
    async def ask(self, gateway, x: int) -> tuple[int, int]:
        return await gateway.call.call_one("echo", "generate", x)
