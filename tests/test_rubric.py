import asyncio
import math
import threading
import time

import pytest

from rollouts.types import Rollout, RolloutStatus, RolloutTurn
from rubrics.rubric import RewardFn, Rubric, apply_reward


def make_rollout(text: str, status: RolloutStatus = RolloutStatus.COMPLETED, index: int = 0) -> Rollout:
    turn = RolloutTurn(prompt_messages=[], prompt_token_ids=[1], completion_token_ids=[2], completion_logprobs=[-0.5],
                       assistant_message={"role": "assistant", "content": text})
    return Rollout(rollout_id=f"g/{index}", group_id="g", task_name="t", sample_index=index, turns=[turn], status=status)


def contains_answer(rollout, example):
    return float(example["answer"] in rollout.last_assistant_text())


def is_short(rollout, example):
    return float(len(rollout.last_assistant_text()) <= 3)


async def async_judge(rollout, example):
    await asyncio.sleep(0)
    return 0.5


def test_weights_are_normalized_to_sum_one():
    rubric = Rubric([RewardFn(contains_answer, 3.0), RewardFn(is_short, 1.0)])
    assert rubric.weights == {"contains_answer": 0.75, "is_short": 0.25}


async def test_weighted_total_and_components():
    rubric = Rubric([RewardFn(contains_answer, 3.0), RewardFn(is_short, 1.0), RewardFn(async_judge, 4.0)])
    rewards = await rubric.score_group([make_rollout("17"), make_rollout("it is 17"), make_rollout("no")], {"answer": "17"})
    # weights 3/8, 1/8, 4/8
    assert [reward.total for reward in rewards] == [3 / 8 + 1 / 8 + 0.5 * 4 / 8, 3 / 8 + 0.5 * 4 / 8, 1 / 8 + 0.5 * 4 / 8]
    assert rewards[1].components == {"contains_answer": 1.0, "is_short": 0.0, "async_judge": 0.5}


async def test_truncation_short_circuit():
    rubric = Rubric([RewardFn(contains_answer)], truncation_reward=-1.0)
    [reward] = await rubric.score_group([make_rollout("17", RolloutStatus.TRUNCATED)], {"answer": "17"})
    assert reward.total == -1.0 and reward.components == {}


async def test_truncated_without_short_circuit_scores_partial_response():
    rubric = Rubric([RewardFn(contains_answer)], truncation_reward=None)
    [reward] = await rubric.score_group([make_rollout("17", RolloutStatus.TRUNCATED)], {"answer": "17"})
    assert reward.total == 1.0


@pytest.mark.parametrize("status", [RolloutStatus.ERROR, RolloutStatus.TIMEOUT, RolloutStatus.ABORTED])
async def test_failed_rollouts_get_error_reward_without_calling_functions(status):
    def must_not_run(rollout, example):
        raise AssertionError("called")

    rubric = Rubric([RewardFn(must_not_run)], error_reward=-0.5)
    [reward] = await rubric.score_group([make_rollout("17", status)], {})
    assert reward.total == -0.5


async def test_prompt_overflow_gets_error_reward_unless_truncation_reward_set():
    overflow = Rollout(rollout_id="g/0", group_id="g", task_name="t", sample_index=0, status=RolloutStatus.PROMPT_OVERFLOW)
    assert (await Rubric([RewardFn(contains_answer)], error_reward=-2.0).score_one(overflow, {"answer": "1"})).total == -2.0
    assert (await Rubric([RewardFn(contains_answer)], truncation_reward=-1.0).score_one(overflow, {"answer": "1"})).total == -1.0


@pytest.mark.parametrize("bad_value", [float("nan"), float("inf"), "1.0", None])
async def test_raising_or_garbage_reward_becomes_error_reward_others_unaffected(bad_value):
    def flaky(rollout, example):
        if rollout.sample_index == 1:
            if bad_value is None:
                raise KeyError("answer")
            return bad_value
        return 1.0

    rubric = Rubric([RewardFn(flaky)], error_reward=-1.0)
    rollouts = [make_rollout("a", index=0), make_rollout("b", index=1), make_rollout("c", index=2)]
    rewards = await rubric.score_group(rollouts, {})
    assert [reward.total for reward in rewards] == [1.0, -1.0, 1.0]
    assert rewards[0].error is None and rewards[2].error is None
    assert "flaky" in rewards[1].error
    assert ("KeyError" in rewards[1].error) if bad_value is None else ("not a finite number" in rewards[1].error)
    for rollout, reward in zip(rollouts, rewards):
        apply_reward(rollout, reward)
    assert rollouts[1].status is RolloutStatus.ERROR and "flaky" in rollouts[1].error and rollouts[1].reward == -1.0
    assert rollouts[0].status is RolloutStatus.COMPLETED and rollouts[0].reward == 1.0


def test_bad_rubric_definitions():
    with pytest.raises(ValueError, match="at least one"):
        Rubric([])
    with pytest.raises(ValueError, match="unique"):
        Rubric([RewardFn(is_short), RewardFn(is_short)])
    with pytest.raises(ValueError, match="positive sum"):
        Rubric([RewardFn(is_short, 0.0)])
    with pytest.raises(ValueError, match=">= 0"):
        Rubric([RewardFn(is_short, -1.0), RewardFn(contains_answer, 2.0)])


async def test_group_functions_run_concurrently():
    started = []
    release = asyncio.Event()

    async def slow(rollout, example):
        started.append(rollout.sample_index)
        if len(started) == 3:
            release.set()
        await asyncio.wait_for(release.wait(), 5)
        return 1.0

    rewards = await Rubric([RewardFn(slow)]).score_group([make_rollout("x", index=i) for i in range(3)], {})
    assert sorted(started) == [0, 1, 2] and all(math.isclose(r.total, 1.0) for r in rewards)


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_hanging_reward_function_times_out_and_others_are_scored(kind):
    never = threading.Event()

    def sync_hang(rollout, example):
        if rollout.sample_index == 0:
            never.wait()  # blocks its daemon thread forever
        return 1.0

    async def async_hang(rollout, example):
        if rollout.sample_index == 0:
            await asyncio.sleep(3600)
        return 1.0

    rubric = Rubric([RewardFn(sync_hang if kind == "sync" else async_hang, name="judge")], error_reward=-1.0, timeout_s=0.2)
    rollouts = [make_rollout("a", index=0), make_rollout("b", index=1)]
    start = time.monotonic()
    rewards = await rubric.score_group(rollouts, {})
    assert time.monotonic() - start < 5
    assert [reward.total for reward in rewards] == [-1.0, 1.0]
    assert rewards[0].timed_out and "'judge' took longer than 0.2 s" in rewards[0].error
    for rollout, reward in zip(rollouts, rewards):
        apply_reward(rollout, reward)
    assert [r.status for r in rollouts] == [RolloutStatus.TIMEOUT, RolloutStatus.COMPLETED]


async def test_sync_reward_functions_run_off_the_event_loop():
    release = threading.Event()

    def waits_for_sibling(rollout, example):
        if rollout.sample_index == 0:
            assert release.wait(5)
        else:
            release.set()
        return 1.0

    rewards = await Rubric([RewardFn(waits_for_sibling)]).score_group([make_rollout("a", index=0), make_rollout("b", index=1)], {})
    assert [reward.total for reward in rewards] == [1.0, 1.0]
