"""The service layer's logic (routing, ledger, failover, respawn, breaker) over small in-process fake replicas.

The fakes stand in for Monarch proc meshes and actors only; `tests/e2e/test_services.py` runs the real thing.
"""

import asyncio

import pytest

from rl.config.services import BreakerConfig
from rl.services.breaker import CircuitBreaker, group_failure
from rl.services.ledger import Ledger
from rl.services.router import Router
from rl.services.service import RequestFailed, after_run_fault_hook
from rollouts.types import Rollout, RolloutGroup, RolloutStatus
from tests.support.services_fakes import Failure, FakeHost, make_service, settle


def test_router_prefers_least_outstanding_and_keeps_a_group_on_its_replica():
    router = Router(3)
    first, second = router.pick([0, 1, 2], "row=0"), router.pick([0, 1, 2], "row=1")
    assert (first, second) == (0, 1)
    assert router.pick([0, 1, 2], "row=0") == 0  # sticky, although replica 2 is idle
    assert router.pick([0, 1, 2]) == 2
    assert router.outstanding == [2, 1, 1]
    assert router.pick([1, 2], "row=0") == 1  # its replica is not healthy: least outstanding (tie: lower index)
    assert router.replica_of("row=0") == 1
    router.done(0)
    assert router.outstanding == [1, 2, 1] and router.served == [2, 2, 1]


def test_ledger_counts_attempts_and_resubmissions():
    ledger = Ledger()
    a, b = ledger.open(), ledger.open()
    assert ledger.assign(a, 0) == 1 and ledger.assign(b, 0) == 1
    assert ledger.on(0) == [a, b]
    assert ledger.assign(a, 1) == 2
    assert ledger.on(0) == [b] and ledger.on(1) == [a] and ledger.resubmitted == 1
    ledger.close(a)
    assert list(ledger.entries) == [b]


def group(statuses: list[RolloutStatus]) -> RolloutGroup:
    rollouts = [
        Rollout(
            rollout_id=f"g/{i}",
            group_id="g",
            task_name="t",
            sample_index=i,
            status=s,
            error="boom" if s == RolloutStatus.ERROR else None,
        )
        for i, s in enumerate(statuses)
    ]
    return RolloutGroup(group_id="g", task_name="t", example={}, rollouts=rollouts)


def test_a_group_fails_only_when_every_rollout_is_an_error():
    assert group_failure(group([RolloutStatus.ERROR, RolloutStatus.ERROR])) == (True, "boom")
    assert group_failure(group([RolloutStatus.ERROR, RolloutStatus.COMPLETED]))[0] is False
    assert group_failure(group([]))[0] is False


def test_breaker_opens_on_consecutive_failures_once():
    opened: list[str] = []
    breaker = CircuitBreaker(BreakerConfig(max_consecutive_failed_groups=3, window_groups=100), opened.append)
    for failed in (True, True, False, True, True):
        breaker.record(failed, "reward fn raised")
    assert opened == []
    breaker.record(True, "reward fn raised")
    breaker.record(True, "reward fn raised")
    assert len(opened) == 1 and opened[0].startswith("rollout circuit breaker: 3 consecutive groups failed")
    assert opened[0].endswith("last error: reward fn raised")


def test_breaker_opens_when_the_windows_failure_rate_exceeds_the_limit():
    opened: list[str] = []
    breaker = CircuitBreaker(
        BreakerConfig(max_consecutive_failed_groups=10, window_groups=4, max_failure_rate=0.5), opened.append
    )
    for failed in (True, False, True):  # 2 of 3, but the window is not full yet
        breaker.record(failed)
    breaker.record(False)  # (T, F, T, F): 2 of 4 = 0.5, not above the limit
    breaker.record(True)  # (F, T, F, T): 2 of 4
    assert opened == []
    breaker.record(True)  # (T, F, T, T) = 3 of 4 = 0.75 > 0.5
    assert opened == [
        "rollout circuit breaker: 3 of the last 4 groups failed (services.breaker.max_failure_rate = 0.5); last error: "
    ]


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
    hook = after_run_fault_hook([service], late.append)
    for name in (f"generator_0_0_s{service._serial}-Ab3xYz", "logger-Ab3xYz", "trainer-Ab3xYz"):
        hook(Failure(name))
    assert late == [Failure("trainer-Ab3xYz")]
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


async def test_a_request_lost_on_max_attempts_replicas_fails():
    host = FakeHost({name: {"generate": "die"} for name in ("generator_0_0", "generator_1_0")})
    service = make_service(host, max_attempts=2)
    await service.start()
    with pytest.raises(RequestFailed, match="lost on 2 replicas"):
        await service.call("generate", 1)
    assert service.metrics()["services/generator/failed_requests"] == 1
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


async def test_endpoints_are_typed_handles_that_route_to_one_replica_or_fan_out_to_all():
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


def test_services_config_is_validated_with_the_key_named():
    from rl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"services.generator.call_timout_s: Extra inputs are not permitted"):
        load_config(None, {"services.generator.call_timout_s": "5"})
    with pytest.raises(ConfigError, match=r"min_healthy_replicas \(2\) exceeds the 1 replicas of generator"):
        load_config(None, {"services.generator.min_healthy_replicas": "2"})
    config = load_config(None, {"generator.num_replicas": "2", "services.generator.min_healthy_replicas": "2"})
    assert (
        config.services.generator.min_healthy_replicas == 2
        and config.services.breaker.max_consecutive_failed_groups == 16
    )


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
