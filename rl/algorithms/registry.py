"""The algorithm classes by `algorithm.type` (a registered name, or a user's class by import path), and the one
place a task's algorithm object is built; and the config check that needs the classes (`check_algorithms`, run by
`rl.loop.resolve`)."""

from __future__ import annotations

from typing import Any

from rl.algorithms.base import Algorithm, PromptLogprobsFn
from rl.algorithms.distillation import OPD, OPSD, SFT
from rl.algorithms.echo import Echo
from rl.algorithms.policy_gradient import GRPO, RLOO, Custom, MaxRL, RawReward, ReinforcePP
from rl.components import import_object
from rl.config.algorithm import AlgorithmConfig, task_algorithm_key

ALGORITHMS: dict[str, type[Algorithm]] = {
    "grpo": GRPO,
    "rloo": RLOO,
    "max_rl": MaxRL,
    "reinforce_pp": ReinforcePP,
    "reward": RawReward,
    "custom": Custom,
    "echo": Echo,
    "sft": SFT,
    "opd": OPD,
    "opsd": OPSD,
}


def algorithm_class(name: str) -> type[Algorithm]:
    """The class of a registered algorithm, or of `package.module:Class` (a user's `Algorithm` subclass)."""
    if name not in ALGORITHMS and ":" not in name:
        raise ValueError(
            f"{name!r} is neither a registered algorithm {list(ALGORITHMS)} nor an import path "
            "'package.module:Class' of an rl.algorithms.base.Algorithm subclass"
        )
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
    """Each task's resolved algorithm is a known class that accepts its config (its class's `check`); errors name the key."""
    for index, task in enumerate(config.tasks):
        algorithm = config.algorithm.for_task(task.algorithm)
        where = task_algorithm_key(index, task.algorithm)
        try:
            cls = algorithm_class(algorithm.type)
        except ValueError as exc:
            raise ValueError(f"{where}.type: {exc}") from None
        cls.check(algorithm, where, config.algorithm.group_size)
