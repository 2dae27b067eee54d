"""Built-in reward functions on hand-written replies, and their use by name from config."""

import pytest

from rl.config.tasks import RubricConfig
from rollouts.types import Rollout, RolloutStatus, RolloutTurn
from rubrics.builtins import (
    answer_tag_format,
    boxed_format,
    diversity_bonus,
    env_reward,
    exact_match,
    last_boxed,
    length_penalty,
    math_verify,
    numeric_match,
)
from tasks.build import build_rubric


def reply(text: str, *, tokens: int = 1, turn_rewards=(None,), index: int = 0) -> Rollout:
    turns = [
        RolloutTurn(
            prompt_messages=[],
            prompt_token_ids=[1],
            completion_token_ids=[2] * tokens,
            reward=reward,
            assistant_message={"role": "assistant", "content": text},
        )
        for reward in turn_rewards
    ]
    return Rollout(
        rollout_id=f"g/{index}",
        group_id="g",
        task_name="t",
        sample_index=index,
        turns=turns,
        status=RolloutStatus.COMPLETED,
    )


@pytest.mark.parametrize(
    "text, extract, expected",
    [
        ("Paris", "text", 1.0),
        ("  paris \n", "text", 1.0),
        ("It is Paris", "text", 0.0),
        ("I think <answer>Paris</answer>", "answer_tag", 1.0),
        ("<answer>Lyon</answer> no, <answer>Paris</answer>", "answer_tag", 1.0),
        ("Paris", "answer_tag", 0.0),
        ("so \\boxed{Paris}", "boxed", 1.0),
        ("thinking...\nParis", "last_line", 1.0),
    ],
)
def test_exact_match(text, extract, expected):
    assert exact_match(reply(text), {"answer": "Paris"}, extract=extract) == expected


def test_exact_match_case_sensitive():
    assert exact_match(reply("paris"), {"answer": "Paris"}, case_sensitive=True) == 0.0


@pytest.mark.parametrize(
    "text, tolerance, relative, expected",
    [
        ("The answer is 3.14", 0.01, False, 1.0),
        ("3.16", 0.01, False, 0.0),
        ("about 1,000,050", 0.0001, True, 1.0),
        ("1000200", 0.0001, True, 0.0),
        ("no number", 1.0, False, 0.0),
        ("first 7 then 42", 0.0, False, 1.0),
    ],
)
def test_numeric_match(text, tolerance, relative, expected):
    reference = 42 if "42" in text else (1_000_000 if "00" in text else 3.1416)
    assert numeric_match(reply(text), {"answer": reference}, tolerance=tolerance, relative=relative) == expected


@pytest.mark.parametrize(
    "text, answer, expected",
    [
        ("So the result is \\boxed{\\frac{1}{2}}.", "0.5", 1.0),
        ("\\boxed{0.5}", "1/2", 1.0),
        ("The answer is \\boxed{3}", "4", 0.0),
        ("x = \\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1.0),
        ("I don't know", "7", 0.0),
        ("Total: $12$", "12", 1.0),
    ],
)
def test_math_verify(text, answer, expected):
    assert math_verify(reply(text), {"answer": answer}) == expected


GSM8K_ANSWER = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)
"""openai/gsm8k's first training row's `answer`: the worked solution, the final number after `####`."""


@pytest.mark.parametrize(
    "text, expected, expected_without_fallback",
    [
        ("\\boxed{72}", 1.0, 1.0),
        ("She sold 72 clips in all.", 1.0, 1.0),
        # math-verify reads the units as symbols (72*c*l*i*p*s != 72): the boxed number 72 is the answer
        ("So \\boxed{72 clips}.", 1.0, 0.0),
        ("\\boxed{\\text{72 clips}}", 1.0, 0.0),
        ("\\boxed{72.}", 1.0, 0.0),  # math-verify keeps "72." as a string only
        ("\\boxed{1,000}", 0.0, 0.0),  # 1000 != 72
        ("\\boxed{73 clips}, not 72", 0.0, 0.0),  # the boxed number is the answer, not the last one
        ("\\boxed{3/72 clips}", 0.0, 0.0),  # two numbers: no fallback (3/72 != 72)
        ("seventy-two", 0.0, 0.0),  # no number to fall back on
    ],
)
def test_math_verify_numeric_fallback_on_gsm8k(text, expected, expected_without_fallback):
    example = {"answer": GSM8K_ANSWER}
    assert math_verify(reply(text), example) == expected
    assert math_verify(reply(text), example, numeric_fallback=False) == expected_without_fallback


def test_numeric_fallback_reads_thousands_separators_and_the_reference_last_number():
    # reply "\boxed{1,000 dollars}": math-verify reads dollars as symbols; the fallback reads 1000 = "#### 1,000"
    assert math_verify(reply("\\boxed{1,000 dollars}"), {"answer": "It costs 10*100 = 1000.\n#### 1,000"}) == 1.0
    assert math_verify(reply("\\boxed{1,000 dollars}"), {"answer": "#### 1,001"}) == 0.0
    assert math_verify(reply("\\boxed{2 halves}"), {"answer": "1/2"}) == 0.0  # a fraction is no single number


def test_format_checks():
    assert answer_tag_format(reply("<answer>4</answer>"), {}) == 1.0
    assert answer_tag_format(reply("<answer> </answer>"), {}) == 0.0
    assert answer_tag_format(reply("<answer>4</answer><answer>5</answer>"), {}) == 0.0
    assert boxed_format(reply("\\boxed{x^{2}}"), {}) == 1.0
    assert boxed_format(reply("\\boxed{x^{2}"), {}) == 0.0
    assert last_boxed("\\boxed{1} and \\boxed{\\frac{a}{b}}") == "\\frac{a}{b}"


@pytest.mark.parametrize("tokens, expected", [(10, 0.0), (20, 0.0), (30, -0.5), (40, -1.0), (90, -1.0)])
def test_length_penalty(tokens, expected):
    assert length_penalty(reply("x", tokens=tokens), {}, target_tokens=20, max_tokens=40) == expected


def test_env_reward_sums_turn_rewards():
    assert env_reward(reply("x", turn_rewards=(0.0, None, 1.0, 0.5)), {}) == 1.5


def test_diversity_bonus():
    group = [reply(text, index=i) for i, text in enumerate(["a", "a", "b", "c"])]
    assert diversity_bonus(group, {}) == pytest.approx([2 / 3, 2 / 3, 1.0, 1.0])


async def test_builtins_by_name_with_args_and_a_group_function_from_config():
    config = RubricConfig.model_validate(
        {
            "reward_fns": [
                {"fn": "numeric_match", "args": {"tolerance": 0.5}, "weight": 1.0},
                {"fn": "length_penalty", "args": {"target_tokens": 2, "max_tokens": 4}, "weight": 1.0},
            ],
            "group_reward_fns": [{"fn": "diversity_bonus", "weight": 2.0}],
        }
    )
    rubric = build_rubric(config)
    assert rubric.weights == {"numeric_match": 0.25, "length_penalty": 0.25, "diversity_bonus": 0.5}
    rewards = await rubric.score_group(
        [reply("7.4", tokens=3, index=0), reply("7.4", tokens=1, index=1), reply("9", index=2)], {"answer": 7}
    )
    # numeric 1,1,0; length -0.5,0,0; diversity 1/2,1/2,1
    assert [r.total for r in rewards] == pytest.approx([0.25 - 0.125 + 0.25, 0.25 + 0.25, 0.5])


def test_bad_builtin_args_fail_at_build_time():
    config = RubricConfig.model_validate({"reward_fns": [{"fn": "numeric_match", "args": {"tolerence": 0.5}}]})
    with pytest.raises(ValueError, match="bad args"):
        build_rubric(config)
    with pytest.raises(ValueError, match="at least one"):
        RubricConfig.model_validate({"reward_fns": []})


def test_error_reward_none_from_toml_and_round_trip():
    from rl.config import dump_toml, load_config

    config = load_config(
        None,
        {
            "tasks": "[{name = 'sum_digits', rubric = {reward_fns = [{fn = 'exact_match'}]}}]",
            "tasks.0.rubric.error_reward": "none",
        },
    )
    assert config.tasks[0].rubric.error_reward is None and build_rubric(config.tasks[0].rubric).error_reward is None
    assert 'error_reward = "none"' in dump_toml(config)
    import tomllib

    from rl.config import Config

    assert Config.model_validate(tomllib.loads(dump_toml(config))).tasks[0].rubric.error_reward is None
