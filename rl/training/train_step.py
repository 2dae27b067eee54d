"""One training step over a batch of packed micro-batches: the trainer's loop, blind to the algorithms that made them.

    sanitize → [no-grad pass: π_old, reference, correction] → K minibatches × (forward, loss, backward) → step

The loss is `compute_loss` over the per-token streams; normalizers are counted over each minibatch before
its first forward, so the gradient does not depend on the micro-batch split. With K = 1 and no correction
there is no extra forward pass: this is the plain PPO update against the sampler's logprobs.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
from tensordict import TensorDict

from rl.config.loss import LossConfig
from rl.metrics.reduce import StepStats, merge_all, step_metrics
from rl.packing.rows import COMPONENTS, component_counts, segments
from rl.training import correction
from rl.training.distributed import Ranks
from rl.training.logprobs import packed_logprobs
from rl.training.losses import compute_loss, kl_shaped_advantages

SPREAD = ("ratio",)
"""Trainer metrics logged with _mean/_std/_min/_max."""


def sanitize(micro_batch: TensorDict) -> int:
    """Mask non-finite sampler/teacher logprobs out of every component (in place); returns how many tokens."""
    bad = micro_batch["loss_mask"] & ~torch.isfinite(micro_batch["sampling_logprobs"])  # [B,L]
    bad_ref = (micro_batch["ref_kl_weights"] != 0) & ~torch.isfinite(micro_batch["ref_logprobs"])
    if bool(bad.any()) or bool(bad_ref.any()):
        for name in COMPONENTS:
            micro_batch[f"{name}_weights"] = torch.where(bad | bad_ref, 0.0, micro_batch[f"{name}_weights"])
        micro_batch["sampling_logprobs"] = torch.where(bad, 0.0, micro_batch["sampling_logprobs"])
        micro_batch["ref_logprobs"] = torch.where(bad_ref, 0.0, micro_batch["ref_logprobs"])
    return int((bad | bad_ref).sum())


def trained_positions(micro_batch: TensorDict) -> torch.Tensor:
    """[B,L] bool: tokens some loss component weighs, the only ones whose logprobs are computed."""
    return (micro_batch["rl_weights"] != 0) | (micro_batch["ce_weights"] != 0) | (micro_batch["ref_kl_weights"] != 0)


def needs_old_pass(config: LossConfig, n_minibatches: int) -> bool:
    """Whether π_old must be computed in a no-grad pass before the update. Bypass mode with one minibatch needs it
    only to reject tokens (rejection, veto: the loss's normalizers count what is kept) or to normalize IS weights
    over the step; IS weights alone come from the update's own forward (π_θ = π_old until the one optimizer step)."""
    rc = config.rollout_correction
    rejects = rc.rollout_rs is not None or rc.rollout_token_veto_threshold is not None
    return (
        n_minibatches > 1 or not rc.bypass or rejects or (rc.rollout_is is not None and rc.rollout_is_batch_normalize)
    )


def weigh_on_the_fly(logprobs: torch.Tensor, micro_batch: TensorDict, config: LossConfig, stats: StepStats) -> None:
    """Bypass mode without the no-grad pass: the off-policy diagnostics and the IS weights from the update forward's
    detached logprobs (`is_weights` for the plain policy gradient; under PPO the ratio already holds them)."""
    rc = config.rollout_correction
    mask = micro_batch["rl_weights"] != 0
    index, count = segments(micro_batch)
    sampling = micro_batch["sampling_logprobs"]
    correction.offpolicy_metrics(logprobs, sampling, mask, index, count, stats)
    if rc.rollout_is is None:
        return
    weights, _ = correction.correct(logprobs.detach(), sampling, mask, index, count, rc, stats)
    if rc.use_policy_gradient:
        micro_batch["is_weights"] = weights
    correction.record_final_weights(weights, mask, rc.rollout_is, index, count, stats)


def no_grad_pass(
    micro_batch: TensorDict,
    model: torch.nn.Module | None,
    reference: torch.nn.Module | None,
    compute: Callable[[], AbstractContextManager],
) -> torch.Tensor | None:
    """A micro-batch's logprobs without gradients: the reference's (`kl_ref_logprobs`, in place) and π_old under
    `model` (returned, and kept as `snapshot_logprobs`: train/ppo_kl measures the drift from it); None without `model`.
    `old_logprobs`, the PPO anchor, starts as the sampler's (bypass)."""
    micro_batch["old_logprobs"] = micro_batch["sampling_logprobs"]
    if model is None and reference is None:
        return None
    with torch.no_grad(), compute():
        trained = trained_positions(micro_batch)
        if reference is not None:
            micro_batch["kl_ref_logprobs"] = packed_logprobs(reference, micro_batch, mask=trained)  # [B,L]
        if model is None:
            return None
        micro_batch["snapshot_logprobs"] = old = packed_logprobs(model, micro_batch, mask=trained)  # [B,L] π_old
    return old


def prepare(
    micro_batches: list[TensorDict],
    model: torch.nn.Module,
    reference: torch.nn.Module | None,
    config: LossConfig,
    n_minibatches: int,
    stats: StepStats,
    compute: Callable[[], AbstractContextManager],
    ranks: Ranks = Ranks(),
) -> bool:
    """Everything before the update, in place: π_old and the reference's logprobs, the rollout correction (IS
    weights, rejection, normalization), KL-in-reward. Returns whether the off-policy diagnostics were taken here
    (else the update's first forward takes them)."""
    old_pass = needs_old_pass(config, n_minibatches)
    olds = [no_grad_pass(mb, model if old_pass else None, reference, compute) for mb in micro_batches]
    if old_pass:
        correction.apply(micro_batches, olds, config.rollout_correction, stats, ranks.sum)
    if config.kl_in_reward:
        for micro_batch in micro_batches:
            micro_batch["advantages"] = kl_shaped_advantages(micro_batch, config)
    return old_pass


def split_minibatches(micro_batches: list[TensorDict], n: int) -> list[list[TensorDict]]:
    """`n` disjoint, contiguous, non-empty groups of micro-batches (one optimizer step each).

    With fewer micro-batches than `n`, the micro-batches are split into single rows first (each row's
    sequences indexed anew).
    """
    if n > len(micro_batches):
        micro_batches = [
            row.exclude("seq_index", "seq_count") for micro_batch in micro_batches for row in micro_batch.split(1)
        ]
    if n > len(micro_batches):
        raise ValueError(f"trainer.ppo_n_minibatches = {n} but the batch has only {len(micro_batches)} packed rows")
    size, extra = divmod(len(micro_batches), n)
    out, start = [], 0
    for k in range(n):
        end = start + size + (k < extra)
        out.append(micro_batches[start:end])
        start = end
    return out


def grad_norm(model: torch.nn.Module, max_grad_norm: float) -> float:
    """Clip the gradients to `max_grad_norm`; the norm before clipping (over every rank's shards when sharded)."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    micro_batches: list[TensorDict],
    config: LossConfig,
    *,
    max_grad_norm: float,
    horizon: int,
    n_minibatches: int = 1,
    reference: torch.nn.Module | None = None,
    device: torch.device | str = "cpu",
    compute: Callable[[], AbstractContextManager] = contextlib.nullcontext,
    weights: Callable[[], AbstractContextManager] = contextlib.nullcontext,
    ranks: Ranks = Ranks(),
) -> dict[str, float]:
    """K = `n_minibatches` optimizer steps over the batch; returns the step's metrics (reduced correctly).

    `compute()` is entered around every forward pass (the trainer's bf16 autocast); losses stay float32. `weights()` is
    entered around the no-grad pass and around each minibatch's forward and backward passes, not around the optimizer
    step (the trainer's bf16 compute copy of its weights: `rl.training.compute_copy`).
    `horizon` is the constant normalizer of seq-mean-token-sum-norm (trainer.seq_len). Metrics: loss,
    pg_loss / ce_loss / ref_kl_loss, entropy (rl tokens) / ce_entropy / ref_kl/entropy, clip fractions, ratio_mean/_std/_min/_max, mismatch_k3, kl, grad_norm
    (before clipping; the mean over the K steps), skipped_nonfinite_steps (of the K, those whose gradient norm was
    not finite: no optimizer or LR-schedule step, the weights unchanged), optimizer_steps (K minus those) and
    optimizer_steps_total (the run's, as the LR schedule counts them: K x accepted batches, AReaL's ppo_n_minibatches), lr, token counts per component, nonfinite_logprob_tokens,
    train_tokens_per_s, and the `rollout_corr/*` diagnostics.
    With several `ranks`, `micro_batches` are this rank's share: token counts and metrics are summed or merged
    over all ranks, so every rank returns the metrics of the whole batch.
    """
    start = time.perf_counter()
    micro_batches = [micro_batch.to(device).clone() for micro_batch in micro_batches]
    stats = StepStats()
    stats.add_total("nonfinite_logprob_tokens", sum(sanitize(micro_batch) for micro_batch in micro_batches))
    with weights():
        diagnosed = prepare(micro_batches, model, reference, config, n_minibatches, stats, compute, ranks)
    counts_all = ranks.sum(component_counts(micro_batches))
    grad_norms, skipped = [], 0
    for minibatch in split_minibatches(micro_batches, n_minibatches):
        counts = ranks.sum(component_counts(minibatch))  # [3, 2] over every rank's share of the minibatch
        optimizer.zero_grad(set_to_none=True)
        with weights():
            for micro_batch in minibatch:
                with compute():
                    logprobs, entropy = packed_logprobs(  # [B,L]; the output layer runs only where a logprob is trained
                        model, micro_batch, mask=trained_positions(micro_batch), return_entropy=True
                    )
                stats.add("entropy", entropy[micro_batch["rl_weights"] != 0])
                stats.add("ref_kl/entropy", entropy[micro_batch["ref_kl_weights"] != 0])
                stats.add("ce_entropy", entropy[micro_batch["ce_weights"] != 0])
                if not diagnosed:
                    weigh_on_the_fly(logprobs, micro_batch, config, stats)
                loss = compute_loss(logprobs, micro_batch, counts, config, stats, horizon=horizon)
                loss.backward()
                stats.add_total("loss", loss.detach().double() / n_minibatches)
        grad_norms.append(grad_norm(model, max_grad_norm))
        if not math.isfinite(grad_norms[-1]):  # NaN/inf gradients would make every weight NaN: skip this update
            optimizer.zero_grad(set_to_none=True)
            skipped += 1
            continue
        optimizer.step()
        scheduler.step()
    tokens = ranks.sum(
        torch.tensor(float(sum(int((mb["sequence_ids"] >= 0).sum()) for mb in micro_batches)), dtype=torch.float64)
    )
    states = merge_all(ranks.gather(stats.states()))  # the step's one host sync of its statistics
    metrics = step_metrics(states, spread=SPREAD)
    metrics = {key: value for key, value in metrics.items() if not key.startswith(correction.P)}
    metrics.update(correction.correction_metrics(states))
    for name in ("pg_loss", "ce_loss", "ref_kl_loss"):
        if name in metrics:
            metrics[name] /= n_minibatches
    metrics.update(
        grad_norm=sum(grad_norms) / len(grad_norms),
        skipped_nonfinite_steps=float(skipped),
        optimizer_steps=float(n_minibatches - skipped),
        optimizer_steps_total=float(scheduler.last_epoch),  # the schedule counts every optimizer step of the run
        lr=scheduler.get_last_lr()[0],
        num_loss_tokens=float(counts_all[0, 0]),
        num_ce_tokens=float(counts_all[1, 0]),
        num_ref_kl_tokens=float(counts_all[2, 0]),
        train_tokens_per_s=float(tokens) / (time.perf_counter() - start),
    )
    return metrics
