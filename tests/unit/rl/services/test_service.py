"""Calls through a service over small in-process fake replicas: typed endpoints routed to one replica or fanned
out to all, failed requests, refused answers, counters.

The fakes stand in for Monarch proc meshes and actors only; `tests/e2e/test_services.py` runs the real thing.
"""

import pytest
from monarch.actor import Actor, endpoint

from rl.services.replica import concurrent_endpoint
from rl.services.service import RequestFailed
from tests.support.services_fakes import FakeHost, make_service, settle


async def test_a_request_lost_on_max_attempts_replicas_fails():
    host = FakeHost({name: {"generate": "die"} for name in ("generator_0_0", "generator_1_0")})
    service = make_service(host, max_attempts=2)
    await service.start()
    with pytest.raises(RequestFailed, match="lost on 2 replicas"):
        await service.call("generate", 1)
    assert service.metrics()["services/generator/failed_requests"] == 1
    await service.stop()


class Declared(Actor):
    """The endpoints the fake replicas serve, declared as an actor class declares them."""

    @concurrent_endpoint
    async def generate(self, x: int) -> tuple[str, int]:
        raise NotImplementedError

    @endpoint
    async def update(self, version: int) -> int:
        raise NotImplementedError


class Other(Actor):
    @endpoint
    async def update(self, version: int) -> int:
        raise NotImplementedError


async def test_endpoints_typed_from_the_actors_methods_route_to_one_replica_or_fan_out_to_all():
    service = make_service(FakeHost())
    service.actor_class = Declared
    await service.start()
    generate = service.endpoint(Declared.generate)
    assert generate.name == "generate"
    assert await generate.options(key="row=0").route(1) == ("generator_0_0", 1)
    assert await generate.options(key="row=0").route(x=2) == ("generator_0_0", 2)  # sticky; keywords reach the actor
    assert await generate.route(3) == ("generator_0_0", 3)  # no key: least outstanding, a tie to the lower index
    update = service.endpoint(Declared.update)
    assert await update.fanout(3) == [3, 3]  # within the service's call_timeout_s
    refused = update.options(timeout_s=1.0, refuse=lambda version: None if version == 4 else "stale")
    assert await refused.fanout(4) == [4, 4] and service.healthy == [0, 1]
    with pytest.raises(TypeError, match="is not an endpoint of Declared"):
        service.endpoint(Other.update)
    await service.stop()


async def test_endpoints_by_name_take_their_options_as_keywords():
    service = make_service(FakeHost())
    # what the actor class declares
    service.actor_class = type("DeclaredEndpoints", (), {"generate": None, "update": None})
    await service.start()
    assert await service.generate.route(1, key="row=0") == ("generator_0_0", 1)
    assert await service.update.fanout(3, timeout_s=1.0) == [3, 3]
    with pytest.raises(AttributeError, match="DeclaredEndpoints has no endpoint 'genrate'"):
        service.genrate.route(1)
    await service.stop()


async def test_broadcast_loses_a_hung_replica_instead_of_hanging():
    host = FakeHost({"generator_1_0": {"update": "hang"}})
    service = make_service(host)
    await service.start()
    assert await service.broadcast("update", 3, timeout_s=0.1) == [3]
    assert service.healthy == [0]
    await settle(service)
    assert service.healthy == [0, 1] and service.restarts == 1
    await service.stop()


async def test_a_replica_whose_answer_is_refused_is_replaced_like_a_dead_one_and_its_answer_kept():
    host = FakeHost({"generator_1_0": {"update": "stale"}})
    service = make_service(host)
    await service.start()
    refuse = lambda version: None if version == 3 else f"serves version {version}, published 3"
    assert await service.broadcast("update", 3, timeout_s=1.0, refuse=refuse) == [3, 2]
    assert service.healthy == [0]  # out of routing at once
    assert service.losses == ["generator/1#0: update refused: serves version 2, published 3"]
    await settle(service)
    assert "generator_1_0" in host.stopped and service.healthy == [0, 1] and service.restarts == 1
    assert service.replicas[1].actor is host.actors["generator_1_1"]
    await service.stop()


async def test_service_counters_continue_from_a_checkpoints_counters():
    before = make_service(FakeHost({"generator_0_0": {"generate": "die"}}))
    await before.start()
    await before.call("generate", 1)  # lost on replica 0, resubmitted to 1
    await settle(before)
    saved = before.counters()
    await before.stop()
    resumed = make_service(FakeHost())  # the resumed launcher's service
    await resumed.start()
    resumed.restore_counters(saved)
    await resumed.call("generate", 2)
    metrics = resumed.metrics()
    assert (metrics["services/generator/restarts"], metrics["services/generator/resubmitted_requests"]) == (1, 1)
    assert metrics["services/generator/replica_0/requests"] + metrics["services/generator/replica_1/requests"] == 3
    await resumed.stop()
