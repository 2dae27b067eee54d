"""The algorithm classes by `algorithm.type` (a registered name, or a user's class by import path), and the one
place a task's algorithm object is built; and the config checks that need the classes (`check_algorithms`)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from rl.algorithms.base import Algorithm, PromptLogprobsFn
from rl.algorithms.config import POLICY, AlgorithmConfig, decide_bypass_mode
from rl.algorithms.distillation import OPD, OPSD, SFT
from rl.algorithms.echo import Echo
from rl.algorithms.policy_gradient import GRPO, RLOO, Custom, MaxRL, ReinforcePP, Reward
from rl.components import import_object

ALGORITHMS: dict[str, type[Algorithm]] = {
    "grpo": GRPO,
    "rloo": RLOO,
    "max_rl": MaxRL,
    "reinforce_pp": ReinforcePP,
    "reward": Reward,
    "custom": Custom,
    "echo": Echo,
    "sft": SFT,
    "opd": OPD,
    "opsd": OPSD,
}


def algorithm_class(name: str) -> type[Algorithm]:
    """The class of a registered algorithm, or of `package.module:Class` (a user's `Algorithm` subclass)."""
    cls = ALGORITHMS.get(name) or import_object(name)
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise ValueError(f"{name!r} resolves to {cls!r}, which is not an rl.algorithms.base.Algorithm subclass")
    return cls


def build_algorithm(
    config: AlgorithmConfig, task: str, renderer: Any = None, prompt_logprobs: PromptLogprobsFn | None = None
) -> Algorithm:
    """Task `task`'s algorithm object from its resolved config."""
    return algorithm_class(config.type)(config, task, renderer, prompt_logprobs)


def check_algorithms(config: Any) -> None:
    """Cross-section checks of algorithms, tasks and frozen models; each error names the offending key.

    The generic ones are here; what an algorithm needs of its own keys is its class's `check`.
    """
    models = config.models
    if POLICY in models:
        raise ValueError(f"models.{POLICY}: the name {POLICY!r} is reserved for the trained policy")
    for name, model in models.items():
        try:
            type(config.model)(path=model.path)  # the policy's check of a model path
        except ValidationError as exc:
            raise ValueError(f"models.{name}.path: {exc.errors()[0]['msg'].removeprefix('Value error, ')}") from None
    for index, task in enumerate(config.tasks):
        algorithm = config.algorithm.for_task(task.algorithm)
        where = (
            f"tasks.{index}.algorithm"
            if task.algorithm is not None and task.algorithm.type is not None
            else "algorithm"
        )
        for key in ("teacher", "sampler"):
            name = getattr(algorithm, key)
            if name is not None and name != POLICY and name not in models:
                raise ValueError(
                    f"{where}.{key} = {name!r} is not a declared model (known: {sorted(models)} or 'policy')"
                )
        try:
            cls = algorithm_class(algorithm.type)
        except ValueError as exc:
            raise ValueError(f"{where}.type: {exc}") from None
        cls.check(algorithm, where, config.algorithm.group_size)
    if config.algorithm.kl_in_reward and config.algorithm.kl_coef == 0:
        raise ValueError("algorithm.kl_in_reward is set but algorithm.kl_coef is 0")
    decide_bypass_mode(config)
