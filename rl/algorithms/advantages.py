"""Group-relative advantages (GRPO and its Dr.GRPO variant)."""

import torch


def grpo_advantages(rewards: torch.Tensor, *, normalize_std: bool = False, eps: float = 1e-6) -> torch.Tensor:
    """Advantages of one group of completions of the same prompt: reward minus the group mean.

    With `normalize_std` the centred rewards are divided by (std + eps) as in the original GRPO; without it
    this is Dr.GRPO, which drops the std because it up-weights near-uniform groups. The std is the sample
    std (Bessel-corrected, `torch.std`'s default), as in TRL's GRPOTrainer and verl, so the numbers match
    theirs. A group of one or of equal rewards gets exact zeros.
    """
    # rewards: [G]
    if rewards.numel() == 0:
        raise ValueError("grpo_advantages got an empty group")
    # Shifting by the first reward first makes equal rewards exact zeros: a float32 mean of G copies of
    # 0.9 is not exactly 0.9, and dividing that rounding error by a ~0 std would blow it up.
    shifted = rewards.to(torch.float32) - rewards[0].to(torch.float32)  # [G]
    centered = shifted - shifted.mean()  # [G]
    if normalize_std and rewards.numel() > 1:
        centered = centered / (shifted.std() + eps)
    return centered  # [G]
