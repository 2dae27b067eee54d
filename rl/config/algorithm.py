"""The `[algorithm]` section (how scored groups become training samples), its per-task overrides, the frozen models
(`[models.<name>]`) and the rules that decide `loss.rollout_correction`'s unset bypass mode and IS.

`[algorithm]` is every task's default; a task may override its credit fields (`CreditConfig`) with
`[[tasks]] algorithm = { type = ..., ... }`. The trainer-wide loss is `[loss]` (`rl.config.loss`).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, create_model, model_validator

from rl.config.loss import PRESETS, LossConfig
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
    echo_filter: str | None = None
    """echo: `package.module:function(message: dict) -> bool`, imported by path: only the environment messages it
    returns True for are trained (at their role's weight), e.g. tool results that did not fail; None trains all."""


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
    """`[algorithm]`: the default credit of every task and the group size (the trainer's loss is `[loss]`)."""

    group_size: int = Field(8, ge=1)
    """Samples per row; the group-relative algorithms (grpo, rloo, max_rl, reinforce_pp, echo) need at least 2."""

    @model_validator(mode="before")
    @classmethod
    def _moved_to_loss(cls, data: Any) -> Any:
        """The loss keys `[algorithm]` held before issue 26 are refused, naming where they live now."""
        keys = set(data) if isinstance(data, dict) else set()
        moved = sorted(keys & (set(LossConfig.model_fields) - set(cls.model_fields)) | keys & {"loss"})
        if moved:
            raise ValueError(
                f"{', '.join(moved)}: the trainer-wide loss is its own section [loss] since issue 26; write them "
                "there (algorithm.loss is loss.type)"
            )
        return data

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
"""Keys of `[loss.rollout_correction]` that are the config's own choice of correction (`preset = "disabled"`
turns it off)."""


def decide_bypass_mode(config: Any) -> None:
    """Resolve an unset `loss.rollout_correction.bypass_mode` by `bypass_rule` (use_policy_gradient needs bypass),
    after the dtypes are resolved (the rule compares them): `rl.loop.resolve` runs it.

    Where the rule resolves decoupled mode because the sampler is not the trainer's policy (`sampler_gaps`) and the
    config chose no correction, token IS (`decoupled_token_is`) comes with it: PPO anchored on π_old with nothing
    for π_rollout is what seed 004 calls the common implementation mistake (and what did not learn here)."""
    correction = config.loss.rollout_correction
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
    """A decoupled run over a sampler gap whose config turned IS (and rejection) off: nothing corrects π_rollout."""
    correction = config.loss.rollout_correction
    gaps = sampler_gaps(config)
    if correction.bypass_mode or not gaps or correction.rollout_is is not None or correction.rollout_rs is not None:
        return []
    return [
        "loss.rollout_correction: decoupled mode without IS or rejection, although "
        + "; ".join(gaps)
        + ": PPO anchors on π_old and nothing accounts for π_rollout (seed 004's common mistake; such runs did not "
        "learn here). Unset the correction keys for the default token IS, or set preset = 'decoupled_token_is'"
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
