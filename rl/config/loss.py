"""`[loss]`: the trainer's loss, for every task alike: the policy loss (by name or import path), its clipping and
aggregation, the KL to a reference model, and the rollout correction between sampler and trainer (its presets)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rl.config.section import Section

PRESETS: dict[str, dict[str, Any]] = {
    "decoupled_token_is": dict(rollout_is="token", rollout_is_threshold=2.0, bypass_mode=False),
    "decoupled_seq_is": dict(rollout_is="sequence", rollout_is_threshold=2.0, bypass_mode=False),
    "decoupled_seq_is_rs": dict(
        rollout_is="sequence",
        rollout_is_threshold=2.0,
        rollout_rs="sequence",
        rollout_rs_threshold=2.0,
        rollout_rs_threshold_lower=0.5,
        bypass_mode=False,
    ),
    "decoupled_geo_rs": dict(
        rollout_rs="geometric",
        rollout_rs_threshold=1.001,
        rollout_rs_threshold_lower=0.999,
        rollout_token_veto_threshold=1e-4,
        bypass_mode=False,
    ),
    "ppo_is_bypass": dict(rollout_is="token", rollout_is_threshold=2.0, bypass_mode=True, use_policy_gradient=False),
    "pg_is": dict(rollout_is="sequence", rollout_is_threshold=2.0, bypass_mode=True, use_policy_gradient=True),
    "pg_rs": dict(
        rollout_rs="geometric",
        rollout_rs_threshold=1.001,
        rollout_rs_threshold_lower=0.999,
        rollout_token_veto_threshold=1e-4,
        bypass_mode=True,
        use_policy_gradient=True,
    ),
    "disabled": dict(),
}


class RolloutCorrectionConfig(Section):
    """Correction of the gap between the sampler (π_rollout) and the trainer, after verl's rollout correction.

    With every mechanism off (the default) only the `rollout_corr/` diagnostics are logged, at no extra
    forward pass. `preset` fills the keys a user did not set.
    """

    preset: Literal[tuple(PRESETS)] | None = None  # type: ignore[valid-type]
    """Fills the correction keys a config leaves unset (the presets are listed in docs/algorithms.md)."""
    rollout_is: Literal["token", "sequence"] | None = None
    """Importance weights π_train/π_rollout per token or per sequence (product), truncated at the threshold. Unset
    in a config that chooses no correction: "token" where the run is decoupled (resolved or `bypass_mode = false`)
    over a sampler gap (`rl.config.correction`)."""
    rollout_is_threshold: float = 2.0
    """Upper truncation of the IS weights."""
    rollout_is_batch_normalize: bool = False
    """Rescale the truncated weights to mean 1 over the step (token: all tokens; sequence: per sequence)."""
    rollout_rs: Literal["token", "sequence", "geometric"] | None = None
    """Rejection of tokens / sequences whose ratio leaves [lower, upper]; geometric = per-token geometric mean."""
    rollout_rs_threshold: float | None = None
    """Upper bound of the rejection interval; required with `rollout_rs`."""
    rollout_rs_threshold_lower: float | None = None
    """None = 1 / rollout_rs_threshold."""
    rollout_token_veto_threshold: float | None = None
    """Reject a whole sequence when any token's unbounded ratio falls below this (e.g. 1e-4)."""
    bypass_mode: bool | None = None
    """True: π_old = π_rollout (PPO anchors on the sampler's logprobs; no extra forward). False (decoupled):
    π_old comes from a no-grad pass at the start of the step; IS/RS correct π_old vs π_rollout. Unset: decided
    from the run (`rl.config.correction.bypass_rule`): bypass only where π_rollout = π_old holds by construction."""
    use_policy_gradient: bool = False
    """Replace the PPO loss by a plain policy gradient weighted by the IS weights (needs bypass_mode)."""

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("preset") in PRESETS:
            preset = dict(PRESETS[data["preset"]])
            if "rollout_rs_threshold" in data and "rollout_rs_threshold_lower" not in data:
                # a user's upper bound gets its reciprocal, not the preset's lower
                preset.pop("rollout_rs_threshold_lower", None)
            data = {**preset, **data}
        return data

    @field_validator(
        "rollout_is_threshold",
        "rollout_rs_threshold",
        "rollout_rs_threshold_lower",
        "rollout_token_veto_threshold",
        mode="before",
    )
    @classmethod
    def _positive_number(cls, value: Any, info: Any) -> Any:
        if value is None:
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{info.field_name} must be a positive number, got {value!r}")
        if value <= 0:
            raise ValueError(f"{info.field_name} must be positive, got {value!r}")
        return value

    @model_validator(mode="after")
    def _check(self) -> RolloutCorrectionConfig:
        if self.rollout_rs is not None and self.rollout_rs_threshold is None:
            raise ValueError("rollout_rs is set but rollout_rs_threshold is not: rejection needs a threshold")
        if self.rollout_rs_threshold is not None and self.rs_lower > self.rollout_rs_threshold:
            raise ValueError(
                f"rollout_rs_threshold_lower ({self.rs_lower}) is above rollout_rs_threshold ({self.rollout_rs_threshold})"
            )
        if self.use_policy_gradient and self.bypass_mode is False:
            raise ValueError("use_policy_gradient needs bypass_mode = true")
        return self

    @property
    def rs_lower(self) -> float:
        if self.rollout_rs_threshold_lower is not None:
            return self.rollout_rs_threshold_lower
        return 1.0 / self.rollout_rs_threshold if self.rollout_rs_threshold else 0.0

    @property
    def bypass(self) -> bool:
        """`bypass_mode` as the run resolved it; a section built outside a `Config` (the trainer alone) bypasses."""
        return self.bypass_mode is not False

    @property
    def corrects(self) -> bool:
        """Whether anything beyond diagnostics is applied (weights, rejection or veto)."""
        return (
            self.rollout_is is not None or self.rollout_rs is not None or self.rollout_token_veto_threshold is not None
        )


class LossConfig(Section):
    """`[loss]`: the loss of every micro-batch (`rl.training.losses.compute_loss`); the policy part by `type`."""

    type: str = "ppo"
    """The policy loss: "ppo" (clipped token ratio), "gspo" (sequence ratio), "cispo" (clipped IS weight: no token
    loses its gradient), "pg" (plain IS-weighted policy gradient), or "package.module:function", a user's policy
    loss (`rl.training.losses.PolicyLossFn`), checked when the run resolves its config (`rl.loop.resolve`)."""
    clip_eps_low: float = Field(0.2, ge=0)
    """The ratio's lower clip, 1 - clip_eps_low."""
    clip_eps_high: float = Field(0.28, ge=0)
    """The ratio's upper clip, 1 + clip_eps_high: 0.28 > 0.2 is DAPO's clip-higher, which lets unlikely tokens that
    did well grow."""
    dual_clip_c: float | None = Field(None, gt=1)
    """ppo: bound the loss of negative-advantage tokens at -c·A (dual-clip PPO); None = off."""
    aggregation: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"] = (
        "token-mean"
    )
    """How per-token losses become one number: "token-mean" over all tokens, "seq-mean-token-mean" a mean per sequence then
    over sequences, "seq-mean-token-sum" sums per sequence, "-norm" those divided by `trainer.seq_len`. Unset:
    "seq-mean-token-mean" for gspo (one mean per sequence, as the paper, verl and SkyRL), else "token-mean"."""
    kl_coef: float = Field(0.0, ge=0)
    """Weight of the KL to a frozen copy of the initial policy; 0 loads no reference."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """Estimator of KL(π_θ ‖ π_ref) per sampled token, k1 = log π_θ - log π_ref: "k1" (unbiased, may be negative),
    "k2" (k1²/2), "k3" (exp(-k1) + k1 - 1: unbiased and ≥ 0, clamped to [-10, 10] as verl and SkyRL)."""
    kl_log_ratio_clamp: float = Field(20.0, gt=0)
    """The log ratio k1 is clamped to ±this before any KL estimate, so one extreme token cannot swamp the loss."""
    kl_in_reward: bool = False
    """Fold -kl_coef·KL(sequence) into every token's advantage instead of adding a loss term."""
    rollout_correction: RolloutCorrectionConfig = RolloutCorrectionConfig()
    """Measures, and optionally corrects, the gap between the sampler (π_rollout) and the trainer."""

    @model_validator(mode="before")
    @classmethod
    def _default_aggregation(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("aggregation") is None:
            data = {**data, "aggregation": "seq-mean-token-mean" if data.get("type") == "gspo" else "token-mean"}
        return data

    @model_validator(mode="after")
    def _check(self) -> LossConfig:
        if self.kl_in_reward and self.kl_coef == 0:
            raise ValueError("loss.kl_in_reward is set but loss.kl_coef is 0")
        return self


def loss_warnings(loss: LossConfig) -> list[str]:
    """Settings that run but differ from what the loss's paper and the field use (`rlmesh validate`/`train` warn)."""
    if loss.type == "gspo" and loss.aggregation != "seq-mean-token-mean":
        return [
            f"loss.type = 'gspo' with aggregation = {loss.aggregation!r}: GSPO (the paper, verl, SkyRL) takes one "
            "mean per sequence ('seq-mean-token-mean'); other aggregations weight sequences by length"
        ]
    return []
