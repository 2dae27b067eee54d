"""The `[algorithm]` section (how scored groups become training samples) and its per-task overrides; the rules that
decide `loss.rollout_correction`'s mode and IS from the run are `rl.config.correction`.

`[algorithm]` is every task's default; a task may override its credit fields (`CreditConfig`) with
`[[tasks]] algorithm = { type = ..., ... }`. The trainer-wide loss is `[loss]` (`rl.config.loss`).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, create_model, model_validator

from rl.config.loss import LossConfig
from rl.config.section import Section

POLICY = "policy"
"""The reserved model name of the live, trained policy."""


class EchoRoleWeights(Section):
    """echo: cross-entropy weight of environment tokens by the role of the message they render. The default
    table trains tool results at 0.1; setting any role replaces the whole table (as prime-rl's echo does): a role left
    out is 0, so a table reads as everything it trains."""

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
        """The loss keys an `[algorithm]` section once held are refused, naming where they live now."""
        keys = set(data) if isinstance(data, dict) else set()
        moved = sorted(keys & (set(LossConfig.model_fields) - set(cls.model_fields)) | keys & {"loss"})
        if moved:
            raise ValueError(
                f"{', '.join(moved)}: the trainer-wide loss is its own section [loss]; write them "
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
