"""Token-level policy-gradient losses: PPO clip with DAPO clip-higher, k3 KL, and the GRPO step loss."""

import torch
from tensordict import TensorDict


def ppo_clip_token_loss(
    logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_eps_low: float,
    clip_eps_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO clipped loss -min(r*A, clamp(r, 1-eps_low, 1+eps_high)*A), r = exp(logp - sampling_logp).

    Separate epsilons are DAPO's clip-higher. The min is written as an explicit choice of branch: a token is
    clipped when r > 1+eps_high with A > 0 or r < 1-eps_low with A < 0. Values equal the min formula; the
    gradient is exactly -r*A on unclipped tokens (edges included) and 0 on clipped ones, with no tie-splitting.
    Returns (per-token loss [B,L], clipped [B,L] bool).
    """
    # logprobs, sampling_logprobs, advantages: [B,L]
    ratio = torch.exp(logprobs - sampling_logprobs)  # [B,L]
    clipped = ((advantages > 0) & (ratio > 1 + clip_eps_high)) | ((advantages < 0) & (ratio < 1 - clip_eps_low))
    clipped_ratio = torch.clamp(ratio, 1 - clip_eps_low, 1 + clip_eps_high)  # [B,L], no gradient where clipped
    loss = -torch.where(clipped, clipped_ratio, ratio) * advantages  # [B,L]
    return loss, clipped


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, *, log_ratio_clamp: float = 20.0) -> torch.Tensor:
    """Per-token k3 estimator exp(-k1) + k1 - 1 with k1 = logprobs - ref_logprobs clamped to +-log_ratio_clamp.

    Unbiased for KL(p || ref) on tokens sampled from p, always >= 0; the clamp keeps exp finite.
    """
    k1 = torch.clamp(logprobs - ref_logprobs, -log_ratio_clamp, log_ratio_clamp)  # [B,L]
    return torch.exp(-k1) + k1 - 1  # [B,L]


def grpo_loss(
    logprobs: torch.Tensor,
    batch: TensorDict,
    *,
    clip_eps_low: float,
    clip_eps_high: float,
    num_loss_tokens: int | float,
    kl_coef: float = 0.0,
    ref_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss of one micro-batch: sum of per-token losses over trained tokens / `num_loss_tokens`.

    `num_loss_tokens` is the number of trained tokens in the whole optimizer step (all micro-batches and
    ranks), so summing (or backpropagating) the micro-batch losses gives the token mean of the whole step,
    whatever the split. `batch` holds `loss_mask` [B,L] bool, `sampling_logprobs` [B,L] and `advantages` [B,L].
    Metrics are divided by the same global count, so each is summed over micro-batches and ranks to get the
    step's token mean: pg_loss, clip_frac_low, clip_frac_high, ratio_mean, kl (if kl_coef > 0) and
    mismatch_k3, the k3 estimate of KL(sampler || trainer) on the sampled tokens.
    """
    if num_loss_tokens <= 0:
        raise ValueError(f"num_loss_tokens must be positive, got {num_loss_tokens}")
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs")
    mask = batch["loss_mask"]  # [B,L] bool
    # Untrained tokens (prompt, padding) get sampling logprob = logprob, hence ratio 1: exp never overflows
    # there, and no inf/NaN can leak into the gradient through the masked-out branch.
    sampling_logprobs = torch.where(mask, batch["sampling_logprobs"], logprobs.detach())  # [B,L]
    advantages = batch["advantages"]  # [B,L]

    pg_loss, clipped = ppo_clip_token_loss(
        logprobs, sampling_logprobs, advantages, clip_eps_low=clip_eps_low, clip_eps_high=clip_eps_high
    )
    per_token = pg_loss  # [B,L]
    kl = None
    if kl_coef > 0:
        kl = k3_kl(logprobs, torch.where(mask, ref_logprobs, logprobs.detach()))  # [B,L]
        per_token = per_token + kl_coef * kl
    loss = torch.where(mask, per_token, 0.0).sum() / num_loss_tokens

    def share(values: torch.Tensor) -> float:
        return (torch.where(mask, values.detach().float(), 0.0).sum() / num_loss_tokens).item()

    metrics = {
        "pg_loss": share(pg_loss),
        "clip_frac_low": share(clipped & (advantages < 0)),
        "clip_frac_high": share(clipped & (advantages > 0)),
        "ratio_mean": share(torch.exp(logprobs - sampling_logprobs)),
        "mismatch_k3": share(k3_kl(sampling_logprobs, logprobs.detach())),
    }
    if kl is not None:
        metrics["kl"] = share(kl)
    return loss, metrics
