"""Supervision over small in-process fake replicas: a replica lost (Monarch's report, a missed deadline, a failed
probe) is replaced, its requests served elsewhere; the restart budget; the fault hook after a run.

The fakes stand in for Monarch proc meshes and actors only; `tests/e2e/test_services.py` runs the real thing.
"""

import asyncio

from rl.services.supervision import after_run_fault_hook
from tests.support.services_fakes import Failure, FakeHost, make_service, settle


async def test_a_dead_replicas_requests_go_to_the_other_and_a_prepared_replacement_takes_its_place():
    host = FakeHost({"generator_0_0": {"generate": "hang"}})
    prepared: list[str] = []

    async def prepare(actor):
        prepared.append(actor.name)

    service = make_service(host, prepare=prepare)
    await service.start()
    assert prepared == []  # the first replicas start from the model's own weights
    pending = asyncio.ensure_future(service.call("generate", "seed=7", key="row=0"))
    await asyncio.sleep(0.05)
    assert host.actors["generator_0_0"].calls == [("generate", "seed=7")]
    assert service.handle_failure(Failure(f"generator_0_0_s{service._serial}-Ab3xYz"))
    assert not service.handle_failure(Failure("trainer-Ab3xYz"))
    # another run's replica, reported late: ignored
    assert service.handle_failure(Failure(f"generator_1_0_s{service._serial + 1}-Ab3xYz"))
    late: list[str] = []
    hook = after_run_fault_hook([service], late.append, ["trainer"])
    for name in (f"generator_0_0_s{service._serial}-Ab3xYz", "logger-Ab3xYz", "trainer-Ab3xYz", "judge-Ab3xYz"):
        hook(Failure(name))
    assert late == [Failure("judge-Ab3xYz")]  # the run stopped its replicas and its trainer, not that mesh
    assert await pending == ("generator_1_0", "seed=7")  # same arguments, so the same sampling seed
    await settle(service)
    assert prepared == ["generator_0_1"] and "generator_0_0" in host.stopped
    assert service.healthy == [0, 1]
    metrics = service.metrics()
    assert metrics["services/generator/restarts"] == 1 and metrics["services/generator/resubmitted_requests"] == 1
    assert metrics["services/generator/healthy_replicas"] == 2
    assert (metrics["services/generator/replica_0/requests"], metrics["services/generator/replica_1/requests"]) == (
        1,
        1,
    )
    await service.stop()


async def test_a_replica_that_misses_its_deadline_is_replaced_and_its_request_served_elsewhere():
    host = FakeHost({"generator_0_0": {"generate": "hang"}})
    service = make_service(host, call_timeout_s=0.1)
    await service.start()
    assert await service.call("generate", 1) == ("generator_1_0", 1)
    await settle(service)
    assert "generator_0_0" in host.stopped and service.restarts == 1
    assert await service.call("generate", 2, key="row=5") == ("generator_0_1", 2)  # the replacement takes traffic
    await service.stop()


async def test_the_run_stops_when_the_restart_budget_leaves_too_few_replicas():
    host = FakeHost({"generator_0_0": {"generate": "die"}, "generator_0_1": {"generate": "die"}})
    fatal: list[str] = []
    service = make_service(host, fatal=fatal, max_restarts=1, min_healthy_replicas=2)
    await service.start()
    assert await service.call("generate", 1) == ("generator_1_0", 1)
    await settle(service)
    assert fatal == [] and service.restarts == 1
    assert await service.call("generate", 2, key="row=1") == ("generator_1_0", 2)
    await settle(service)
    assert service.healthy == [1]
    assert fatal == [
        "generator: restart budget spent (services.generator.max_restarts = 1 within restart_window_s = 3600.0); "
        "1 replicas left, fewer than services.generator.min_healthy_replicas = 2"
    ]
    await service.stop()


async def test_an_idle_replica_that_stops_answering_its_probe_is_replaced():
    host = FakeHost({"generator_0_0": {"ping": "hang"}})
    service = make_service(host, probe_interval_s=0.05, probe_timeout_s=0.5)
    host.scripts["generator_0_0"] = {}  # answers its start-up ping ...
    await service.start()
    host.actors["generator_0_0"].script["ping"] = "hang"  # ... then stops answering
    while service.restarts == 0:
        await asyncio.sleep(0.02)
    await settle(service)  # the restart is counted before its replacement serves
    assert "generator_0_0" in host.stopped and service.healthy == [0, 1]
    await service.stop()


async def test_a_busy_replica_that_stops_answering_is_replaced_within_the_probe_timeout_not_the_calls_deadline():
    host = FakeHost()
    service = make_service(host, call_timeout_s=3600.0, probe_interval_s=0.05, probe_timeout_s=0.2)
    await service.start()
    host.actors["generator_0_0"].script.update(generate="hang", ping="hang")  # e.g. its process stopped mid-call
    call = asyncio.ensure_future(service.call("generate", 1, key="row"))
    served_by, _ = await asyncio.wait_for(call, 10)  # without busy probes: only after the hour-long call deadline
    assert served_by == "generator_1_0" and service.restarts == 1
    assert "health probe failed (1 requests in flight)" in service.losses[0]
    await service.stop()


async def test_a_busy_replica_that_answers_its_probe_keeps_serving():
    host = FakeHost()
    service = make_service(host, call_timeout_s=3600.0, probe_interval_s=0.01, probe_timeout_s=0.2)
    await service.start()
    host.actors["generator_0_0"].script.update(generate="hang")  # a long call, but the process answers pings
    call = asyncio.ensure_future(service.call("generate", 1, key="row"))
    await asyncio.sleep(0.5)
    assert not call.done() and service.restarts == 0
    call.cancel()
    await service.stop()
