"""The `[algorithm]` section, its per-task overrides and rollout-correction presets.

`[algorithm]` holds the trainer-wide loss (policy loss, aggregation, KL, rollout correction) and the
default sample-building algorithm; a task may override the sample-building part with
`[[tasks]] algorithm = { type = ..., ... }`. Frozen models are declared in `[models.<name>]`.
"""

from __future__ import annotations

import warnings
from typing import Annotated, Any, Literal

from pydantic import Field, create_model, field_validator, model_validator

from rl.config.section import Device, DType, Section

POLICY = "policy"
"""The reserved model name of the live, trained policy."""


class FrozenModelConfig(Section):
    """A model that is served but never trained: a teacher, or a sampler of demonstrations."""

    path: str
    """HF folder, hub id, or a built-in offline asset ("tiny-qwen3", ...)."""
    dtype: DType = "float32"
    """Weights dtype of its generators."""
    device: Device = "cpu"
    """Where its generators run."""
    replicas: int = Field(1, ge=1)
    """Generator replicas serving it (`[services.models]` sets their deadlines and restarts)."""


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
    in a config that chooses no correction: "token" where the run resolves decoupled mode over a sampler gap."""
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
    from the run (`bypass_rule`, applied by `rl.loop.resolve`): bypass only where π_rollout = π_old holds by construction."""
    use_policy_gradient: bool = False
    """Replace the PPO loss by a plain policy gradient weighted by the IS weights (needs bypass_mode)."""

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("preset") in PRESETS:
            preset = dict(PRESETS[data["preset"]])
            if "rollout_rs_threshold" in data and "rollout_rs_threshold_lower" not in data:
                preset.pop(
                    "rollout_rs_threshold_lower", None
                )  # a user's upper bound gets its reciprocal, not the preset's lower
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


class EchoRoleWeights(Section):
    """echo: cross-entropy weight of environment tokens by the role of the message they render. The default
    table trains tool results at 0.1; setting any role replaces the whole table (seed 002): a role left out is 0."""

    system: float = Field(0.0, ge=0)
    """Weight of the tokens of system messages."""
    user: float = Field(0.0, ge=0)
    """Weight of the tokens of user messages the environment adds."""
    assistant: float = Field(0.0, ge=0)
    """Weight of the tokens of assistant messages the environment adds (not the policy's own replies)."""
    tool: float = Field(0.1, ge=0)
    """Weight of the tokens of tool results (0.1 only in the default table: 0 when the table sets other roles)."""

    @model_validator(mode="before")
    @classmethod
    def _given_table_replaces_defaults(cls, data: Any) -> Any:
        """A table naming any role is the whole table: the roles it leaves out train at 0, not at their defaults."""
        if isinstance(data, dict) and data:
            return {role: 0.0 for role in cls.model_fields} | data
        return data


class CreditConfig(Section):
    """How a task's scored groups become training samples: the part of `[algorithm]` a task may override."""

    type: str = "grpo"
    """How advantages and loss weights are assigned: a registered algorithm or `package.module:Class` (docs/algorithms.md);
    checked against `rl.algorithms.registry` when the run resolves its config."""
    normalize_advantage_std: bool = False
    """grpo: divide the centred rewards by the group's std (original GRPO) instead of Dr.GRPO's plain centring."""
    drop_constant_reward_groups: bool = False
    """Dynamic sampling: drop groups whose advantages are all zero (counted in `rollouts/dropped_zero_adv_groups`)."""
    custom_advantage_fn: str | None = None
    """custom: `package.module:function(rewards: list[float], rollouts) -> list[float | list[float]]`, per rollout
    one advantage, or one per sampled token (docs/algorithms.md)."""
    teacher: str | None = None
    """opd: the `[models.<name>]` whose logprobs the policy is pulled towards (reverse KL)."""
    sampler: str = POLICY
    """Who samples the task's rollouts: "policy" or a `[models.<name>]` (then only ce/ref_kl can be trained)."""
    demo_key: str = "demonstration"
    """sft / opsd: the dataset row key holding the demonstration text."""
    echo_role_weights: EchoRoleWeights = EchoRoleWeights()
    """echo: cross-entropy weight of environment tokens by message role (tool-response bodies at 0.1)."""


def _override_of(model: type[Section], name: str, doc: str) -> type[Section]:
    """A section with every field of `model`, each optional and unset by default: an override that names only what
    it changes. Derived, so a field added to `model` is overridable at once."""
    fields: dict[str, Any] = {
        field: (
            (Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation) | None,
            Field(None, description=info.description),
        )
        for field, info in model.model_fields.items()
    }
    return create_model(name, __base__=Section, __doc__=doc, __module__=__name__, **fields)


TaskAlgorithmConfig = _override_of(
    CreditConfig,
    "TaskAlgorithmConfig",
    "A task's overrides of `[algorithm]`'s credit fields (`CreditConfig`); every field left unset comes from `[algorithm]`.",
)


class AlgorithmConfig(CreditConfig):
    """`[algorithm]`: the default credit of every task, the group size and the trainer-wide loss."""

    group_size: int = Field(8, ge=1)
    """Samples per row; the group-relative algorithms (grpo, rloo, max_rl, reinforce_pp, echo) need at least 2."""

    loss: Literal["ppo", "gspo", "cispo", "pg"] = "ppo"
    """The policy loss: "ppo" (clipped token ratio), "gspo" (sequence ratio), "cispo" (clipped IS weight: no token
    loses its gradient), "pg" (plain IS-weighted policy gradient)."""
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
            data = {**data, "aggregation": "seq-mean-token-mean" if data.get("loss") == "gspo" else "token-mean"}
        return data

    @model_validator(mode="after")
    def _warn_gspo_aggregation(self) -> AlgorithmConfig:
        if self.loss == "gspo" and self.aggregation != "seq-mean-token-mean":
            warnings.warn(
                f"algorithm.loss = 'gspo' with aggregation = {self.aggregation!r}: GSPO (the paper, verl, SkyRL) takes one "
                "mean per sequence ('seq-mean-token-mean'); other aggregations weight sequences by length",
                stacklevel=2,
            )
        return self

    def for_task(self, override: Section | None) -> AlgorithmConfig:
        """This algorithm with a task's override applied."""
        if override is None:
            return self
        update = {name: value for name in type(override).model_fields if (value := getattr(override, name)) is not None}
        return self.model_copy(update=update)


def task_algorithm_key(index: int, override: Any) -> str:
    """The key an error about task `index`'s algorithm names: its override when that sets the type."""
    return f"tasks.{index}.algorithm" if override is not None and override.type is not None else "algorithm"


def sampler_gaps(config: Any) -> list[str]:
    """Why the policy's sampler (π_rollout) is not the trainer's π_old at the step: a lower-precision sampler or
    trainer, a staleness budget, later minibatches starting from a moved policy. Empty: π_rollout = π_old."""
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
"""Keys of `[algorithm.rollout_correction]` that are the config's own choice of correction (`preset = "disabled"`
turns it off)."""


def decide_bypass_mode(config: Any) -> None:
    """Resolve an unset `algorithm.rollout_correction.bypass_mode` by `bypass_rule` (use_policy_gradient needs bypass),
    after the dtypes are resolved (the rule compares them): `rl.loop.resolve` runs it.

    Where the rule resolves decoupled mode because the sampler is not the trainer's policy (`sampler_gaps`) and the
    config chose no correction, token IS (`decoupled_token_is`) comes with it: PPO anchored on π_old with nothing
    for π_rollout is what seed 004 calls the common implementation mistake (and what did not learn here)."""
    correction = config.algorithm.rollout_correction
    if correction.bypass_mode is not None:
        return
    chosen = bool(correction.model_fields_set & CORRECTION_CHOICES)
    correction.bypass_mode = correction.use_policy_gradient or bypass_rule(config)[0]
    if not correction.bypass_mode and sampler_gaps(config) and not chosen:
        preset = PRESETS["decoupled_token_is"]
        if "rollout_is_threshold" not in correction.model_fields_set:
            correction.rollout_is_threshold = preset["rollout_is_threshold"]
        correction.rollout_is = preset["rollout_is"]


def correction_origin(config: Any) -> str | None:
    """For `rlmesh validate`: token IS and why, where the run's rule asks for it (decoupled over a sampler gap)."""
    correction = config.algorithm.rollout_correction
    gaps = sampler_gaps(config)
    if correction.bypass_mode or not gaps:
        return None
    if correction.rollout_is is None:
        return None  # `correction_warnings` says it
    return (
        f"algorithm.rollout_correction.rollout_is = {correction.rollout_is!r} (threshold "
        f"{correction.rollout_is_threshold}): IS on, as decoupled mode needs where the sampler is not π_old (on by "
        "default there unless the config chooses a correction): " + "; ".join(gaps)
    )


def correction_warnings(config: Any) -> list[str]:
    """A decoupled run over a sampler gap whose config turned IS (and rejection) off: nothing corrects π_rollout."""
    correction = config.algorithm.rollout_correction
    gaps = sampler_gaps(config)
    if correction.bypass_mode or not gaps or correction.rollout_is is not None or correction.rollout_rs is not None:
        return []
    return [
        "algorithm.rollout_correction: decoupled mode without IS or rejection, although "
        + "; ".join(gaps)
        + ": PPO anchors on π_old and nothing accounts for π_rollout (seed 004's common mistake; such runs did not "
        "learn here). Unset the correction keys for the default token IS, or set preset = 'decoupled_token_is'"
    ]


def bypass_origin(config: Any) -> str:
    """A validated config's `bypass_mode` and the run's rule beside it, for `rlmesh validate` (they differ only
    where the config, its preset or use_policy_gradient set it)."""
    correction = config.algorithm.rollout_correction
    rule, reason = bypass_rule(config)
    value = str(correction.bypass_mode).lower()
    if correction.bypass_mode == rule:
        return f"algorithm.rollout_correction.bypass_mode = {value}, as the run's rule decides: {reason}"
    return (
        f"algorithm.rollout_correction.bypass_mode = {value}, set by the config; the run's rule would choose {reason}"
    )
