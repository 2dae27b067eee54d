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


class FakeJudgeModel(ServiceReplica):
    """A frozen model's replica as a judge sees it: every reply is "Hello" then end of turn (tiny-qwen3 ids)."""

    @endpoint
    async def generate(self, requests, sampling):
        from rollouts.types import Completion

        return [
            Completion(token_ids=[9707, 151645], logprobs=[-0.1, -0.1], finish_reason="stop", policy_version=0)
            for _ in requests
        ]
