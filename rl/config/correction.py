"""The rules that decide `[loss.rollout_correction]` from the run: where the sampler (π_rollout) is not the trainer's
π_old (`sampler_gaps`), the default mode (`bypass_rule`, resolved by `decide_bypass_mode`, which `rl.loop.resolve`
runs), the token IS a decoupled run over such a gap gets unless the config chose its own correction, and what
`rlmesh validate` prints about them (`bypass_origin`, `correction_origin`, `correction_warnings`)."""

from __future__ import annotations

from typing import Any

from rl.config.algorithm import POLICY
from rl.config.loss import PRESETS


def sampler_gaps(config: Any) -> list[str]:
    """Why the policy's sampler (π_rollout) is not the trainer's π_old at the step: a lower-precision sampler or
    trainer, a staleness budget, later minibatches starting from a moved policy, LoRA dropout in the trainer's passes.
    Empty: π_rollout = π_old."""
    trainer, generator = config.trainer, config.generator
    gaps = []
    if generator.dtype not in ("auto", trainer.param_dtype) or trainer.dtype != trainer.param_dtype:
        gaps.append(
            f"the sampler (generator.dtype = {generator.dtype}) is not the trainer's exact policy "
            f"(trainer.param_dtype = {trainer.param_dtype}, trainer.dtype = {trainer.dtype})"
        )
    if config.run.max_policy_staleness > 0:
        gaps.append(f"run.max_policy_staleness = {config.run.max_policy_staleness} (rollouts of older policies)")
    if trainer.ppo_n_minibatches > 1:
        gaps.append(
            f"trainer.ppo_n_minibatches = {trainer.ppo_n_minibatches} (later minibatches start from a moved policy)"
        )
    if trainer.lora.enabled and trainer.lora.dropout > 0:
        gaps.append(
            f"trainer.lora.dropout = {trainer.lora.dropout} (the trainer's passes see a dropout-noised policy, the "
            "sampler the adapters without dropout)"
        )
    return gaps


def bypass_rule(config: Any) -> tuple[bool, str]:
    """The default `bypass_mode` of a run and why: bypass (PPO anchored on the sampler's logprobs, no extra
    forward) only where π_rollout = π_old holds by construction, decoupled otherwise (verl's default)."""
    reasons = sampler_gaps(config)
    frozen = sorted({config.algorithm.for_task(task.algorithm).sampler for task in config.tasks} - {POLICY})
    if frozen:
        reasons.append(f"frozen samplers {frozen}")
    if reasons:
        return False, "decoupled: " + "; ".join(reasons)
    return True, "bypass: the sampler runs the trainer's exact weights, staleness 0, one minibatch, no frozen sampler"


CORRECTION_CHOICES = frozenset({"preset", "rollout_is", "rollout_rs", "rollout_token_veto_threshold"})
"""Keys of `[loss.rollout_correction]` that are the config's own choice of correction (`preset = "disabled"`
turns it off). `bypass_mode` is not one: it picks the mode, not the correction."""


def decide_bypass_mode(config: Any) -> None:
    """Resolve an unset `loss.rollout_correction.bypass_mode` by `bypass_rule` (use_policy_gradient needs bypass),
    after the dtypes are resolved (the rule compares them): `rl.loop.resolve` runs it.

    A decoupled run (by the rule or by the config's `bypass_mode = false`) over a sampler gap (`sampler_gaps`) whose
    config chose no correction gets token IS (`decoupled_token_is`): PPO anchored on π_old with nothing for
    π_rollout is what verl's guide calls the common implementation mistake (and what did not learn here). Only a
    chosen correction (`CORRECTION_CHOICES`, `preset = "disabled"` among them) turns it off."""
    correction = config.loss.rollout_correction
    chosen = bool(correction.model_fields_set & CORRECTION_CHOICES)
    if correction.bypass_mode is None:
        correction.bypass_mode = correction.use_policy_gradient or bypass_rule(config)[0]
    if not correction.bypass_mode and sampler_gaps(config) and not chosen:
        preset = PRESETS["decoupled_token_is"]
        if "rollout_is_threshold" not in correction.model_fields_set:
            correction.rollout_is_threshold = preset["rollout_is_threshold"]
        correction.rollout_is = preset["rollout_is"]


def correction_origin(config: Any) -> str | None:
    """For `rlmesh validate`: token IS and why, where the run's rule asks for it (decoupled over a sampler gap)."""
    correction = config.loss.rollout_correction
    gaps = sampler_gaps(config)
    if correction.bypass_mode or not gaps:
        return None
    if correction.rollout_is is None:
        return None  # `correction_warnings` says it
    return (
        f"loss.rollout_correction.rollout_is = {correction.rollout_is!r} (threshold "
        f"{correction.rollout_is_threshold}): IS on, as decoupled mode needs where the sampler is not π_old (on by "
        "default there unless the config chooses a correction): " + "; ".join(gaps)
    )


def correction_warnings(config: Any) -> list[str]:
    """A decoupled run over a sampler gap whose config chose a correction with no IS, rejection or veto (`preset =
    "disabled"`): nothing corrects π_rollout."""
    correction = config.loss.rollout_correction
    gaps = sampler_gaps(config)
    corrected = (correction.rollout_is, correction.rollout_rs, correction.rollout_token_veto_threshold)
    if correction.bypass_mode or not gaps or any(choice is not None for choice in corrected):
        return []
    chosen = f"preset = {correction.preset!r}" if correction.preset else "the correction keys"
    return [
        f"loss.rollout_correction: decoupled mode without IS or rejection ({chosen} turns them off), although "
        + "; ".join(gaps)
        + ": PPO anchors on π_old and nothing accounts for π_rollout (verl's common implementation mistake; such runs "
        f"did not learn here). Remove {chosen} for the default token IS, or set preset = 'decoupled_token_is'"
    ]


def bypass_origin(config: Any) -> str:
    """A validated config's `bypass_mode` and the run's rule beside it, for `rlmesh validate` (they differ only
    where the config, its preset or use_policy_gradient set it)."""
    correction = config.loss.rollout_correction
    rule, reason = bypass_rule(config)
    value = str(correction.bypass_mode).lower()
    if correction.bypass_mode == rule:
        return f"loss.rollout_correction.bypass_mode = {value}, as the run's rule decides: {reason}"
    return f"loss.rollout_correction.bypass_mode = {value}, set by the config; the run's rule would choose {reason}"
