"""pass@k against values worked out by hand and against counting k-subsets directly."""

import asyncio
import itertools
from fractions import Fraction

import pytest

from rl.commands.cli import main
from rl.config.run import RunConfig
from rl.config.tasks import RubricConfig
from rl.metrics.backends import ConsoleBackend
from rl.metrics.pass_at_k import (
    eval_failure_line,
    eval_metrics,
    pass_at_k,
    pass_metrics,
    unreachable_threshold_warnings,
)
from rollouts.types import Rollout, RolloutGroup, RolloutStatus, RolloutTurn
from rubrics.rubric import RewardFn, Rubric, apply_reward
from tasks.build import build_rubric
from tests.support.paths import CONFIGS


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 2 / 5),  # pass@1 is the pass rate
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
        (4, 1, 2, 1 - 3 / 6),  # 1 - C(3,2)/C(4,2)
        (4, 1, 4, 1.0),  # k = n with one pass: every draw holds it
        (10, 3, 4, 1 - 35 / 210),  # 1 - C(7,4)/C(10,4)
        (4, 4, 1, 1.0),  # all pass
        (4, 4, 4, 1.0),
        (4, 0, 1, 0.0),  # none pass
        (4, 0, 4, 0.0),
    ],
)
def test_pass_at_k_by_hand(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-15)


@pytest.mark.parametrize(
    ("n", "c", "k"), [(n, c, k) for n in range(1, 8) for c in range(n + 1) for k in range(1, n + 1)]
)
def test_pass_at_k_is_the_share_of_k_subsets_that_hold_a_pass(n, c, k):
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    share = Fraction(sum(any(samples[i] for i in subset) for subset in subsets), len(subsets))
    assert pass_at_k(n, c, k) == float(share)


def test_fewer_samples_than_k_or_impossible_counts_are_refused():
    with pytest.raises(ValueError, match="cannot be estimated from 3 samples"):
        pass_at_k(3, 1, 4)
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)


def group(index: int, task: str, rewards: list[float | None]) -> RolloutGroup:
    rollouts = [
        Rollout(rollout_id=f"{index}/{i}", group_id=str(index), task_name=task, sample_index=i, reward=reward)
        for i, reward in enumerate(rewards)
    ]
    return RolloutGroup(group_id=str(index), task_name=task, example={}, rollouts=rollouts)


def test_pass_metrics_per_task_and_overall_leave_out_rows_with_fewer_than_k_scored_samples():
    groups = [
        group(0, "a", [0.0, 1.0, 0.0, 0.2]),  # n=4, c=1: pass@1 1/4, pass@4 1
        group(1, "a", [1.0, 1.0, 1.5, 1.0]),  # all pass: 1, 1
        group(2, "b", [0.0, 0.0, 0.9, 0.0]),  # none pass: 0, 0
        group(3, "b", [1.0, None, 0.0, 0.0]),  # one unscored: n=3, c=1: pass@1 1/3, too few for pass@4
    ]
    metrics = pass_metrics(groups, k=4, threshold=1.0)
    assert metrics == pytest.approx(
        {
            "eval/pass@1": (1 / 4 + 1 + 0 + 1 / 3) / 4,
            "eval/pass@1/a": (1 / 4 + 1) / 2,
            "eval/pass@1/b": (0 + 1 / 3) / 2,
            "eval/pass@4": (1 + 1 + 0) / 3,
            "eval/pass@4/a": 1.0,
            "eval/pass@4/b": 0.0,
            "eval/pass@4/rows_left_out": 1,
        },
        abs=1e-12,
    )


def test_a_sample_passes_when_its_reward_reaches_the_threshold():
    metrics = pass_metrics([group(0, "a", [0.5, 0.49])], k=2, threshold=0.5)
    assert metrics["eval/pass@1"] == 0.5 and metrics["eval/pass@2"] == 1.0


def test_one_greedy_sample_per_row_gives_the_pass_rate_alone():
    assert pass_metrics([group(0, "a", [1.0]), group(1, "a", [0.0])], k=1, threshold=1.0) == {
        "eval/pass@1": 0.5,
        "eval/pass@1/a": 0.5,
    }


def test_a_validations_metrics_are_the_mean_reward_over_every_sample_and_pass_at_k():
    metrics = eval_metrics([group(0, "a", [1.0, 0.0]), group(1, "b", [0.5, 0.5])], k=2, threshold=1.0)
    assert metrics == {
        "eval/reward/mean": 0.5,
        "eval/reward/a/mean": 0.5,
        "eval/reward/b/mean": 0.5,
        "eval/pass@1": 0.25,
        "eval/pass@1/a": 0.5,
        "eval/pass@1/b": 0.0,
        "eval/pass@2": 0.5,
        "eval/pass@2/a": 1.0,
        "eval/pass@2/b": 0.0,
        "eval/pass@2/rows_left_out": 0,
        "eval/failed": 0,
    }


def scored_row(index: int, outcomes: list[str]) -> RolloutGroup:
    """A held-out row's samples scored by a real rubric (default `error_reward` 0.0) whose one reward function gives
    1.0 to every answer and raises on `'raise'`; `'generator'` marks a sample whose generator call failed."""

    async def right(rollout, example):
        if rollout.metadata.get("outcome") == "raise":
            raise ValueError("the reward service's database is down")
        return 1.0

    rollouts = []
    for i, outcome in enumerate(outcomes):
        turn = RolloutTurn(
            prompt_messages=[],
            prompt_token_ids=[1],
            completion_token_ids=[2],
            completion_logprobs=[-0.1],
            policy_version=0,
        )
        rollout = Rollout(
            rollout_id=f"eval/step=0/{index}/{i}", group_id=f"eval/step=0/{index}", task_name="t", sample_index=i,
            turns=[turn], metadata={"outcome": outcome},
        )  # fmt: skip
        if outcome == "generator":
            rollout.fail(RolloutStatus.ERROR, "generator call failed: replica 0 is gone")
        else:
            rollout.status = RolloutStatus.COMPLETED
        rollouts.append(rollout)
    rubric = Rubric([RewardFn(right)])
    for rollout, scored in zip(rollouts, asyncio.run(rubric.score_group(rollouts, {})), strict=True):
        apply_reward(rollout, scored)
    return RolloutGroup(group_id=f"eval/step=0/{index}", task_name="t", example={}, rollouts=rollouts)


def test_failed_held_out_samples_are_left_out_of_pass_at_k_and_the_mean_reward_and_counted():
    row = scored_row(0, ["ok", "ok", "ok", "generator"])
    assert [r.reward for r in row.rollouts] == [1.0, 1.0, 1.0, 0.0]  # the rubric's error_reward on the failure
    metrics = eval_metrics([row], k=4, threshold=1.0)
    # three right answers over n = 3: pass@1 1.0, not 3/4; too few scored samples for pass@4
    assert metrics == {
        "eval/reward/mean": 1.0,
        "eval/reward/t/mean": 1.0,
        "eval/reward/right": 1.0,
        "eval/reward/t/right": 1.0,
        "eval/pass@1": 1.0,
        "eval/pass@1/t": 1.0,
        "eval/pass@4/rows_left_out": 1,
        "eval/failed": 1,
    }


def test_a_reward_function_that_raised_on_a_held_out_sample_is_a_failure_not_a_wrong_answer():
    rows = [scored_row(0, ["ok", "raise"]), scored_row(1, ["ok", "ok"])]
    assert rows[0].rollouts[1].status is RolloutStatus.ERROR
    metrics = eval_metrics(rows, k=2, threshold=1.0)
    assert metrics["eval/pass@1"] == 1.0 and metrics["eval/reward/mean"] == 1.0 and metrics["eval/failed"] == 1
    assert metrics["eval/pass@2"] == 1.0 and metrics["eval/pass@2/rows_left_out"] == 1
    line = eval_failure_line(5, rows)
    assert line.startswith("validation at step 5: 1 of 4 held-out samples failed and were left out")
    assert "the reward service's database is down" in line
    assert eval_failure_line(5, [rows[1]]) is None


def test_every_held_out_sample_failed_gives_no_reward_or_pass_numbers_but_the_count():
    assert eval_metrics([scored_row(0, ["generator", "generator"])], k=1, threshold=1.0) == {"eval/failed": 2}


def test_the_console_line_shows_failed_held_out_samples_only_when_there_are_some(capsys):
    console = ConsoleBackend()
    console.log({"eval/reward/mean": 1.0, "eval/failed": 2}, step=3)
    console.log({"eval/reward/mean": 1.0, "eval/failed": 0}, step=4)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("eval/reward/mean=1 eval/failed=2") and "failed" not in lines[1]


SHAPED = RubricConfig(
    reward_fns=[
        {"fn": "math_verify", "weight": 1.0},
        {"fn": "length_penalty", "weight": 0.2, "args": {"target_tokens": 8, "max_tokens": 32}},
    ]
)


def test_a_threshold_the_rubric_can_never_reach_is_warned_about():
    rubrics = {"math": build_rubric(SHAPED), "plain": build_rubric(RubricConfig(reward_fns=[{"fn": "exact_match"}]))}
    assert rubrics["math"].best_total() == pytest.approx(1 / 1.2)  # a right, short reply: (1 * 1 + 0.2 * 0) / 1.2
    [warning] = unreachable_threshold_warnings(rubrics, RunConfig(eval_every=5))
    assert warning.startswith("task 'math': its rubric gives at most 0.8333 (a weighted mean: math_verify weight 0.833")
    assert "below run.eval_pass_threshold = 1: no held-out sample can pass" in warning
    assert unreachable_threshold_warnings(rubrics, RunConfig(eval_every=5, eval_pass_threshold=0.8)) == []
    assert unreachable_threshold_warnings(rubrics, RunConfig(eval_every=0)) == []  # no validation: nothing to pass
    unknown = Rubric([RewardFn(lambda rollout, example: 2.0, weight=1.0, name="custom")])
    assert unreachable_threshold_warnings({"t": unknown}, RunConfig(eval_every=5)) == []  # its best is not declared


def test_validate_warns_about_the_main_jobs_task_with_a_shaping_term(capsys):
    main_job = str(CONFIGS / "sum_digits_smollm2_cpu.toml")
    assert main(["validate", "--config", main_job]) == 0
    assert "eval_pass_threshold" not in capsys.readouterr().err  # right answers in the right format reach 1
    shaped = "[{fn = 'digit_sum_correct'}, {fn = 'length_penalty', weight = 0.25, args = {target_tokens = 8, max_tokens = 32}}]"
    assert main(["validate", "--config", main_job, "--tasks.0.rubric.reward_fns", shaped]) == 0
    err = capsys.readouterr().err  # (1 * 1 + 0.25 * 0) / 1.25
    assert "task 'sum_digits': its rubric gives at most 0.8 (a weighted mean" in err
    assert "below run.eval_pass_threshold = 1: no held-out sample can pass" in err
