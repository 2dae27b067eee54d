"""The rollout contract: a user's rollout_fn fanned out per row and joined by row id."""

import asyncio

from rl.config.tasks import RendererEnvConfig, TaskConfig
from rollouts.fanout import RolloutContext, rollout_group
from rollouts.types import RolloutStatus, RolloutTurn
from tasks.build import build_task
from tasks.sum_digits import SumDigitsTask


def contexts(row_id: str, calls: list):
    async def generate(request):
        raise AssertionError("these rollout_fns do not generate")

    def context(index: int) -> RolloutContext:
        calls.append((row_id, index))
        return RolloutContext(row_id, index, "sum_digits", SumDigitsTask(), None, RendererEnvConfig(), generate)

    return context


async def picky_rollout(row, context):
    """Sample 1 is dropped, sample 2 raises, sample 3 returns garbage; the others finish after different delays."""
    row["seen"] = True  # mutating the row must not leak into the other samples
    if context.sample_index == 1:
        return None
    if context.sample_index == 2:
        raise ValueError("sandbox exploded")
    if context.sample_index == 3:
        return "not a rollout"
    await asyncio.sleep(0.01 * (5 - context.sample_index) + 0.001 * len(row["tag"]))
    rollout = context.new_rollout()
    rollout.turns.append(
        RolloutTurn(
            prompt_messages=[], prompt_token_ids=[1], completion_token_ids=[2], policy_version=context.sample_index
        )
    )
    rollout.status = RolloutStatus.COMPLETED
    rollout.metadata["row"] = dict(row)
    return rollout


async def test_fan_out_joins_by_row_id_drops_none_and_isolates_exceptions():
    calls = []
    rows = {"r0": {"tag": "a"}, "r1": {"tag": "bbbb"}}
    groups = await asyncio.gather(
        *(
            rollout_group(row_id, "sum_digits", row, 6, picky_rollout, contexts(row_id, calls))
            for row_id, row in rows.items()
        )
    )
    assert sorted(calls) == [(row_id, index) for row_id in rows for index in range(6)]
    for group, (row_id, row) in zip(groups, rows.items()):
        assert group.group_id == row_id and group.example == row == {"tag": row["tag"]}
        assert [r.sample_index for r in group.rollouts] == [0, 2, 3, 4, 5]  # sample 1 returned None
        assert all(r.group_id == row_id and r.rollout_id == f"{row_id}/{r.sample_index}" for r in group.rollouts)
        by_index = {r.sample_index: r for r in group.rollouts}
        assert by_index[2].status is RolloutStatus.ERROR and "sandbox exploded" in by_index[2].error
        assert by_index[3].status is RolloutStatus.ERROR and "expected Rollout or None" in by_index[3].error
        for index in (0, 4, 5):
            assert by_index[index].status is RolloutStatus.COMPLETED
            assert by_index[index].policy_versions == [index]
            assert by_index[index].metadata["row"] == {"tag": row["tag"], "seen": True}


async def scored_rollout(row, context):
    rollout = context.new_rollout()
    rollout.status, rollout.reward = RolloutStatus.COMPLETED, float(context.sample_index)
    return rollout


def test_rollout_fn_is_chosen_by_import_path():
    built = build_task(TaskConfig(name="sum_digits", rollout_fn="tests.unit.rollouts.test_fanout:scored_rollout"))
    assert built.rollout_fn is scored_rollout
    assert build_task(TaskConfig(name="sum_digits")).rollout_fn.__name__ == "task_rollout"
