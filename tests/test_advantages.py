import pytest
import torch

from rl.algorithms.advantages import grpo_advantages, group_advantages


def test_grpo_advantages_subtract_group_mean() -> None:
    # mean of [1, 0, 0, 1] is 0.5
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]))
    assert adv.tolist() == [0.5, -0.5, -0.5, 0.5]


def test_grpo_advantages_std_normalization_uses_population_std() -> None:
    # [3, 1, 2, 2]: mean 2, centred [1, -1, 0, 0]; population variance (1 + 1) / 4 = 0.5, std = 1/sqrt(2),
    # so +-1 / (1/sqrt(2)) = +-sqrt(2) = +-1.41421356 (the sample std sqrt(2/3) would give +-1.22474487).
    adv = grpo_advantages(torch.tensor([3.0, 1.0, 2.0, 2.0]), normalize_std=True, eps=0.0)
    torch.testing.assert_close(adv, torch.tensor([1.41421356, -1.41421356, 0.0, 0.0]), atol=1e-6, rtol=0)


def test_grpo_advantages_std_normalization_keeps_eps() -> None:
    # [1, 0, 0, 1]: centred +-0.5, std 0.5, so +-0.5 / (0.5 + 1e-6) = +-0.999998
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), normalize_std=True)
    torch.testing.assert_close(adv, torch.tensor([0.999998, -0.999998, -0.999998, 0.999998]), atol=1e-7, rtol=0)


@pytest.mark.parametrize("normalize_std", [False, True])
@pytest.mark.parametrize("rewards", [[0.0] * 4, [0.9] * 8, [0.1] * 7, [2.5]])
def test_equal_rewards_give_exact_zeros(rewards: list[float], normalize_std: bool) -> None:
    # A float32 mean of eight 0.9 is not exactly 0.9; a naive r - mean(r) leaves ~6e-8, which / (std + eps)
    # turns into ~0.06. The advantage of a group with no signal must be exactly zero.
    adv = grpo_advantages(torch.tensor(rewards), normalize_std=normalize_std)
    assert adv.tolist() == [0.0] * len(rewards)


def test_group_advantages_on_python_lists() -> None:
    # group 1: mean 1 -> [1, -1]; group 2: all equal -> zeros; group 3: mean 0.25 -> [0.75, -0.25, -0.25, -0.25]
    assert group_advantages([[2.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]]) == [
        [1.0, -1.0],
        [0.0, 0.0, 0.0],
        [0.75, -0.25, -0.25, -0.25],
    ]


def test_empty_group_raises() -> None:
    with pytest.raises(ValueError, match="empty group"):
        grpo_advantages(torch.tensor([]))
