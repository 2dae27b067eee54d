"""pass@k against values worked out by hand and against counting k-subsets directly."""

import itertools
from fractions import Fraction

import pytest

from rl.metrics.pass_at_k import eval_metrics, pass_at_k, pass_metrics
from rollouts.types import Rollout, RolloutGroup


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
    }
