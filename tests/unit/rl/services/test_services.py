"""The service layer's small parts over plain values: the router, the ledger, the circuit breaker, the config."""

import pytest

from rl.config.services import BreakerConfig
from rl.services.breaker import CircuitBreaker, group_failure
from rl.services.ledger import Ledger
from rl.services.router import Router
from rollouts.types import Rollout, RolloutGroup, RolloutStatus


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
