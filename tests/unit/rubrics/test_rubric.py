import asyncio
import hashlib
import math
import random
import threading
import time

import numpy
import pytest

from rollouts.types import Rollout, RolloutStatus, RolloutTurn
from rubrics.rubric import Reward, RewardFn, Rubric, apply_reward


def make_rollout(text: str, status: RolloutStatus = RolloutStatus.COMPLETED, index: int = 0) -> Rollout:
    turn = RolloutTurn(
        prompt_messages=[],
        prompt_token_ids=[1],
        completion_token_ids=[2],
        completion_logprobs=[-0.5],
        assistant_message={"role": "assistant", "content": text},
    )
    return Rollout(
        rollout_id=f"g/{index}", group_id="g", task_name="t", sample_index=index, turns=[turn], status=status
    )


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
    rewards = await rubric.score_group(
        [make_rollout("17"), make_rollout("it is 17"), make_rollout("no")], {"answer": "17"}
    )
    # weights 3/8, 1/8, 4/8
    assert [reward.total for reward in rewards] == [
        3 / 8 + 1 / 8 + 0.5 * 4 / 8,
        3 / 8 + 0.5 * 4 / 8,
        1 / 8 + 0.5 * 4 / 8,
    ]
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
    overflow = Rollout(
        rollout_id="g/0", group_id="g", task_name="t", sample_index=0, status=RolloutStatus.PROMPT_OVERFLOW
    )
    assert (
        await Rubric([RewardFn(contains_answer)], error_reward=-2.0).score_one(overflow, {"answer": "1"})
    ).total == -2.0
    assert (
        await Rubric([RewardFn(contains_answer)], truncation_reward=-1.0).score_one(overflow, {"answer": "1"})
    ).total == -1.0


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
    assert (
        ("KeyError" in rewards[1].error)
        if bad_value is None
        else ("reward function 'flaky' returned" in rewards[1].error)
    )
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

    rubric = Rubric(
        [RewardFn(sync_hang if kind == "sync" else async_hang, name="judge")], error_reward=-1.0, timeout_s=0.2
    )
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

    rewards = await Rubric([RewardFn(waits_for_sibling)]).score_group(
        [make_rollout("a", index=0), make_rollout("b", index=1)], {}
    )
    assert [reward.total for reward in rewards] == [1.0, 1.0]


@pytest.mark.parametrize("status", [RolloutStatus.ERROR, RolloutStatus.TIMEOUT, RolloutStatus.ABORTED])
async def test_unset_error_reward_grades_the_kept_partial_turns(status):
    rubric = Rubric([RewardFn(contains_answer)], error_reward=None)
    rollout = make_rollout("so far: 17", status)
    rollout.error = "environment crashed"
    [reward] = await rubric.score_group([rollout], {"answer": "17"})
    assert reward.total == 1.0 and reward.components == {"contains_answer": 1.0}
    apply_reward(rollout, reward)
    assert rollout.status is status and rollout.reward == 1.0 and rollout.error == "environment crashed"


async def test_unset_error_reward_falls_back_to_zero_for_failed_functions_and_overflow():
    def broken(rollout, example):
        raise RuntimeError("judge down")

    [reward] = await Rubric([RewardFn(broken)], error_reward=None).score_group([make_rollout("x")], {})
    assert reward.total == 0.0 and "judge down" in reward.error
    overflow = Rollout(
        rollout_id="g/0", group_id="g", task_name="t", sample_index=0, status=RolloutStatus.PROMPT_OVERFLOW
    )
    assert (
        await Rubric([RewardFn(contains_answer)], error_reward=None).score_one(overflow, {"answer": "1"})
    ).total == 0.0


def rank_by_length(rollouts, example):
    """Shortest reply gets 1, longest 0, linear in rank (ties share the lower rank)."""
    lengths = [len(r.last_assistant_text()) for r in rollouts]
    return [sorted(lengths, reverse=True).index(length) / (len(lengths) - 1) for length in lengths]


async def test_group_reward_function_sees_the_whole_group_and_mixes_with_per_rollout_ones():
    seen = []

    async def spy(rollouts, example):
        seen.append([r.status for r in rollouts])
        return rank_by_length(rollouts, example)

    rubric = Rubric(
        [RewardFn(contains_answer, 1.0), RewardFn(spy, 3.0, name="rank", group=True)], truncation_reward=-1.0
    )
    rollouts = [
        make_rollout("17", index=0),
        make_rollout("the answer is 17", index=1),
        make_rollout("x" * 40, RolloutStatus.TRUNCATED, 2),
        make_rollout("18?", index=3),
    ]
    rewards = await rubric.score_group(rollouts, {"answer": "17"})
    # lengths 2, 16, 40, 3 -> ranks (descending order 40,16,3,2): 3/3, 1/3, 0, 2/3; weights 1/4 contains, 3/4 rank
    assert seen == [
        [RolloutStatus.COMPLETED, RolloutStatus.COMPLETED, RolloutStatus.TRUNCATED, RolloutStatus.COMPLETED]
    ]
    assert [r.total for r in rewards] == pytest.approx([0.25 + 0.75, 0.25 + 0.75 / 3, -1.0, 0.75 * 2 / 3])
    assert rewards[1].components == pytest.approx({"contains_answer": 1.0, "rank": 1 / 3})


@pytest.mark.parametrize("bad", ["raises", "wrong_length", "nan"])
async def test_failing_group_function_fails_every_graded_rollout(bad):
    def group_fn(rollouts, example):
        if bad == "raises":
            raise ValueError("no judge")
        return [1.0] if bad == "wrong_length" else [float("nan")] * len(rollouts)

    rubric = Rubric(
        [RewardFn(contains_answer), RewardFn(group_fn, group=True)], error_reward=-2.0, truncation_reward=0.5
    )
    rollouts = [
        make_rollout("17", index=0),
        make_rollout("17", index=1),
        make_rollout("17", RolloutStatus.TRUNCATED, 2),
    ]
    rewards = await rubric.score_group(rollouts, {"answer": "17"})
    assert [r.total for r in rewards] == [-2.0, -2.0, 0.5]
    assert "group_fn" in rewards[0].error


async def test_task_score_group_defaults_to_its_rubric_and_can_be_overridden():
    from tasks.sum_digits import SumDigitsTask

    task = SumDigitsTask(num_digits=2, num_validation=4)
    task.rubric = task.build_rubric()
    rewards = await task.score_group([make_rollout("11"), make_rollout("12")], {"answer": 11})
    assert [r.total for r in rewards] == [1.0, 0.0]

    class Constant(SumDigitsTask):
        async def score_group(self, rollouts, example):
            return [Reward(total=0.25) for _ in rollouts]

    assert [r.total for r in await Constant().score_group([make_rollout("11")], {})] == [0.25]


async def test_a_reward_function_that_cannot_go_to_a_worker_runs_in_a_thread_with_one_warning(capsys):
    offset = 0.25

    def closure_reward(rollout, example):  # a local function does not pickle: no worker process can take it
        return offset

    rubric = Rubric([RewardFn(closure_reward, name="closure_reward_once")])
    for _ in range(2):
        rewards = await rubric.score_group([make_rollout("a", index=0), make_rollout("b", index=1)], {})
        assert [reward.total for reward in rewards] == [0.25, 0.25]
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rlmesh: warning: ")]
    assert len(warnings) == 1, warnings
    assert "reward function 'closure_reward_once' cannot be sent to a worker process" in warnings[0]
    assert "runs in a thread" in warnings[0]


def draws_a_number(rollout, example):
    """A sync reward that draws from the global RNGs (a sampled judge, a random tie-break)."""
    import numpy

    return (random.random() + float(numpy.random.random())) / 2


def seeded_draws(seed: int) -> float:
    """What `draws_a_number` returns after both global RNGs are seeded with `seed`, computed here."""
    return (random.Random(seed).random() + float(numpy.random.RandomState(seed % 2**32).random_sample())) / 2


async def test_a_sync_reward_draws_the_same_numbers_for_a_rollout_in_any_worker_after_any_calls():
    rubric = Rubric([RewardFn(draws_a_number, name="noisy")])
    rubric.seed = 7
    rollouts = [make_rollout("x", index=i) for i in range(6)]
    first = [reward.total for reward in await rubric.score_group(rollouts, {})]
    again = [reward.total for reward in await rubric.score_group(rollouts[::-1], {})][::-1]  # other workers, order
    assert first == again and len(set(first)) == 6
    # each call's RNGs are seeded with sha256("<run seed>/<rollout id>/<function name>")'s first 8 bytes
    seeds = [int.from_bytes(hashlib.sha256(f"7/g/{i}/noisy".encode()).digest()[:8], "little") for i in range(6)]
    assert first == [seeded_draws(seed) for seed in seeds]
    rubric.seed = 8  # another run draws other numbers
    assert [reward.total for reward in await rubric.score_group(rollouts, {})] != first
