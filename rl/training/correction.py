"""Rollout correction (after verl's guide): IS weights, rejection, veto, and the off-policy diagnostics.

The sampler (π_rollout, e.g. bf16 vLLM or a stale policy) and the trainer (π_train: π_old from the no-grad
pass in decoupled mode, π_θ at the start of the step in bypass mode) disagree. Two separate mechanisms
correct for it: continuous IS weights (safety-bounded, truncated, zero off the mask, optionally normalized
to mean 1 over the step) and a binary keep-mask (rejection outside [lower, upper] per token, sequence or
geometric mean, plus the veto of sequences holding a catastrophic token). Rejected tokens leave the loss
and its normalizer. Every diagnostic is logged under `rollout_corr/` with verl's names.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from tensordict import TensorDict

from rl.config.loss import RolloutCorrectionConfig
from rl.metrics.reduce import Reduce, State, StepStats
from rl.packing.rows import segment_sum, segments

SAFETY_BOUND = 20.0
"""IS log-ratios are clamped to ±20 before exp: weights stay in [2e-9, 5e8]."""
P = "rollout_corr/"


def correct(
    train_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    mask: torch.Tensor,
    index: torch.Tensor,
    count: int,
    config: RolloutCorrectionConfig,
    stats: StepStats,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """IS weights [B,L] (None without `rollout_is`) and the keep-mask [B,L] bool of one micro-batch.

    train/rollout_logprobs: [B,L]; mask [B,L] bool marks the policy-sampled tokens; index/count map tokens
    to this micro-batch's sequences. Weights are truncated but not yet batch-normalized (`normalize_is_weights`).
    """
    log_ratio = torch.where(mask, train_logprobs - rollout_logprobs, 0.0).double()  # [B,L], unbounded
    has_tokens = segment_sum(mask.double(), index, count)  # [S] tokens per sequence
    live = has_tokens > 0  # [S]
    seq_log_ratio = segment_sum(log_ratio, index, count)  # [S]
    keep = mask.clone()

    weights = None
    if config.rollout_is is not None:
        threshold = config.rollout_is_threshold
        if config.rollout_is == "token":
            bounded = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))  # [B,L]
            stats.add(P + "rollout_is", bounded[mask])
            stats.add(P + "rollout_is_ratio_fraction_high", (bounded[mask] > threshold).double())
            stats.add(P + "rollout_is_ratio_fraction_low", (bounded[mask] < 1 / threshold).double())
        else:
            bounded = torch.exp(seq_log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))[index]  # [B,L]
            seq = seq_log_ratio[live]
            stats.add(P + "rollout_is", torch.exp(seq.clamp(-SAFETY_BOUND, SAFETY_BOUND)))
            stats.add(P + "rollout_is_log", seq)  # unbounded: the true min/max (verl's rollout-correction diagnostics)
            stats.add(P + "rollout_is_ratio_fraction_high", (seq > math.log(threshold)).double())
            stats.add(P + "rollout_is_ratio_fraction_low", (seq < -math.log(threshold)).double())
        weights = torch.where(mask, bounded.clamp(max=threshold), 0.0).float()  # [B,L]
        # sequence ratios, bounded like verl's
        seq_weights = torch.exp(seq_log_ratio[live].clamp(-SAFETY_BOUND, SAFETY_BOUND))
        stats.add(P + "rollout_is_seq", seq_weights)
        stats.add(P + "rollout_is_seq_log", seq_log_ratio[live])
        stats.add(P + "rollout_is_seq_fraction_high", (seq_log_ratio[live] > math.log(threshold)).double())
        stats.add(P + "rollout_is_seq_fraction_low", (seq_log_ratio[live] < -math.log(threshold)).double())

    if config.rollout_rs is not None:
        upper, lower = math.log(config.rollout_rs_threshold), math.log(config.rs_lower)
        if config.rollout_rs == "token":
            bounded = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
            rejected = mask & ((bounded > upper) | (bounded < lower))  # [B,L]
        else:
            per_seq = seq_log_ratio if config.rollout_rs == "sequence" else seq_log_ratio / has_tokens.clamp_min(1)
            rejected_seq = live & ((per_seq > upper) | (per_seq < lower))  # [S]
            rejected = mask & rejected_seq[index]
        stats.add(P + "rollout_rs_masked_fraction", rejected[mask].double())
        rejected_seqs = segment_sum(rejected.double(), index, count) > 0
        stats.add(P + "rollout_rs_seq_masked_fraction", rejected_seqs[live].double())
        keep &= ~rejected

    if config.rollout_token_veto_threshold is not None:
        catastrophic = mask & (log_ratio < math.log(config.rollout_token_veto_threshold))  # unbounded ratio
        vetoed_seq = segment_sum(catastrophic.double(), index, count) > 0  # [S]
        stats.add(P + "rollout_is_catastrophic_token_fraction", catastrophic[mask].double())
        stats.add(P + "rollout_is_veto_fraction", vetoed_seq[live].double())
        keep &= ~vetoed_seq[index]
    return weights, keep


def apply(
    micro_batches: list[TensorDict],
    old_logprobs: list[torch.Tensor],
    config: RolloutCorrectionConfig,
    stats: StepStats,
    sum_over_ranks: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
) -> None:
    """The step's correction, in place, given each micro-batch's π_old from the no-grad pass: the off-policy
    diagnostics, IS weights and rejection per micro-batch, then the weights normalized over the step (all ranks) and
    the final weights' metrics. Decoupled mode anchors PPO on π_old; bypass keeps the sampler's logprobs, and under
    PPO its IS weights are only measured (the ratio already holds π_θ/π_rollout)."""
    measured: list[torch.Tensor | None] = [None] * len(micro_batches)  # weights computed but not applied (metrics)
    for position, (micro_batch, old) in enumerate(zip(micro_batches, old_logprobs, strict=True)):
        sampling = micro_batch["sampling_logprobs"]
        mask = micro_batch["rl_weights"] != 0
        index, count = segments(micro_batch)
        offpolicy_metrics(old, sampling, mask, index, count, stats)
        weights, keep = correct(old, sampling, mask, index, count, config, stats)
        micro_batch["rl_weights"] = torch.where(keep, micro_batch["rl_weights"], 0.0)
        if weights is not None and (not config.bypass or config.use_policy_gradient):
            micro_batch["is_weights"] = weights
        else:
            measured[position] = weights
        if not config.bypass:
            micro_batch["old_logprobs"] = old
    if any("is_weights" in micro_batch for micro_batch in micro_batches) and config.rollout_is_batch_normalize:
        normalize_is_weights(micro_batches, config.rollout_is, sum_over_ranks)
    for micro_batch, unapplied in zip(micro_batches, measured, strict=True):
        final = micro_batch.get("is_weights", unapplied)
        if final is not None:
            index, count = segments(micro_batch)
            record_final_weights(final, micro_batch["rl_weights"] != 0, config.rollout_is, index, count, stats)


def record_final_weights(
    weights: torch.Tensor, mask: torch.Tensor, level: str, index: torch.Tensor, count: int, stats: StepStats
) -> None:
    """The IS weights as the loss sees them (or, where only measured, would): `rollout_is_eff_sample_size` comes from
    them, per token or per sequence (`level`)."""
    if level == "token":
        stats.add(P + "rollout_is_final", weights[mask])
        return
    tokens = segment_sum(mask.double(), index, count)
    per_seq = segment_sum(torch.where(mask, weights, 0.0).double(), index, count)
    stats.add(P + "rollout_is_final", (per_seq / tokens.clamp_min(1))[tokens > 0])


def normalize_is_weights(
    micro_batches: list[TensorDict], level: str, sum_over_ranks: Callable[[torch.Tensor], torch.Tensor] = lambda t: t
) -> None:
    """Rescale `is_weights` in place to mean 1 over the step: over tokens, or over sequences for "sequence".

    `sum_over_ranks` sums the (total, count) pair over a sharded trainer's ranks."""
    total, n = 0.0, 0.0
    for micro_batch in micro_batches:
        weights, mask = micro_batch["is_weights"].double(), micro_batch["rl_weights"] != 0
        if level == "token":
            total += float(weights[mask].sum())
            n += float(mask.sum())
        else:  # one weight per sequence, repeated on its tokens: average over sequences
            index, count = segments(micro_batch)
            tokens = segment_sum(mask.double(), index, count)
            live = tokens > 0
            total += float((segment_sum(torch.where(mask, weights, 0.0), index, count)[live] / tokens[live]).sum())
            n += float(live.sum())
    total, n = sum_over_ranks(torch.tensor([total, n], dtype=torch.float64)).tolist()
    if n > 0 and total > 0:
        for micro_batch in micro_batches:
            micro_batch["is_weights"] = micro_batch["is_weights"] * (n / total)


def offpolicy_metrics(
    train_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    mask: torch.Tensor,
    index: torch.Tensor,
    count: int,
    stats: StepStats,
) -> None:
    """The trainer-vs-sampler gap on the policy-sampled tokens: KL, k3, χ², perplexities (seed's formulas)."""
    train = train_logprobs.detach().double()
    rollout = rollout_logprobs.double()
    log_ratio = torch.where(mask, train - rollout, 0.0)  # log π_train/π_rollout
    bounded = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    stats.add(P + "kl", (rollout - train)[mask])
    stats.add(P + "k3_kl", (torch.exp(bounded) - bounded - 1)[mask])
    stats.add(P + "ratio_sq", torch.exp(2 * bounded)[mask])
    tokens = segment_sum(mask.double(), index, count)
    live = tokens > 0
    mean_train = segment_sum(torch.where(mask, train, 0.0), index, count)[live] / tokens[live]  # [S]
    mean_rollout = segment_sum(torch.where(mask, rollout, 0.0), index, count)[live] / tokens[live]
    stats.add(P + "training_ppl", torch.exp(-mean_train))
    stats.add(P + "rollout_ppl", torch.exp(-mean_rollout))
    stats.add(P + "training_log_ppl", -mean_train)
    stats.add(P + "rollout_log_ppl", -mean_rollout)
    diff = mean_train - mean_rollout  # log_ppl_rollout - log_ppl_training, per sequence
    stats.add(P + "log_ppl_diff", diff)
    stats.add(P + "log_ppl_abs_diff", diff.abs())
    seq_ratio = torch.exp(segment_sum(bounded, index, count)[live].clamp(-SAFETY_BOUND, SAFETY_BOUND))
    stats.add(P + "seq_ratio_sq", seq_ratio**2)


def _exp(log_value: float) -> float:
    """e^x in float64, at most e^709 (the largest power of e float64 holds): a metric stays finite, its `_log_` twin
    keeps the exact exponent."""
    return math.exp(min(log_value, 709.0))


def correction_metrics(states: dict[str, State]) -> dict[str, float]:
    """The `rollout_corr/*` metrics of the step from its merged summary states, by verl's names."""
    out: dict[str, float] = {}
    samples = {
        name: (s["sum"], s["count"], s["sumsq"], s["min"], s["max"])
        for name, s in states.items()
        if s["reduction"] == Reduce.SUMMARY
    }
    for name, (total, n, sumsq, low, high) in samples.items():
        if not name.startswith(P):
            continue
        mean = total / n
        key = name[len(P) :]
        if key in ("rollout_is", "rollout_is_seq"):
            out[f"{name}_mean"] = mean
            out[f"{name}_std"] = math.sqrt(max(0.0, sumsq / n - mean * mean))
            logs = samples.get(name + "_log")
            if logs is not None:  # sequence ratios: min/max from the unbounded log ratios, not the ±20 bound
                out[f"{name}_log_min"], out[f"{name}_log_max"] = logs[3], logs[4]
                low, high = _exp(logs[3]), _exp(logs[4])
            out[f"{name}_min"], out[f"{name}_max"] = low, high
            if key == "rollout_is_seq":
                out[f"{name}_max_deviation"] = max(abs(high - 1), abs(1 - low))
        elif key == "ratio_sq":
            out[P + "chi2_token"] = mean - 1
        elif key == "seq_ratio_sq":
            out[P + "chi2_seq"] = mean - 1
        elif key == "log_ppl_diff":
            out[name] = mean
            out[P + "log_ppl_diff_max"], out[P + "log_ppl_diff_min"] = high, low
            out[P + "ppl_ratio"] = math.exp(-mean)
        elif key not in ("rollout_is_final", "rollout_is_log", "rollout_is_seq_log"):
            out[name] = mean
    final = samples.get(P + "rollout_is_final")
    if final is not None and final[2] > 0:
        out[P + "rollout_is_eff_sample_size"] = (final[0] / final[1]) ** 2 / (final[2] / final[1])
    return out
