"""Another process reaches a service through the gateway, with the router's failover (real Monarch actors, no vLLM)."""

import asyncio
import os
import signal

import monarch.actor
from monarch.actor import this_host

from rl.services.config import ServiceConfig
from rl.services.gateway import open_gateway
from rl.services.replica import local_procs
from rl.services.service import Service, after_run_fault_hook
from tests.gateway_actors import Caller, Echo


async def test_a_call_through_the_gateway_fails_over_when_its_replica_dies():
    fatal: list[str] = []
    service = Service("echo", Echo, lambda replica: (), replicas=2, spawn_procs=local_procs(), on_fatal=fatal.append,
                      config=ServiceConfig(call_timeout_s=60, probe_interval_s=0.2, start_timeout_s=120))
    previous_hook = monarch.actor.unhandled_fault_hook
    monarch.actor.unhandled_fault_hook = lambda failure: None if service.handle_failure(failure) else previous_hook(failure)
    caller_procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        await service.start()
        gateway = open_gateway({"echo": service})
        caller = caller_procs.spawn("caller", Caller)
        pids = {index: service.replicas[index].pid for index in service.healthy}
        first_pid, answer = await caller.ask.call_one(gateway.actor, 1)
        assert answer == 1 and first_pid in pids.values()
        os.kill(first_pid, signal.SIGKILL)
        answers = await asyncio.wait_for(asyncio.gather(*(caller.ask.call_one(gateway.actor, x) for x in range(2, 6))), 120)
        assert [x for _, x in answers] == [2, 3, 4, 5] and first_pid not in {pid for pid, _ in answers}
        while service.replacing or service.restarts == 0:
            await asyncio.sleep(0.1)
        assert service.restarts == 1 and len(service.healthy) == 2 and not fatal
        gateway.close()
    finally:
        await service.stop()
        await caller_procs.stop()
        monarch.actor.unhandled_fault_hook = after_run_fault_hook([service], previous_hook)  # late reports of the killed replica
