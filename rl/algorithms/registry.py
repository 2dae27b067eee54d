"""The algorithm classes by `algorithm.type`, and the one place a task's algorithm object is built."""

from __future__ import annotations

from typing import Any

from rl.algorithms.base import Algorithm, PromptLogprobsFn
from rl.algorithms.config import AlgorithmConfig
from rl.algorithms.distillation import OPD, OPSD, SFT
from rl.algorithms.echo import Echo
from rl.algorithms.policy_gradient import GRPO, RLOO, Custom, MaxRL, ReinforcePP, Reward

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


def build_algorithm(
    config: AlgorithmConfig, task: str, renderer: Any = None, prompt_logprobs: PromptLogprobsFn | None = None
) -> Algorithm:
    """Task `task`'s algorithm object from its resolved config."""
    return ALGORITHMS[config.type](config, task, renderer, prompt_logprobs)
