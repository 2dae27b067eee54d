"""RendererEnv + the task rollout fanned out per row, with the real Qwen3 renderer and a scripted generator."""

import asyncio

import pytest

from env_types.message_env import MessageEnv, ResetOutput, StepOutput
from rl.config.tasks import RendererEnvConfig
from rollouts.fanout import RolloutContext, rollout_group, task_rollout
from rollouts.types import Completion, GenerationFailed, RolloutStatus
from tasks.sum_digits import SumDigitsTask

IM_END = 151645


def scripted_generator(tokenizer, reply: str, *, finish_reason="stop", fail_when=None, calls=None, versions=None):
    """`versions(n)`: the per-token versions of an n-token completion (a request continued across weight updates)."""

    async def generate(requests):
        if calls is not None:
            calls.append(requests)
        results = []
        for request in requests:
            if fail_when is not None and fail_when(request):
                results.append(GenerationFailed("generation failed: boom"))
                continue
            ids = tokenizer.encode(reply, add_special_tokens=False) + ([IM_END] if finish_reason == "stop" else [])
            token_versions = versions(len(ids)) if versions is not None else []
            results.append(
                Completion(
                    token_ids=ids,
                    logprobs=[-0.5] * len(ids),
                    finish_reason=finish_reason,
                    policy_version=min(token_versions, default=7),
                    token_policy_versions=token_versions,
                )
            )
        return results

    return generate


def spec(task, row, renderer, env_config, index=0):
    return dict(row_id=f"g{index}", task=task, row=row, renderer=renderer, env_config=env_config)


async def collect_groups(specs, group_size, generate):
    """Every spec's row fanned out to `group_size` task rollouts, each request sent to `generate` on its own."""

    async def one(request):
        [result] = await generate([request])
        if isinstance(result, GenerationFailed):
            raise result
        return result

    async def group(spec):
        def context(index):
            return RolloutContext(
                spec["row_id"], index, "sum_digits", spec["task"], spec["renderer"], spec["env_config"], one
            )

        return await rollout_group(spec["row_id"], "sum_digits", spec["row"], group_size, task_rollout, context)

    return list(await asyncio.gather(*(group(spec) for spec in specs)))


async def test_single_turn_group_completes_with_exact_tokens(renderer, tokenizer):
    task = SumDigitsTask(num_digits=2, num_validation=4)
    row = task.load_dataset("validation")[0]
    [group] = await collect_groups(
        [spec(task, row, renderer, RendererEnvConfig(max_new_tokens=8))], 3, scripted_generator(tokenizer, "9")
    )
    assert [r.status for r in group.rollouts] == [RolloutStatus.COMPLETED] * 3
    turn = group.rollouts[0].turns[0]
    expected_prompt = f"<|im_start|>user\n{row['prompt']}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert tokenizer.decode(turn.prompt_token_ids) == expected_prompt
    assert turn.assistant_message == {"role": "assistant", "content": "9"}
    assert turn.completion_token_ids[-1] == IM_END and turn.policy_version == 7


async def test_a_continued_completion_keeps_each_tokens_version_and_ages_the_group_by_its_oldest(renderer, tokenizer):
    task = SumDigitsTask(num_digits=2, num_validation=4)
    row = task.load_dataset("validation")[0]
    generate = scripted_generator(tokenizer, "1 2 3", versions=lambda n: [5] * 2 + [6] * (n - 2))
    [group] = await collect_groups([spec(task, row, renderer, RendererEnvConfig(max_new_tokens=8))], 2, generate)
    turn = group.rollouts[0].turns[0]
    assert turn.token_policy_versions == [5, 5] + [6] * (len(turn.completion_token_ids) - 2)
    assert turn.policy_version == 5 and group.min_policy_version == 5


async def test_prompt_overflow_never_reaches_the_generator(renderer, tokenizer):
    task = SumDigitsTask(num_digits=2, num_validation=4, prompt_template="{number} " + "very long prompt " * 40)
    short = SumDigitsTask(num_digits=2, num_validation=4)
    calls = []
    groups = await collect_groups(
        [
            spec(task, task.load_dataset("validation")[0], renderer, RendererEnvConfig(max_prompt_tokens=64), 0),
            spec(short, short.load_dataset("validation")[0], renderer, RendererEnvConfig(max_prompt_tokens=64), 1),
        ],
        2,
        scripted_generator(tokenizer, "5", calls=calls),
    )
    assert [r.status for r in groups[0].rollouts] == [RolloutStatus.PROMPT_OVERFLOW] * 2
    assert all(not r.turns for r in groups[0].rollouts)
    assert [r.status for r in groups[1].rollouts] == [RolloutStatus.COMPLETED] * 2
    assert len(calls) == 2 and all(len(call) == 1 and len(call[0].prompt_token_ids) <= 64 for call in calls)


async def test_length_finish_is_truncated(renderer, tokenizer):
    task = SumDigitsTask(num_digits=2, num_validation=4)
    [group] = await collect_groups(
        [spec(task, task.load_dataset("validation")[0], renderer, RendererEnvConfig())],
        1,
        scripted_generator(tokenizer, "1 2 3", finish_reason="length"),
    )
    assert group.rollouts[0].status is RolloutStatus.TRUNCATED


async def test_failed_generation_fails_only_its_samples(renderer, tokenizer):
    task = SumDigitsTask(num_digits=2, num_validation=4)
    rows = task.load_dataset("validation")[:2]
    bad_prompt = renderer.render_ids([{"role": "user", "content": rows[0]["prompt"]}], add_generation_prompt=True)
    groups = await collect_groups(
        [spec(task, rows[0], renderer, RendererEnvConfig(), 0), spec(task, rows[1], renderer, RendererEnvConfig(), 1)],
        2,
        scripted_generator(tokenizer, "3", fail_when=lambda request: request.prompt_token_ids == bad_prompt),
    )
    assert [r.status for r in groups[0].rollouts] == [RolloutStatus.ERROR] * 2
    assert "boom" in groups[0].rollouts[0].error
    assert [r.status for r in groups[1].rollouts] == [RolloutStatus.COMPLETED] * 2


class FaultyEnv(MessageEnv):
    def __init__(self, fault: str):
        self.fault = fault

    async def reset(self):
        if self.fault == "reset_raises":
            raise RuntimeError("sandbox unavailable")
        if self.fault == "reset_garbage":
            return {"messages": []}
        return ResetOutput(messages=[{"role": "user", "content": "hi"}])

    async def step(self, assistant_message):
        if self.fault == "step_hangs":
            await asyncio.sleep(3600)
        if self.fault == "step_garbage":
            return None
        return StepOutput(done=True)


class FaultyTask(SumDigitsTask):
    def make_env(self, example):
        return FaultyEnv(example["fault"])


@pytest.mark.parametrize(
    "fault, status, text",
    [
        ("reset_raises", RolloutStatus.ERROR, "sandbox unavailable"),
        ("reset_garbage", RolloutStatus.ERROR, "returned dict, expected ResetOutput"),
        ("step_hangs", RolloutStatus.TIMEOUT, "longer than 0.2 s"),
        ("step_garbage", RolloutStatus.ERROR, "returned NoneType, expected StepOutput"),
        ("none", RolloutStatus.COMPLETED, None),
    ],
)
async def test_faulty_environment_becomes_an_error_or_timeout_record(renderer, tokenizer, fault, status, text):
    groups = await collect_groups(
        [
            spec(FaultyTask(), {"fault": fault}, renderer, RendererEnvConfig(env_timeout_s=0.2)),
            spec(FaultyTask(), {"fault": "none"}, renderer, RendererEnvConfig(env_timeout_s=0.2), 1),
        ],
        2,
        scripted_generator(tokenizer, "ok"),
    )
    assert [r.status for r in groups[0].rollouts] == [status] * 2
    if text:
        assert text in groups[0].rollouts[0].error
    assert [r.status for r in groups[1].rollouts] == [RolloutStatus.COMPLETED] * 2


class RetryEnv(MessageEnv):
    """Multi-turn: says "try again" until the answer is 4."""

    async def reset(self):
        return ResetOutput(messages=[{"role": "user", "content": "2+2?"}])

    async def step(self, assistant_message):
        if assistant_message["content"].strip() == "4":
            return StepOutput(done=True, reward_components={"solved": 1.0})
        return StepOutput(messages=[{"role": "user", "content": "Wrong, try again."}], done=False)


class RetryTask(SumDigitsTask):
    def make_env(self, example):
        return RetryEnv()


async def test_multi_turn_prompts_extend_the_sampled_tokens_and_max_turns_truncates(renderer, tokenizer):
    [group] = await collect_groups(
        [spec(RetryTask(), {}, renderer, RendererEnvConfig(max_turns=3))], 1, scripted_generator(tokenizer, "5")
    )
    rollout = group.rollouts[0]
    assert rollout.status is RolloutStatus.TRUNCATED and len(rollout.turns) == 3
    for previous, current in zip(rollout.turns, rollout.turns[1:]):
        prefix = previous.prompt_token_ids + previous.completion_token_ids
        assert current.prompt_token_ids[: len(prefix)] == prefix
        assert current.prompt_messages[-1] == {"role": "user", "content": "Wrong, try again."}
    assert rollout.turns[0].env_messages == [{"role": "user", "content": "Wrong, try again."}]


async def test_multi_turn_done_with_env_reward(renderer, tokenizer):
    [group] = await collect_groups(
        [spec(RetryTask(), {}, renderer, RendererEnvConfig(max_turns=3))], 1, scripted_generator(tokenizer, "4")
    )
    rollout = group.rollouts[0]
    assert rollout.status is RolloutStatus.COMPLETED and rollout.turns[0].reward_components == {"solved": 1.0}


async def test_each_sample_gets_its_own_sampling_seed(renderer, tokenizer):
    from rollouts.renderer_env import sampling_seed

    task = SumDigitsTask(num_digits=2, num_validation=4)
    calls = []
    generate = scripted_generator(tokenizer, "9", calls=calls)

    async def one(request):
        return (await generate([request]))[0]

    def context(index):
        return RolloutContext("train/row=3", index, "sum_digits", task, renderer, RendererEnvConfig(), one, run_seed=5)

    await rollout_group("train/row=3", "sum_digits", task.load_dataset("validation")[0], 3, task_rollout, context)
    assert sorted(request.seed for [request] in calls) == sorted(
        sampling_seed(5, f"train/row=3/{i}", 0) for i in range(3)
    )
    assert len({request.seed for [request] in calls}) == 3


async def test_each_request_asks_for_what_is_left_of_the_token_budget(renderer, tokenizer):
    """max_new_tokens of a request = min(env.max_new_tokens, env.max_total_tokens - prompt length)."""
    task = SumDigitsTask(num_digits=2, num_validation=4)
    row = task.load_dataset("validation")[0]
    roomy, tight = [], []
    await collect_groups(
        [spec(task, row, renderer, RendererEnvConfig(max_new_tokens=8))],
        1,
        scripted_generator(tokenizer, "9", calls=roomy),
    )
    prompt_length = len(roomy[0][0].prompt_token_ids)
    assert roomy[0][0].max_new_tokens == 8
    near_the_end = RendererEnvConfig(
        max_new_tokens=8, max_prompt_tokens=prompt_length, max_total_tokens=prompt_length + 3
    )
    await collect_groups([spec(task, row, renderer, near_the_end)], 1, scripted_generator(tokenizer, "9", calls=tight))
    assert tight[0][0].max_new_tokens == 3


async def test_an_aborted_generation_is_an_aborted_rollout(renderer, tokenizer):
    task = SumDigitsTask(num_digits=2, num_validation=4)
    [group] = await collect_groups(
        [spec(task, task.load_dataset("validation")[0], renderer, RendererEnvConfig(max_new_tokens=8))],
        2,
        scripted_generator(tokenizer, "1", finish_reason="abort"),
    )
    assert [rollout.status for rollout in group.rollouts] == [RolloutStatus.ABORTED] * 2
    assert [len(rollout.turns) for rollout in group.rollouts] == [1, 1]  # the sampled tokens are kept with the record
