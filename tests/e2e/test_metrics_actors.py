"""States recorded in two real actor processes are gathered and merged exactly by the controller side."""

import math

import pytest
from monarch.actor import this_host

from rl.metrics.actor import gather_states
from rl.metrics.reduce import reduce_states
from tests.support.metrics_actors import Recorder


async def test_two_replicas_reduce_like_one_process():
    procs = this_host().spawn_procs(per_host={"procs": 2})
    try:
        recorders = procs.spawn("recorder", Recorder)
        await recorders.record.call()
        states, missed = await gather_states([recorders], timeout_s=60)
        metrics, samples = reduce_states(states)
        again, _ = reduce_states((await gather_states([recorders], timeout_s=60))[0])
    finally:
        await procs.stop()
    # rank 0 recorded [1], rank 1 recorded [11, 12]: mean 8 (a mean of means would be 6.75)
    assert metrics["replica/value"] == 8.0 and metrics["replica/max"] == 12.0
    assert metrics["replica/std"] == pytest.approx(math.sqrt(((1 - 8) ** 2 + (11 - 8) ** 2 + (12 - 8) ** 2) / 3))
    assert sorted(s["value"] for s in samples["replica/samples"]) == [1, 11, 12]
    assert again == {} and missed == []  # gathering drains


async def test_gathering_from_a_hung_actor_misses_its_deadline_instead_of_hanging():
    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        recorder = procs.spawn("recorder", Recorder)
        recorder.hang.call()  # metric_states queues behind it, as behind a hung train step
        states, missed = await gather_states([recorder], timeout_s=1)
        assert states == [] and missed == [recorder]
    finally:
        await procs.stop()
