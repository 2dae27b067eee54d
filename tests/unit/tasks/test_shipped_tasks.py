"""The shipped tasks end to end on the real Qwen3 renderer with scripted replies: environment
turns, per-turn rewards and rubric totals checked against hand-computed values."""

import pytest

from rl.config.tasks import RendererEnvConfig, TaskConfig
from rollouts.types import Completion, RolloutStatus
from tasks.alphabet_sort import AlphabetSortTask, reply_names
from tasks.arithmetic_retry import RETRY, ArithmeticRetryTask
from tasks.build import build_task
from tasks.calculator_tool import CalculatorToolTask
from tasks.reverse_text import ReverseTextTask
from tasks.testing import play_group

pytestmark = pytest.mark.processes  # reward functions run in worker processes, tools in sandboxes

IM_END = 151645


async def play(renderer, tokenizer, task, row, replies, *, max_turns=4):
    """One rollout of `row` whose turns sample `replies` in order, scored by the task."""
    queue = list(replies)

    async def generate(requests):
        return [
            Completion(
                token_ids=[*tokenizer.encode(queue.pop(0), add_special_tokens=False), IM_END],
                logprobs=[],
                finish_reason="stop",
                policy_version=0,
            )
            for _ in requests
        ]

    task.rubric = task.build_rubric()
    env_config = RendererEnvConfig(max_turns=max_turns, max_total_tokens=2048, max_prompt_tokens=2000)
    group = await play_group(task, row, renderer, env_config, generate)
    return group.rollouts[0], group.rollouts[0].reward


@pytest.mark.parametrize("task_class", [ReverseTextTask, ArithmeticRetryTask, CalculatorToolTask, AlphabetSortTask])
def test_splits_are_seeded_sized_and_disjoint(task_class):
    task = task_class(num_train=50, num_validation=10, seed=3)
    train, validation = task.load_dataset("train"), task.load_dataset("validation")
    assert len(train) == 50 and len(validation) == 10
    assert not {repr(row) for row in train} & {repr(row) for row in validation}
    assert task_class(num_train=50, num_validation=10, seed=3).load_dataset("validation") == validation
    assert task_class(num_train=50, num_validation=10, seed=4).load_dataset("validation") != validation


@pytest.mark.parametrize(
    "reply, expected", [("elppa", 1.0), ("elppx", 0.8), ("  elppa\n", 1.0), ("apple", 0.4), ("", 0.0)]
)
async def test_reverse_text_partial_credit(renderer, tokenizer, reply, expected):
    # ratio = 2 * matched characters / (5 + 5): "elppx" keeps 4 ("elpp"), "apple" 2 (difflib matches "pp")
    rollout, reward = await play(
        renderer,
        tokenizer,
        ReverseTextTask(num_train=5, num_validation=1),
        {"text": "apple", "answer": "elppa"},
        [reply],
    )
    assert rollout.status is RolloutStatus.COMPLETED and len(rollout.turns) == 1
    assert reward == pytest.approx(expected)
    assert "Text: apple" in rollout.turns[0].prompt_messages[0]["content"]


async def test_arithmetic_retry_asks_again_until_right(renderer, tokenizer):
    row = {"question": "Ana has 40 coins and gets 2 more. How many coins does Ana have now?", "answer": "42"}
    task = ArithmeticRetryTask(num_train=5, num_validation=1, max_tries=3)
    rollout, reward = await play(renderer, tokenizer, task, row, ["It is 41.", "\\boxed{41}", "Sorry: \\boxed{42}"])
    assert rollout.status is RolloutStatus.COMPLETED and len(rollout.turns) == 3
    assert [turn.reward for turn in rollout.turns] == [0.0, 0.0, 1.0]
    assert rollout.turns[0].env_messages == [{"role": "user", "content": RETRY}]
    assert reward == 1.0 and rollout.reward_components == {"math_verify": 1.0}


async def test_arithmetic_retry_gives_up_after_max_tries_and_penalizes_retries(renderer, tokenizer):
    row = {"question": "q", "answer": "1/2"}
    task = ArithmeticRetryTask(num_train=5, num_validation=1, max_tries=2)
    rollout, reward = await play(renderer, tokenizer, task, row, ["\\boxed{1}", "\\boxed{2}"])
    assert (
        rollout.status is RolloutStatus.COMPLETED and [t.reward for t in rollout.turns] == [0.0, 0.0] and reward == 0.0
    )

    task = ArithmeticRetryTask(num_train=5, num_validation=1, max_tries=3, retry_penalty=1.0)
    rollout, reward = await play(renderer, tokenizer, task, row, ["\\boxed{0.4}", "\\boxed{0.5}"])
    # math_verify 1 (0.5 = 1/2), retry_penalty -(2-1)/(3-1) = -0.5; weights 1/2 each
    assert reward == pytest.approx(0.25) and rollout.reward_components == {"math_verify": 1.0, "retry_penalty": -0.5}


async def test_calculator_tool_round_trip_through_the_sandbox(renderer, tokenizer):
    row = {"expression": "1234 * 56 + 789", "answer": 69893}
    task = CalculatorToolTask(num_train=5, num_validation=1, tool_use_weight=1.0)
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1234 * 56 + 789"}}\n</tool_call>'
    rollout, reward = await play(renderer, tokenizer, task, row, [call, "69893"])
    assert rollout.status is RolloutStatus.COMPLETED and len(rollout.turns) == 2
    assert rollout.turns[0].env_messages == [{"role": "tool", "content": "69893", "name": "calculator"}]
    assert "<tool_response>\n69893\n</tool_response>" in tokenizer.decode(rollout.turns[1].prompt_token_ids)
    # the tool spec is in the system prompt
    assert '"name": "calculator"' in tokenizer.decode(rollout.turns[0].prompt_token_ids)
    assert reward == 1.0 and rollout.reward_components == {"numeric_match": 1.0, "used_calculator": 1.0}


async def test_calculator_rejects_code_and_the_model_is_told(renderer, tokenizer):
    row = {"expression": "2 * 3 + 1", "answer": 7}
    task = CalculatorToolTask(num_train=5, num_validation=1, tool_use_weight=1.0)
    call = (
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "__import__(\'os\').getcwd()"}}\n</tool_call>'
    )
    rollout, reward = await play(renderer, tokenizer, task, row, [call, "8"])
    [message] = rollout.turns[0].env_messages
    assert message["content"].startswith("Error: tool 'calculator' failed: ValueError: unsupported expression element")
    assert [e.kind for e in rollout.turns[0].tool_call_errors] == ["tool_failed"]
    assert reward == 0.0


async def test_alphabet_sort_scores_each_turn(renderer, tokenizer):
    row = {"batches": [["Zoe", "Adam"], ["Mia"]]}
    rollout, reward = await play(
        renderer,
        tokenizer,
        AlphabetSortTask(num_train=5, num_validation=1),
        row,
        ["Adam\nZoe", "1. Adam\n2. Zoe\n3. Mia"],
    )
    assert rollout.status is RolloutStatus.COMPLETED and len(rollout.turns) == 2
    assert "Mia" in rollout.turns[0].env_messages[0]["content"]
    # turn 2: [Adam, Zoe, Mia] vs [Adam, Mia, Zoe] -> 2 matched items of 3+3 -> 4/6
    assert [turn.reward for turn in rollout.turns] == pytest.approx([1.0, 2 / 3])
    assert reward == pytest.approx((1.0 + 2 / 3) / 2)
    assert reply_names("- Adam\n\n* Zoe") == ["Adam", "Zoe"]


async def test_alphabet_sort_missing_turns_count_zero(renderer, tokenizer):
    row = {"batches": [["Zoe", "Adam"], ["Mia"], ["Bea"]]}
    rollout, reward = await play(
        renderer, tokenizer, AlphabetSortTask(num_train=5, num_validation=1), row, ["Adam\nZoe"], max_turns=1
    )
    assert rollout.status is RolloutStatus.TRUNCATED and reward == pytest.approx(1 / 3)


@pytest.mark.parametrize("name", ["reverse_text", "arithmetic_retry", "calculator_tool", "alphabet_sort"])
def test_registered_by_name(name):
    built = build_task(TaskConfig(name=name, args={"num_train": 4, "num_validation": 2}))
    assert len(built.task.load_dataset("train")) == 4 and built.task.rubric is built.rubric


@pytest.mark.parametrize(
    "task_class, row, target",
    [
        (ReverseTextTask, {"text": "abc", "answer": "cba"}, "cba"),
        (ArithmeticRetryTask, {"question": "Ann has 2 pens and gets 3 more.", "answer": "5"}, "5"),
        (CalculatorToolTask, {"expression": "(2 + 3) * 4", "answer": 20}, "20"),
        (AlphabetSortTask, {"batches": [["Mia", "Al"], ["Bo"]]}, "Al, Mia\nAl, Bo, Mia"),
    ],
)
def test_every_shipped_task_logs_its_target(task_class, row, target):
    assert task_class(num_train=4, num_validation=2).target(row) == target
