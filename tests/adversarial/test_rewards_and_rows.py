"""Rewards that would poison the advantages, rows that would pay the answer "None", and a breaker that
must open on timeouts too: the reward path under hostile input."""

import asyncio
import json

import pytest
import torch

from env_types.message_env import MessageEnv, ResetOutput, StepOutput
from rl.algorithms.advantages import grpo_advantages
from rl.config.services import BreakerConfig
from rl.config.tasks import RendererEnvConfig, TaskConfig
from rl.services.breaker import CircuitBreaker, group_failure
from rollouts.fanout import RolloutContext, run_sample
from rollouts.types import Rollout, RolloutGroup, RolloutStatus, RolloutTurn
from rubrics.builtins import answer_tag_format, last_tag
from rubrics.rubric import RewardFn, Rubric
from tasks.build import build_task
from tasks.sum_digits import SumDigitsTask
from tasks.testing import play
from tests.support import payloads


def rollout(text: str, index: int = 0) -> Rollout:
    turn = RolloutTurn(
        prompt_messages=[],
        prompt_token_ids=[1],
        completion_token_ids=[2],
        completion_logprobs=[-0.5],
        assistant_message={"role": "assistant", "content": text},
    )
    return Rollout(
        rollout_id=f"g/{index}",
        group_id="g",
        task_name="t",
        sample_index=index,
        turns=[turn],
        status=RolloutStatus.COMPLETED,
    )


async def test_a_reward_finite_in_float64_but_not_float32_fails_only_its_rollout():
    # 1e39 > float32 max (3.4e38): GRPO's float32 advantages of [1e39, 0] are [nan, nan]
    assert torch.isnan(grpo_advantages(torch.tensor([1e39, 0.0]))).all()
    rubric = Rubric([RewardFn(payloads.huge_float)], error_reward=0.0)
    [reward] = await rubric.score_group([rollout("x")], {})
    assert reward.total == 0.0 and "reward function 'huge_float' returned 1e+39" in reward.error


async def test_a_huge_integer_reward_fails_one_rollout_not_the_group():
    rubric = Rubric([RewardFn(payloads.huge_int)], error_reward=-1.0)
    rewards = await rubric.score_group([rollout("a", 0), rollout("b", 1)], {})
    assert [reward.total for reward in rewards] == [-1.0, -1.0]
    assert all("huge_int' returned an integer of 1329 bits, too large" in reward.error for reward in rewards)


async def test_numpy_scalar_rewards_are_accepted():
    [reward] = await Rubric([RewardFn(payloads.numpy_reward)]).score_group([rollout("x")], {})
    assert reward.error is None and reward.total == 0.5 and type(reward.total) is float


async def test_a_reward_beyond_the_configured_bound_is_an_error():
    [reward] = await Rubric([RewardFn(payloads.one)], max_abs_reward=0.5).score_group([rollout("x")], {})
    assert "outside the allowed rewards [-0.5, 0.5]" in reward.error


async def test_a_rollout_fn_that_scores_itself_with_nan_gives_an_error_record():
    task = build_task(TaskConfig(name="sum_digits")).task

    async def self_scoring(row, context):
        scored = context.new_rollout()
        scored.status, scored.reward = RolloutStatus.COMPLETED, float("nan")
        return scored

    context = RolloutContext(
        row_id="r",
        sample_index=0,
        task_name="sum_digits",
        task=task,
        renderer=None,
        env_config=RendererEnvConfig(),
        generate=None,
    )
    result = await run_sample(self_scoring, {}, context)
    assert result.status is RolloutStatus.ERROR and "rollout_fn 'self_scoring' returned nan" in result.error
    assert result.reward == 0.0
    advantages = grpo_advantages(torch.tensor([result.reward, 1.0]))
    assert torch.isfinite(advantages).all()


class NanRewardEnv(MessageEnv):
    async def reset(self):
        return ResetOutput(messages=[{"role": "user", "content": "hi"}])

    async def step(self, assistant_message):
        return StepOutput(done=True, reward=float("inf"))


class NanRewardTask(SumDigitsTask):
    def make_env(self, example):
        return NanRewardEnv()


async def test_a_per_turn_env_reward_that_is_not_finite_ends_the_rollout_as_error(renderer, tokenizer):
    from rollouts.types import Completion

    async def generate(requests):
        ids = [*tokenizer.encode("ok", add_special_tokens=False), 151645]
        return [Completion(token_ids=ids, logprobs=[-0.1] * len(ids), finish_reason="stop", policy_version=0)]

    result = await play(
        NanRewardTask(), {}, renderer, RendererEnvConfig(max_total_tokens=512, max_prompt_tokens=256), generate
    )
    assert result.status is RolloutStatus.ERROR and "NanRewardEnv.step returned inf" in result.error


def test_a_row_missing_a_field_fails_at_load_naming_task_row_and_field(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"question": "2+2", "answer": "4"}) + "\n" + json.dumps({"question": "3+3"}) + "\n")
    built = build_task(TaskConfig(name="arithmetic_retry", data={"train": str(data)}))
    with pytest.raises(
        ValueError,
        match=r"task 'arithmetic_retry', train split \(.*rows.jsonl\): row 1 has field 'answer' (null|missing)",
    ):
        built.load_rows("train")


def test_a_task_row_with_a_none_field_fails_at_load():
    class NoneRows(SumDigitsTask):
        row_fields = ("number", "answer")

        def load_dataset(self, split):
            return [{"number": 47, "answer": 11}, {"number": 12, "answer": None}]

    built = build_task(TaskConfig(name="sum_digits"))
    built.task = NoneRows()
    with pytest.raises(ValueError, match=r"train split \(load_dataset\): row 1 has field 'answer' null"):
        built.load_rows("train")


def group_of(*statuses: RolloutStatus) -> RolloutGroup:
    rollouts = [
        Rollout(rollout_id=f"g/{i}", group_id="g", task_name="t", sample_index=i, status=status)
        for i, status in enumerate(statuses)
    ]
    return RolloutGroup(group_id="g", task_name="t", example={}, rollouts=rollouts)


def test_the_breaker_opens_on_all_timeout_and_aborted_groups():
    opened = []
    breaker = CircuitBreaker(BreakerConfig(max_consecutive_failed_groups=5, window_groups=100), opened.append)
    for index in range(200):
        statuses = [RolloutStatus.TIMEOUT] * 4 if index % 2 else [RolloutStatus.ABORTED, RolloutStatus.ERROR]
        breaker.record(*group_failure(group_of(*statuses)))
    assert breaker.open and len(opened) == 1 and "5 consecutive groups failed" in opened[0]
    assert group_failure(group_of(RolloutStatus.TIMEOUT, RolloutStatus.COMPLETED))[0] is False


def test_last_tag_of_a_reply_full_of_unclosed_tags():
    # 400k characters of unclosed tags: minutes of CPU with the quadratic regex (1.2 s at 40k), milliseconds now
    assert last_tag("<answer>" * 50_000 + "x") is None
    assert answer_tag_format(rollout("<answer>" * 50_000), {}) == 0.0
    assert last_tag("<answer>1</answer> and <answer> 2 </answer><answer>3") == " 2 "
    assert last_tag("<answer><answer>x</answer>") == "<answer>x"  # the regex's leftmost, non-greedy matches
    assert answer_tag_format(rollout("<answer>a</answer>"), {}) == 1.0
    assert answer_tag_format(rollout("<answer>a</answer><answer>b</answer>"), {}) == 0.0


async def test_a_poison_group_is_not_handed_to_a_third_replica():
    from rl.services.service import RequestFailed
    from tests.support.services_fakes import FakeHost, make_service

    host = FakeHost({name: {"generate": "hang"} for name in ("generator_0_0", "generator_1_0", "generator_2_0")})
    service = make_service(host, replicas=3, call_timeout_s=0.1, max_attempts=3)
    await service.start()
    with pytest.raises(RequestFailed, match="lost on 2 replicas the same way twice .*deadline.*poison") as failed:
        await service.call("generate", 1)
    assert failed.value.timed_out
    assert sum(1 for actor in host.actors.values() if actor.calls) == 2  # the third replica never saw it
    await service.stop()


async def test_a_reply_that_freezes_math_verify_times_out_while_the_event_loop_keeps_running():
    # `\boxed{2^{2^{40}}}` held the GIL in math_verify for 33 s past a 3 s rubric timeout, freezing the RewardActor's loop
    from rubrics.builtins import math_verify

    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.05)
            ticks += 1

    poison, fine = rollout(r"\boxed{2^{2^{40}}}", 0), rollout(r"\boxed{4}", 1)
    # the workers start and import math-verify first (seconds on a loaded machine), so the 2 s below is the call's own
    await Rubric([RewardFn(math_verify)], timeout_s=60.0).score_group([fine, fine], {"answer": "4"})
    running = asyncio.create_task(ticker())
    try:
        rubric = Rubric([RewardFn(math_verify)], timeout_s=2.0)
        rewards = await rubric.score_group([poison, fine], {"answer": "4"})
    finally:
        running.cancel()
    assert rewards[0].timed_out and "took longer than 2.0 s" in rewards[0].error
    assert rewards[1].error is None and rewards[1].total == 1.0
    assert ticks >= 5  # the loop kept turning while the worker spun (a thread held the GIL and froze it at 0)
