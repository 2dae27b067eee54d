"""The shared math of credit assignment: group baselines and whitening, plain functions over reward tensors."""

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


def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """Leave-one-out baseline: r_i - mean_{j != i} r_j = G/(G-1) · (r_i - mean). [G] -> [G]; needs G >= 2."""
    if rewards.numel() < 2:
        raise ValueError("rloo needs at least two rollouts in a group")
    count = rewards.numel()
    return grpo_advantages(rewards) * (count / (count - 1))


def max_rl_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """MaxRL (arXiv:2602.02710): (r - mean) / mean, the 1/pass-rate weighting of maximum likelihood.

    Defined for rewards in [0, 1] (a pass rate); anything else raises, since a mixed-sign group with a small
    positive mean would inflate its advantages without bound. A group whose mean is 0 (no success) gets zeros.
    """
    outside = rewards[(rewards < 0) | (rewards > 1) | ~torch.isfinite(rewards)]
    if outside.numel():
        raise ValueError(f"max_rl needs rewards in [0, 1] (a pass rate), got {outside.tolist()}")
    centered = grpo_advantages(rewards)  # [G]
    mean = rewards.to(torch.float32).mean()
    return centered / mean if mean > 0 else torch.zeros_like(centered)


def whiten_over_tokens(
    advantages: list[torch.Tensor], lengths: list[torch.Tensor], eps: float = 1e-8
) -> list[torch.Tensor]:
    """REINFORCE++ (baseline variant): group-centred advantages whitened over the step's tokens.

    Each rollout's advantage stands on each of its `lengths` trained tokens, as verl's
    `compute_reinforce_plus_plus_baseline_outcome_advantage` does with `masked_whiten`: the token mean is
    subtracted and the result multiplied by rsqrt(var + eps), var the Bessel-corrected variance over tokens.
    Fewer than two tokens: only re-centred.
    """
    values, counts = torch.cat(advantages).double(), torch.cat(lengths).double()  # [N], [N]
    tokens = counts.sum()
    mean = (values * counts).sum() / tokens
    centered = values - mean
    if tokens > 1:
        var = (centered * centered * counts).sum() / tokens * (tokens / (tokens - 1))
        centered = centered * torch.rsqrt(var + eps)
    return [part.float() for part in centered.split([a.numel() for a in advantages])]
