"""The loss of a micro-batch: three components over per-token weight streams, each normalized globally.

    loss = Σ_c agg_c(w_c · ℓ_c) / N_c        c ∈ {rl, ce, ref_kl}

`rl` is the policy loss chosen by `loss.type` (`POLICY_LOSSES`, or a user's by import path; plus the KL to a
reference model when `kl_coef > 0`),
`ce` is cross-entropy, `ref_kl` pulls the policy towards a teacher by reverse KL. Each component's
normalizer N_c counts its tokens (weight != 0) or sequences over the whole step (all micro-batches; all
ranks once there are several), so the sum of the micro-batch losses is the same however the batch is
split, and a weight w scales its token's gradient by w (a Σw normalizer would cancel a uniform weight). A component with no weight
in the step is skipped; when all are, the loss is a graph-attached zero so backward still runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from tensordict import TensorDict

from rl.components import import_object
from rl.config.loss import LossConfig
from rl.metrics.reduce import StepStats
from rl.packing.rows import segment_sum, segments


def ppo_clip_token_loss(
    logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_eps_low: float,
    clip_eps_high: float,
    dual_clip_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO clipped loss -min(r*A, clamp(r, 1-eps_low, 1+eps_high)*A), r = exp(logp - old_logp).

    Separate epsilons are DAPO's clip-higher. The min is written as an explicit choice of branch: a token is
    clipped when r > 1+eps_high with A > 0 or r < 1-eps_low with A < 0. Values equal the min formula; the
    gradient is exactly -r*A on unclipped tokens (edges included) and 0 on clipped ones, with no tie-splitting.
    With `dual_clip_c` (> 1), a token with A < 0 and r > c costs -c*A and has no gradient (dual-clip PPO).
    Returns (per-token loss [B,L], clipped [B,L] bool, dual-clipped tokens included).
    """
    # logprobs, sampling_logprobs, advantages: [B,L]
    ratio = torch.exp(logprobs - sampling_logprobs)  # [B,L]
    clipped = ((advantages > 0) & (ratio > 1 + clip_eps_high)) | ((advantages < 0) & (ratio < 1 - clip_eps_low))
    clipped_ratio = torch.clamp(ratio, 1 - clip_eps_low, 1 + clip_eps_high)  # [B,L], no gradient where clipped
    loss = -torch.where(clipped, clipped_ratio, ratio) * advantages  # [B,L]
    if dual_clip_c is not None:
        dual = (advantages < 0) & (ratio.detach() > dual_clip_c)
        loss = torch.where(dual, -dual_clip_c * advantages, loss)
        clipped = clipped | dual
    return loss, clipped


def weighted_pg_token_loss(logprobs: torch.Tensor, weights: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """-w*A per token with gradient -w*A*∇logp: a policy gradient with fixed (detached) importance weights."""
    return -weights.detach() * torch.exp(logprobs - logprobs.detach()) * advantages  # [B,L]


K3_BOUND = 10.0
"""k3 per token is clamped to [-K3_BOUND, K3_BOUND] (verl's `kl_penalty_forward`, SkyRL's `compute_approx_kl`)."""


def kl_estimate(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, *, estimator: str, log_ratio_clamp: float = 20.0
) -> torch.Tensor:
    """Per-token estimate of KL(p || ref) on tokens sampled from p; k1 = logp - ref_logp clamped to ±clamp.

    k1: k1 (unbiased, may be negative); k2: k1²/2; k3: exp(-k1) + k1 - 1 (unbiased, >= 0), clamped to
    ±K3_BOUND so that a few far-off tokens cannot dominate the term (a token 5 nats off would cost 142).
    Both clamps stop the gradient on the tokens they bind.
    """
    k1 = torch.clamp(logprobs - ref_logprobs, -log_ratio_clamp, log_ratio_clamp)  # [B,L]
    if estimator == "k1":
        return k1
    if estimator == "k2":
        return 0.5 * k1 * k1
    return torch.clamp(torch.exp(-k1) + k1 - 1, -K3_BOUND, K3_BOUND)


def kl_shaped_advantages(micro_batch: TensorDict, config: LossConfig) -> torch.Tensor:
    """The advantages [B,L] with -kl_coef·KL(sequence) folded in (`kl_in_reward`): each sequence's KL to the
    reference, estimated on its rl tokens from the sampler's logprobs, subtracted from every token of it."""
    mask = micro_batch["rl_weights"] != 0
    index, count = segments(micro_batch)
    kl = kl_estimate(
        micro_batch["sampling_logprobs"],
        micro_batch["kl_ref_logprobs"],
        estimator=config.kl_estimator,
        log_ratio_clamp=config.kl_log_ratio_clamp,
    )
    seq_kl = segment_sum(torch.where(mask, kl, 0.0), index, count)  # [S]
    return micro_batch["advantages"] - config.kl_coef * seq_kl[index]


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, *, log_ratio_clamp: float = 20.0) -> torch.Tensor:
    """Unclamped k3 = exp(-k1) + k1 - 1 (k1 clamped to ±log_ratio_clamp): the mismatch diagnostic, not a loss."""
    k1 = torch.clamp(logprobs - ref_logprobs, -log_ratio_clamp, log_ratio_clamp)  # [B,L]
    return torch.exp(-k1) + k1 - 1


def aggregate(
    per_token: torch.Tensor,
    weights: torch.Tensor,
    index: torch.Tensor,
    count: int,
    totals: torch.Tensor,
    *,
    mode: str,
    horizon: int,
) -> torch.Tensor:
    """This micro-batch's share of a component's loss; `totals` = (global weighted tokens, global sequences).

    N counts tokens with w != 0 (never Σw). token-mean: Σ w·ℓ / N_tokens. seq-mean-token-mean:
    Σ_seq (Σ_t w·ℓ / n_seq) / N_seqs, n_seq = the sequence's tokens with w != 0. seq-mean-token-sum:
    Σ_seq Σ_t w·ℓ / N_seqs. seq-mean-token-sum-norm: Σ_seq Σ_t w·ℓ / (N_seqs · horizon) (Dr.GRPO's constant
    normalizer; horizon = trainer.seq_len). A sequence never spans micro-batches, so all four are exact.
    """
    weighted = torch.where(weights != 0, weights * per_token, 0.0)  # [B,L]
    if mode == "token-mean":
        return weighted.sum() / totals[0].item()
    seq_sums = segment_sum(weighted, index, count)  # [S]
    if mode == "seq-mean-token-mean":
        seq_tokens = segment_sum((weights != 0).to(weighted.dtype), index, count)  # [S]
        return torch.where(seq_tokens > 0, seq_sums / seq_tokens.clamp_min(1), 0.0).sum() / totals[1].item()
    if mode == "seq-mean-token-sum":
        return seq_sums.sum() / totals[1].item()
    return seq_sums.sum() / (totals[1].item() * horizon)


def gspo_log_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor, index: torch.Tensor, count: int
) -> torch.Tensor:
    """GSPO's token-level log ratio: sg(log s_seq) + logp - sg(logp), s_seq = exp(mean_t (logp - old_logp)).

    Its value is the sequence ratio on every token of the sequence; its gradient is the token's ∇logp·s_seq.
    """
    log_ratio = torch.where(mask, logprobs.detach() - old_logprobs, 0.0)  # [B,L]
    seq_mean = segment_sum(log_ratio, index, count) / segment_sum(mask.float(), index, count).clamp_min(1)  # [S]
    return seq_mean[index] + logprobs - logprobs.detach()  # [B,L]


@dataclass(frozen=True)
class PolicyLossInputs:
    """What a policy loss sees of one micro-batch (all [B,L] on the rl tokens' rows; `mask` marks the rl tokens).

    `old_logprobs` is π_old (the sampler's in bypass mode), equal to `logprobs.detach()` off the mask, and
    `ratio` = exp(logprobs.detach() - old_logprobs). `index`/`count` map tokens to sequences (`segment_sum`)."""

    logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    ratio: torch.Tensor
    mask: torch.Tensor
    index: torch.Tensor
    count: int


PolicyLossFn = Callable[[PolicyLossInputs, LossConfig], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
"""(inputs, `[loss]`) -> (per-token loss [B,L] before the rl weights and aggregation, clipped [B,L] bool, ratio [B,L]
as logged). A user's loss is `loss.type = "package.module:function"` with this signature."""


def ppo_loss(inputs: PolicyLossInputs, config: LossConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO's clipped token ratio (DAPO's clip-higher, optional dual clip)."""
    loss, clipped = ppo_clip_token_loss(
        inputs.logprobs,
        inputs.old_logprobs,
        inputs.advantages,
        clip_eps_low=config.clip_eps_low,
        clip_eps_high=config.clip_eps_high,
        dual_clip_c=config.dual_clip_c,
    )
    return loss, clipped, inputs.ratio


def gspo_loss(inputs: PolicyLossInputs, config: LossConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GSPO: PPO's clip on the sequence ratio (the geometric mean of its token ratios), logged as the ratio."""
    log_s = gspo_log_ratio(inputs.logprobs, inputs.old_logprobs, inputs.mask, inputs.index, inputs.count)
    loss, clipped = ppo_clip_token_loss(
        log_s,
        torch.zeros_like(log_s),
        inputs.advantages,
        clip_eps_low=config.clip_eps_low,
        clip_eps_high=config.clip_eps_high,
    )
    return loss, clipped, torch.exp(log_s.detach())


def cispo_loss(inputs: PolicyLossInputs, config: LossConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CISPO: a policy gradient weighted by the clipped, detached ratio: no token loses its gradient."""
    truncated = torch.clamp(inputs.ratio, 1 - config.clip_eps_low, 1 + config.clip_eps_high)
    return (
        weighted_pg_token_loss(inputs.logprobs, truncated, inputs.advantages),
        truncated != inputs.ratio,
        inputs.ratio,
    )


def pg_loss(inputs: PolicyLossInputs, config: LossConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A plain policy gradient weighted by the (detached) ratio π_θ/π_old."""
    no_clip = torch.zeros_like(inputs.mask)
    return weighted_pg_token_loss(inputs.logprobs, inputs.ratio, inputs.advantages), no_clip, inputs.ratio


POLICY_LOSSES: dict[str, PolicyLossFn] = {"ppo": ppo_loss, "gspo": gspo_loss, "cispo": cispo_loss, "pg": pg_loss}
"""The registered policy losses by `loss.type`; any other `type` is an import path `package.module:function`."""


@functools.cache
def policy_loss_fn(name: str) -> PolicyLossFn:
    """The policy loss `loss.type` names: a registered one, or a user's function by import path."""
    if name not in POLICY_LOSSES and ":" not in name:
        raise ValueError(
            f"{name!r} is neither a registered loss {list(POLICY_LOSSES)} nor an import path 'package.module:function'"
        )
    fn = POLICY_LOSSES.get(name) or import_object(name)
    if not callable(fn):
        raise ValueError(f"{name!r} resolves to {fn!r}, which is not a function")
    return fn


def rl_token_loss(
    logprobs: torch.Tensor,
    batch: TensorDict,
    mask: torch.Tensor,
    index: torch.Tensor,
    count: int,
    config: LossConfig,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token `rl` loss [B,L] before weighting, the clipped flags and the ratio r = π_θ/π_old.

    The policy loss is `loss.type`'s (`POLICY_LOSSES` or an import path). `is_weights`, when present, multiply it
    (decoupled correction), or are the weights of the plain policy gradient (`use_policy_gradient`) instead.
    """
    old_logprobs = torch.where(mask, batch["old_logprobs"], logprobs.detach())  # [B,L]; ratio 1 off the mask
    advantages = batch["advantages"]
    ratio = torch.exp(logprobs.detach() - old_logprobs)  # [B,L]
    is_weights = batch.get("is_weights", None)
    if config.rollout_correction.use_policy_gradient:
        weights = is_weights if is_weights is not None else torch.ones_like(ratio)
        return weighted_pg_token_loss(logprobs, weights, advantages), torch.zeros_like(mask), ratio
    inputs = PolicyLossInputs(logprobs, old_logprobs, advantages, ratio, mask, index, count)
    loss, clipped, ratio = policy_loss_fn(config.type)(inputs, config)
    if is_weights is not None:
        loss = loss * is_weights.detach()
    return loss, clipped, ratio


def compute_loss(
    logprobs: torch.Tensor,
    batch: TensorDict,
    counts: torch.Tensor,
    config: LossConfig,
    stats: StepStats,
    *,
    horizon: int,
) -> torch.Tensor:
    """The loss of one micro-batch (its share of the step's loss); metrics go to `stats`.

    logprobs: [B,L] float32 under the current weights. `batch` holds the packed streams plus `old_logprobs`
    (PPO anchor), optionally `is_weights`, `kl_ref_logprobs` (reference model, when kl_coef > 0) and
    `snapshot_logprobs` (the step-start policy, when the no-grad pass ran; else the current one is).
    `counts` is `component_counts` of the whole step.
    """
    index, count = segments(batch)
    loss = (logprobs * 0.0).sum()  # graph-attached zero: backward runs even when every component is empty
    agg = dict(mode=config.aggregation, horizon=horizon)  # the policy loss's (and its KL term's) aggregation
    token_count = dict(mode="token-mean", horizon=horizon)  # ce and ref_kl: fixed token-count cores (prime-rl's)

    rl_weights = batch["rl_weights"]
    if counts[0, 0] > 0 and bool((rl_weights != 0).any()):
        mask = rl_weights != 0
        per_token, clipped, ratio = rl_token_loss(logprobs, batch, mask, index, count, config)
        pg = aggregate(per_token, rl_weights, index, count, counts[0], **agg)
        loss = loss + pg
        stats.add_total("pg_loss", pg)
        advantages = batch["advantages"]
        stats.add("clip_frac_low", (clipped & (advantages < 0))[mask].float())
        stats.add("clip_frac_high", (clipped & (advantages > 0))[mask].float())
        if config.dual_clip_c is not None:
            stats.add("dual_clip_frac", ((advantages < 0) & (ratio > config.dual_clip_c))[mask].float())
        stats.add("ratio", ratio[mask])
        # KL(π_snapshot‖π_θ) by k3, d = logπ_θ - logπ_snapshot: 0 in the first minibatch, > 0 once the inner loop drifts
        drift = logprobs.detach() - batch.get("snapshot_logprobs", logprobs.detach())  # [B,L]
        stats.add("ppo_kl", (torch.exp(drift) - drift - 1)[mask])
        sampling = torch.where(mask, batch["sampling_logprobs"], logprobs.detach())
        stats.add("mismatch_k3", k3_kl(sampling, logprobs.detach())[mask])
        if config.kl_coef > 0:
            kl = kl_estimate(
                logprobs,
                torch.where(mask, batch["kl_ref_logprobs"], logprobs.detach()),
                estimator=config.kl_estimator,
                log_ratio_clamp=config.kl_log_ratio_clamp,
            )
            stats.add("kl", kl.detach()[mask])
            if not config.kl_in_reward:
                loss = loss + config.kl_coef * aggregate(kl, rl_weights, index, count, counts[0], **agg)

    ce_weights = batch["ce_weights"]
    if counts[1, 0] > 0 and bool((ce_weights != 0).any()):
        ce = aggregate(-logprobs, ce_weights, index, count, counts[1], **token_count)
        loss = loss + ce
        stats.add_total("ce_loss", ce)

    ref_weights = batch["ref_kl_weights"]
    if counts[2, 0] > 0 and bool((ref_weights != 0).any()):
        mask = ref_weights != 0
        teacher = torch.where(mask, batch["ref_logprobs"], logprobs.detach())
        # Reverse KL as a policy-gradient signal: reward -(logp - teacher_logp) on each sampled token.
        log_ratio = torch.clamp(logprobs.detach() - teacher, -config.kl_log_ratio_clamp, config.kl_log_ratio_clamp)
        per_token = torch.exp(logprobs - logprobs.detach()) * log_ratio  # value k1, gradient k1·∇logp
        ref_kl = aggregate(per_token, ref_weights, index, count, counts[2], **token_count)
        loss = loss + ref_kl
        stats.add_total("ref_kl_loss", ref_kl)
        stats.add("ref_kl/kl", log_ratio[mask])
    return loss
