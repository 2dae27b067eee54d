"""Group-relative advantages (GRPO and its Dr.GRPO variant)."""

import torch


def grpo_advantages(rewards: torch.Tensor, *, normalize_std: bool = False, eps: float = 1e-6) -> torch.Tensor:
    """Advantages of one group of completions of the same prompt: reward minus the group mean.

    With `normalize_std` the centred rewards are divided by (std + eps) as in the original GRPO; without it
    this is Dr.GRPO, which drops the std because it up-weights near-uniform groups. The std is the population
    std (unbiased=False) so a group of one is defined; a group with equal rewards gives exact zeros either way.
    """
    # rewards: [G]
    if rewards.numel() == 0:
        raise ValueError("grpo_advantages got an empty group")
    # Shifting by the first reward first makes equal rewards exact zeros: a float32 mean of G copies of
    # 0.9 is not exactly 0.9, and dividing that rounding error by a ~0 std would blow it up.
    shifted = rewards.to(torch.float32) - rewards[0].to(torch.float32)  # [G]
    centered = shifted - shifted.mean()  # [G]
    if normalize_std:
        centered = centered / (shifted.std(correction=0) + eps)
    return centered  # [G]


def group_advantages(
    groups: list[list[float]], *, normalize_std: bool = False, eps: float = 1e-6
) -> list[list[float]]:
    """`grpo_advantages` for each group of plain Python rewards, as rollout code holds them."""
    return [
        grpo_advantages(torch.tensor(group, dtype=torch.float32), normalize_std=normalize_std, eps=eps).tolist()
        for group in groups
    ]
