"""The judge reward function with the real Qwen3 renderer and a small scripted judge model."""

import asyncio

import pytest

from rl.config.tasks import RubricConfig
from rollouts.types import Completion, GenerationFailed, Rollout, RolloutStatus, RolloutTurn
from rubrics.judge import Judge, JudgeError, connect_model, parse_score_0_10, parse_yes_no
from rubrics.rubric import RewardFn, Rubric
from tasks.build import build_rubric

IM_END = 151645
TEMPLATE = "Question: {prompt}\nReference: {answer}\nAnswer: {response}\nCorrect? yes or no."


class ScriptedJudgeModel:
    """Reads each rendered prompt and says "Yes." when the graded answer contains the reference."""

    def __init__(self, tokenizer, *, hang=False, fail_index=None):
        self.tokenizer, self.hang, self.fail_index = tokenizer, hang, fail_index
        self.batches, self.prompts = [], []

    async def generate(self, requests):
        self.batches.append(len(requests))
        if self.hang:
            await asyncio.sleep(3600)
        results = []
        for index, request in enumerate(requests):
            prompt = self.tokenizer.decode(request.prompt_token_ids)
            self.prompts.append(prompt)
            if index == self.fail_index:
                results.append(GenerationFailed("generation failed: out of memory"))
                continue
            reference = prompt.split("Reference: ")[1].split("\n")[0]
            graded = prompt.split("Answer: ")[1].split("\nCorrect?")[0]
            verdict = "Yes." if reference in graded else "No, it is wrong."
            ids = [*self.tokenizer.encode(verdict, add_special_tokens=False), IM_END]
            results.append(Completion(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop", policy_version=0))
        return results


def rollout(text, index=0):
    turn = RolloutTurn(
        prompt_messages=[{"role": "user", "content": "What is 6 * 7?"}],
        prompt_token_ids=[1],
        completion_token_ids=[2],
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


async def test_judge_grades_a_group_in_one_batched_call(renderer, tokenizer):
    model = ScriptedJudgeModel(tokenizer)
    judge = Judge(model.generate, renderer, template=TEMPLATE, max_batch=16, batch_window_s=0.05)
    rubric = Rubric([RewardFn(judge)])
    rewards = await rubric.score_group([rollout("42", 0), rollout("It is 42.", 1), rollout("41", 2)], {"answer": "42"})
    assert [r.total for r in rewards] == [1.0, 1.0, 0.0] and rewards[0].components == {"judge": 1.0}
    assert model.batches == [3]
    assert model.prompts[0] == (
        "<|im_start|>user\nQuestion: What is 6 * 7?\nReference: 42\nAnswer: 42\nCorrect? yes or no.<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


async def test_batches_are_capped_at_max_batch(renderer, tokenizer):
    model = ScriptedJudgeModel(tokenizer)
    judge = Judge(model.generate, renderer, template=TEMPLATE, max_batch=2, batch_window_s=0.05)
    values = await asyncio.gather(*(judge(rollout(str(40 + i), i), {"answer": "42"}) for i in range(5)))
    assert values == [0.0, 0.0, 1.0, 0.0, 0.0] and model.batches == [2, 2, 1]


async def test_deadline_failed_request_and_unreadable_verdict_become_reward_errors(renderer, tokenizer):
    hanging = Judge(ScriptedJudgeModel(tokenizer, hang=True).generate, renderer, template=TEMPLATE, timeout_s=0.1)
    [reward] = await Rubric([RewardFn(hanging)], error_reward=-1.0).score_group([rollout("42")], {"answer": "42"})
    assert reward.total == -1.0 and "judge call took longer than 0.1 s" in reward.error

    failing = Judge(ScriptedJudgeModel(tokenizer, fail_index=1).generate, renderer, template=TEMPLATE)
    rewards = await Rubric([RewardFn(failing)], error_reward=-1.0).score_group(
        [rollout("42", 0), rollout("42", 1)], {"answer": "42"}
    )
    assert [r.total for r in rewards] == [1.0, -1.0] and "out of memory" in rewards[1].error

    unreadable = Judge(ScriptedJudgeModel(tokenizer).generate, renderer, template=TEMPLATE, parser="score_0_10")
    [reward] = await Rubric([RewardFn(unreadable)], error_reward=-1.0).score_group([rollout("42")], {"answer": "42"})
    assert reward.total == -1.0 and "no score from 0 to 10" in reward.error


def test_parsers():
    assert parse_yes_no("Yes, correct.") == 1.0 and parse_yes_no("**No**") == 0.0
    with pytest.raises(JudgeError):
        parse_yes_no("Maybe")
    assert parse_score_0_10("Score: 7/10") == 1.0  # last integer in 0..10 is the 10 of "/10"
    assert parse_score_0_10("I give it 7") == 0.7


async def test_judge_from_config_uses_the_connected_frozen_model(renderer, tokenizer):
    config = RubricConfig.model_validate(
        {
            "reward_fns": [
                {"fn": "judge", "args": {"model": "grader", "template": TEMPLATE}, "weight": 1.0},
                {"fn": "exact_match", "weight": 1.0},
            ]
        }
    )
    rubric = build_rubric(config)
    [reward] = await rubric.score_group([rollout("It is 42")], {"answer": "42"})
    assert "no frozen model 'grader' is connected" in reward.error
    model = ScriptedJudgeModel(tokenizer)
    connect_model("grader", model.generate, renderer)
    [reward] = await rubric.score_group([rollout("It is 42")], {"answer": "42"})
    assert reward.components == {"judge": 1.0, "exact_match": 0.0} and reward.total == 0.5
