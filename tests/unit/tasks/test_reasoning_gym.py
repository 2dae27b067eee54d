"""`tasks.reasoning_gym` with the real reasoning-gym package: seeded disjoint splits, the dataset's own scorer
(through the rubric's worker process) on scripted replies, and clear errors for bad arguments."""

import json
import math

import pytest
import reasoning_gym

from rl.config.tasks import TaskConfig
from rollouts.renderer_env import RendererEnvConfig
from rollouts.types import Completion, Rollout, RolloutStatus, RolloutTurn
from tasks.build import build_task
from tasks.reasoning_gym import ReasoningGymTask, score_answer
from tasks.testing import play_group

IM_END = 151645
ADDITION = {
    "min_terms": 2,
    "max_terms": 2,
    "max_digits": 1,
    "operators": ["+"],
    "allow_negation": False,
    "allow_parentheses": False,
}


async def score(renderer, tokenizer, task, row, reply):
    """The rubric's reward of one rollout of `row` whose single turn samples `reply`."""

    async def generate(requests):
        ids = [*tokenizer.encode(reply, add_special_tokens=False), IM_END]
        return [Completion(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop", policy_version=0)]

    env_config = RendererEnvConfig(max_total_tokens=2048, max_prompt_tokens=2000)
    group = await play_group(task, row, renderer, env_config, generate)
    [rollout] = group.rollouts
    assert rollout.status is RolloutStatus.COMPLETED, rollout.error
    return rollout


async def failed(renderer, tokenizer, task, row, reply):
    """The error of one rollout of `row` whose scoring failed."""
    with pytest.raises(AssertionError, match="reward function 'score_answer' raised") as failure:
        await score(renderer, tokenizer, task, row, reply)
    return str(failure.value)


def test_splits_are_seeded_sized_and_disjoint_by_question():
    task = ReasoningGymTask("basic_arithmetic", config=ADDITION, seed=3, num_train=40, num_validation=20)
    train, validation = task.load_dataset("train"), task.load_dataset("validation")
    assert len(train) == 40 and len(validation) == 20
    questions = [row["question"] for row in train + validation]
    assert len(set(questions)) == 60  # distinct within and across the splits
    for row in train + validation:  # "Calculate a + b.", answered by the sum
        a, b = (int(term) for term in row["question"].removeprefix("Calculate ").rstrip(".").split(" + "))
        assert row["answer"] == str(a + b)
    again = ReasoningGymTask("basic_arithmetic", config=ADDITION, seed=3, num_train=40, num_validation=20)
    assert again.load_dataset("validation") == validation and again.load_dataset("train") == train
    other = ReasoningGymTask("basic_arithmetic", config=ADDITION, seed=4, num_train=40, num_validation=20)
    assert other.load_dataset("validation") != validation


def test_a_generator_with_too_few_distinct_questions_fails_saying_so():
    # a + b with small terms: a few hundred distinct questions at most (|a|, |b| <= 10 gives 21 * 21 = 441)
    with pytest.raises(
        ValueError, match=r"gave \d+ distinct questions .* fewer than num_train \+ num_validation = 520"
    ):
        ReasoningGymTask("basic_arithmetic", config=ADDITION, num_train=500, num_validation=20)


def test_unknown_dataset_and_bad_config_are_named():
    with pytest.raises(ValueError, match=r"'no_such_dataset'.*known datasets: .*basic_arithmetic"):
        ReasoningGymTask("no_such_dataset")
    with pytest.raises(ValueError, match=r"'chain_sum' with config \{'no_such_option': 1\}"):
        ReasoningGymTask("chain_sum", config={"no_such_option": 1})
    with pytest.raises(ValueError, match="prompt_template must contain"):
        ReasoningGymTask("chain_sum", prompt_template="no question here")


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("<answer>12</answer>", 1.0),
        ("Thinking: 7 + 5.\n<answer> 12 </answer>", 1.0),  # the last block, stripped
        ("<answer>13</answer>", 0.0),
        ("12", 0.0),  # no answer block: extract_answer gives None
        ("<answer>= 12</answer>", 0.5),  # the default scorer's partial credit: len("12") / len("= 12")
    ],
)
async def test_answer_tag_replies_get_the_datasets_own_score(renderer, tokenizer, reply, expected):
    task = ReasoningGymTask("basic_arithmetic", config=ADDITION, num_train=5, num_validation=5)
    row = {**task.load_dataset("train")[0], "answer": "12"}
    rollout = await score(renderer, tokenizer, task, {**row, "index": None}, reply)
    assert rollout.reward == pytest.approx(expected) and rollout.reward_components == {"score_answer": expected}
    prompt = tokenizer.decode(rollout.turns[0].prompt_token_ids)
    assert "<answer>answer here</answer>" in prompt  # reasoning-gym's "default" system prompt
    assert row["question"] in prompt


async def test_whole_reply_answers_and_templates(renderer, tokenizer):
    task = ReasoningGymTask(
        "basic_arithmetic",
        config=ADDITION,
        num_train=5,
        num_validation=5,
        system_prompt=None,
        prompt_template="{question} Answer with just the number.",
        answer_tag="",
    )
    row = task.load_dataset("validation")[0]
    right = await score(renderer, tokenizer, task, row, f"  {row['answer']}\n")
    assert right.reward == 1.0
    assert right.turns[0].prompt_messages == [
        {"role": "user", "content": f"{row['question']} Answer with just the number."}
    ]
    padded = await score(renderer, tokenizer, task, row, f"It is {row['answer']}")
    assert padded.reward == pytest.approx(len(row["answer"]) / len(f"It is {row['answer']}"))


async def test_scoring_uses_the_generated_metadata_and_file_rows_their_own(renderer, tokenizer):
    # countdown accepts any expression over the given numbers that hits the target: its scorer reads the
    # entry's metadata (numbers, target), not the reference answer
    task = ReasoningGymTask("countdown", config={"min_numbers": 3, "max_numbers": 3}, num_train=5, num_validation=5)
    [row] = [row for row in task.load_dataset("train") + task.load_dataset("validation") if row["index"] == 0]
    assert sorted(row["metadata"]["numbers"]) == [6, 54, 98] and row["metadata"]["target"] == 882
    other_order = "54 / 6 * 98"  # 9 * 98 = 882, not the reference string "98*54/6"
    assert row["answer"] != other_order
    assert (await score(renderer, tokenizer, task, row, f"<answer>{other_order}</answer>")).reward == 1.0
    assert (await score(renderer, tokenizer, task, row, "<answer>54 + 6 + 98</answer>")).reward == 0.05
    # a row from a file (no index) is scored against itself: its own numbers and target
    file_row = {"question": "Make 10 from 2, 5.", "answer": "2*5", "metadata": {"numbers": [2, 5], "target": 10}}
    assert (await score(renderer, tokenizer, task, file_row, "<answer>5*2</answer>")).reward == 1.0
    assert (await score(renderer, tokenizer, task, file_row, f"<answer>{other_order}</answer>")).reward == 0.05


def test_built_from_config_by_its_registered_name():
    built = build_task(
        TaskConfig(name="reasoning_gym", args={"dataset": "chain_sum", "seed": 1, "num_train": 8, "num_validation": 4})
    )
    assert isinstance(built.task, ReasoningGymTask)
    assert len(built.load_rows("train")) == 8 and built.rubric.weights == {"score_answer": 1.0}


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("4 - 1 = 3", 1.0),  # the last integer is the answer, scored by the dataset's exact match
        ("To subtract, 4 - 1 is 3.", 1.0),
        ("4 - 1 = 2", 0.0),
        ("three", 0.0),  # nothing matches: no answer
    ],
)
async def test_an_answer_pattern_reads_the_last_match(renderer, tokenizer, reply, expected):
    task = ReasoningGymTask(
        "basic_arithmetic", config=ADDITION, num_train=5, num_validation=5, system_prompt="", answer_pattern=r"-?\d+"
    )
    row = {"question": "Calculate 4 - 1.", "answer": "3"}
    assert (await score(renderer, tokenizer, task, row, reply)).reward == expected


def test_a_bad_answer_pattern_is_named():
    with pytest.raises(ValueError, match="is not a regular expression"):
        ReasoningGymTask("chain_sum", answer_pattern="(")
    with pytest.raises(ValueError, match="at most one group"):
        ReasoningGymTask("chain_sum", answer_pattern=r"(\d)(\d)")


async def test_an_answer_the_scorer_cannot_read_is_a_wrong_answer_not_a_failed_rollout(renderer, tokenizer):
    # prime_factorization's scorer parses every factor with int(): "((" raises ValueError inside reasoning-gym
    task = ReasoningGymTask("prime_factorization", num_train=4, num_validation=2, answer_tag="")
    row = task.load_dataset("train")[0]
    assert (await score(renderer, tokenizer, task, row, row["answer"])).reward == 1.0
    assert (await score(renderer, tokenizer, task, row, "42")).reward == 0.01  # wrong, in the right format
    for unreadable in ("((", "2 x (3", "1e999"):
        rollout = await score(renderer, tokenizer, task, row, unreadable)  # COMPLETED, not ERROR
        assert rollout.reward == 0.0 and rollout.reward_components == {"score_answer": 0.0}


async def test_a_row_the_scorer_cannot_score_still_fails_loudly_naming_it(renderer, tokenizer):
    task = ReasoningGymTask("prime_factorization", num_train=4, num_validation=2, answer_tag="")
    broken = {"question": "Factor 6.", "answer": "two times three"}  # a [tasks.data] row with an unparsable answer
    error = await failed(renderer, tokenizer, task, broken, "2 × 3")
    assert "cannot score the row 'Factor 6.'" in error and "fails on the row's own answer too" in error
    unanswered = {"question": "Factor 6."}  # no answer at all
    assert "cannot score the row 'Factor 6.'" in await failed(renderer, tokenizer, task, unanswered, "2 × 3")


HOSTILE_REPLIES = ["((", "1e999", "", "-1", "nan", "[[{", "\u202e\x00ü漢字🙂" * 3, "9" * 5000, "x (" * 20000]
"""Answers that broke or could break a scorer's parsing: unbalanced brackets, a float overflow, nothing, unicode
controls, a number too long for a float, a 60 kB reply."""


@pytest.mark.parametrize("name", sorted(set(reasoning_gym.factory.DATASETS) - {"composite"}))
def test_every_datasets_scorer_gives_hostile_answers_a_reward_in_0_1(name):
    # composite only mixes the other datasets (scored by their own scorers, fuzzed here) and cannot be built from
    # a task's JSON config
    key = (name, json.dumps({}), 0, 1)
    entry = reasoning_gym.create_dataset(name, size=1, seed=0)[0]  # given as the row: scored against itself
    for answer_tag, replies in [("", HOSTILE_REPLIES), ("answer", ["no tag: extract_answer gives None"])]:
        for reply in replies:
            turn = RolloutTurn(
                prompt_messages=[], prompt_token_ids=[1], assistant_message={"role": "assistant", "content": reply}
            )
            rollout = Rollout(rollout_id="r", group_id="g", task_name=name, sample_index=0, turns=[turn])
            reward = score_answer(rollout, entry, dataset=key, answer_tag=answer_tag)
            assert isinstance(reward, float) and math.isfinite(reward) and 0.0 <= reward <= 1.0, (
                name,
                reply[:20],
                reward,
            )
