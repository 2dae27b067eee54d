import pytest
import torch

from rl.algorithms.advantages import grpo_advantages


def test_grpo_advantages_subtract_group_mean() -> None:
    # mean of [1, 0, 0, 1] is 0.5
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]))
    assert adv.tolist() == [0.5, -0.5, -0.5, 0.5]


def test_grpo_advantages_std_normalization_uses_sample_std() -> None:
    # [3, 1, 2, 2]: mean 2, centred [1, -1, 0, 0]; sample variance (1 + 1) / 3, std = sqrt(2/3) = 0.81649658,
    # so +-1 / 0.81649658 = +-1.22474487 (the population std 1/sqrt(2) would give +-1.41421356).
    adv = grpo_advantages(torch.tensor([3.0, 1.0, 2.0, 2.0]), normalize_std=True, eps=0.0)
    torch.testing.assert_close(adv, torch.tensor([1.22474487, -1.22474487, 0.0, 0.0]), atol=1e-6, rtol=0)


def test_grpo_advantages_std_normalization_keeps_eps() -> None:
    # [1, 0, 0, 1]: centred +-0.5, sample std sqrt(1/3) = 0.57735027, so +-0.5 / (0.57735027 + 1e-6) = +-0.86602390
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), normalize_std=True)
    torch.testing.assert_close(adv, torch.tensor([0.8660239, -0.8660239, -0.8660239, 0.8660239]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("normalize_std", [False, True])
@pytest.mark.parametrize("rewards", [[0.0] * 4, [0.9] * 8, [0.1] * 7, [2.5]])
def test_equal_rewards_give_exact_zeros(rewards: list[float], normalize_std: bool) -> None:
    # A float32 mean of eight 0.9 is not exactly 0.9; a naive r - mean(r) leaves ~6e-8, which / (std + eps)
    # turns into ~0.06. The advantage of a group with no signal must be exactly zero.
    adv = grpo_advantages(torch.tensor(rewards), normalize_std=normalize_std)
    assert adv.tolist() == [0.0] * len(rewards)


def test_empty_group_raises() -> None:
    with pytest.raises(ValueError, match="empty group"):
        grpo_advantages(torch.tensor([]))
