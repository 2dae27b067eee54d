import asyncio

import pytest

from rl.loop.buffer import RolloutBuffer, is_fresh
from rl.loop.data import RowStream, row_limit
from rollouts.types import Rollout, RolloutGroup, RolloutTurn


def test_row_stream_is_deterministic_and_covers_each_epoch():
    rows = {"a": [{"i": i} for i in range(5)], "b": [{"j": j} for j in range(3)]}
    first = RowStream(rows, {"a": 1.0, "b": 1.0}, seed=7).take(40)
    second = RowStream(rows, {"a": 1.0, "b": 1.0}, seed=7).take(40)
    assert first == second
    a_rows = [row["i"] for name, row in first if name == "a"]
    assert sorted(a_rows[:5]) == [0, 1, 2, 3, 4]
    assert RowStream(rows, {"a": 1.0, "b": 1.0}, seed=8).take(40) != first


def test_row_stream_weights_zero_share():
    rows = {"a": [{"i": 0}], "b": [{"j": 0}]}
    stream = RowStream(rows, {"a": 1.0, "b": 1e-12}, seed=0)
    assert {name for name, _ in stream.take(50)} == {"a"} and stream.cursor == 50


def test_empty_split_rejected():
    with pytest.raises(ValueError, match="empty"):
        RowStream({"a": []}, {"a": 1.0}, seed=0)


@pytest.mark.parametrize(
    "group_version, trainer_version, budget, fresh",
    [(5, 5, 0, True), (4, 5, 0, False), (4, 5, 1, True), (3, 5, 1, False), (3, 5, 2, True)],
)
def test_staleness_admission(group_version, trainer_version, budget, fresh):
    assert is_fresh(group_version, trainer_version, budget) is fresh


def group(version: int, name: str) -> RolloutGroup:
    turn = RolloutTurn(prompt_messages=[], prompt_token_ids=[1], completion_token_ids=[2], policy_version=version)
    return RolloutGroup(
        group_id=name,
        task_name="t",
        example={},
        rollouts=[Rollout(rollout_id=f"{name}/0", group_id=name, task_name="t", sample_index=0, turns=[turn])],
    )


async def test_buffer_evicts_stale_groups_and_waits_for_enough():
    buffer = RolloutBuffer(max_staleness=1)
    await buffer.put(group(0, "old"))
    await buffer.put(group(1, "ok1"))
    waiting = asyncio.ensure_future(buffer.get(2, trainer_policy_version=2))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    await buffer.put(group(2, "ok2"))
    groups, evicted = await waiting
    assert [g.group_id for g in groups] == ["ok1", "ok2"] and len(evicted) == 1


async def test_closed_buffer_returns_what_is_left():
    buffer = RolloutBuffer(max_staleness=0)
    await buffer.put(group(0, "last"))
    buffer.close()
    assert [g.group_id for g in (await buffer.get(2, trainer_policy_version=0))[0]] == ["last"]
    assert await buffer.get(2, trainer_policy_version=0) == ([], [])


def test_row_stream_ends_at_its_limit_with_fresh_copies():
    rows = {"a": [{"i": [0]}, {"i": [1]}, {"i": [2]}]}
    assert row_limit(rows, epochs=2, max_rows=None) == 6
    assert row_limit(rows, epochs=2, max_rows=4) == 4
    assert row_limit(rows, epochs=None, max_rows=None) is None
    stream = RowStream(rows, {"a": 1.0}, seed=0, limit=row_limit(rows, epochs=1.5, max_rows=None))
    first = stream.next()
    first[1]["i"].append(99)  # a rollout that mutates its row
    rest = stream.take(10)
    assert len(rest) == 3 and stream.next() is None and stream.cursor == 4
    assert all(len(row["i"]) == 1 for _, row in rest) and rows["a"][first[1]["i"][0]] == {"i": [first[1]["i"][0]]}


def test_rows_are_copies_per_draw():
    rows = [{"n": 1, "seen": []}]
    stream = RowStream({"t": rows}, {"t": 1.0}, seed=0)
    stream.next()[1]["seen"].append("mutated")
    assert stream.next()[1] == {"n": 1, "seen": []} and rows[0] == {"n": 1, "seen": []}
