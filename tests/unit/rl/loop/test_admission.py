"""Row-granular admission: the concurrency cap, the staleness budget, and the slots rows give back."""

import asyncio

import pytest

from rl.loop.admission import Admission


async def admit_all_possible(admission: Admission) -> int:
    admitted = 0
    while admission.capacity() > 0:
        await admission.acquire()
        admitted += 1
    return admitted


async def test_capacity_is_the_smaller_of_the_two_budgets():
    # staleness 1, 2 rows per step: (0 + 1 + 1) * 2 = 4 rows ahead at version 0; the cap is 3
    admission = Admission(max_concurrent=3, max_staleness=1, rows_per_step=2)
    assert admission.capacity() == 3
    assert await admit_all_possible(admission) == 3
    await admission.finish(accepted=True)  # running 2, accepted 1: cap 3 - 2 = 1, staleness 4 - 3 = 1
    assert admission.capacity() == 1
    await admission.finish(accepted=True)
    await admission.finish(accepted=True)  # running 0, accepted 3: staleness 4 - 3 = 1
    assert admission.capacity() == 1


async def test_staleness_budget_zero_is_synchronous():
    admission = Admission(max_concurrent=100, max_staleness=0, rows_per_step=2)
    assert await admit_all_possible(admission) == 2
    for _ in range(2):
        await admission.finish(accepted=True)
    assert admission.capacity() == 0  # both rows wait in the buffer for the step at version 0
    await admission.set_policy_version(1)
    assert admission.capacity() == 2


async def test_rejected_and_evicted_rows_give_their_slot_back():
    admission = Admission(max_concurrent=100, max_staleness=0, rows_per_step=2)
    await admit_all_possible(admission)
    await admission.finish(accepted=False)  # e.g. a constant-reward group
    assert admission.capacity() == 1
    await admission.finish(accepted=True)
    await admission.acquire()
    await admission.finish(accepted=True)
    assert admission.capacity() == 0
    await admission.release_accepted(1)  # the consumer evicted one as stale
    assert admission.capacity() == 1


async def test_acquire_waits_for_the_policy_version_and_reports_it():
    admission = Admission(max_concurrent=100, max_staleness=1, rows_per_step=1)
    assert [await admission.acquire(), await admission.acquire()] == [0, 0]
    waiting = asyncio.ensure_future(admission.acquire())
    await asyncio.sleep(0.01)
    assert not waiting.done()
    await admission.finish(accepted=True)
    await asyncio.sleep(0.01)
    assert not waiting.done()  # a finished row still holds its slot until it is trained
    await admission.set_policy_version(1)
    assert await waiting == 1


@pytest.mark.parametrize("max_staleness", [0, 1, 2])
async def test_rows_trained_in_order_are_never_older_than_the_budget(max_staleness):
    """Producer and consumer on the same clock: every trained row's admission version is within the budget."""
    rows_per_step, steps = 3, 6
    admission = Admission(max_concurrent=4, max_staleness=max_staleness, rows_per_step=rows_per_step)
    finished: asyncio.Queue[int] = asyncio.Queue()

    async def produce():
        while True:
            version = await admission.acquire()
            await asyncio.sleep(0)  # generation
            await finished.put(version)
            await admission.finish(accepted=True)

    producer = asyncio.create_task(produce())
    lags = []
    for policy_version in range(steps):
        batch = [await finished.get() for _ in range(rows_per_step)]
        lags += [policy_version - version for version in batch]
        await admission.set_policy_version(policy_version + 1)
    producer.cancel()
    assert max(lags) <= max_staleness
    assert (max(lags) > 0) == (max_staleness > 0)  # a budget above 0 is used
