"""The trainer's learning-rate schedule (free of Monarch: a trainer rank run without actors uses it too)."""

from __future__ import annotations

import math

from rl.config.roles import TrainerConfig


def lr_lambda(trainer_config: TrainerConfig, total_steps: int):
    """Multiplier of the base LR at each optimizer step: linear warmup, then the schedule."""

    def multiplier(step: int) -> float:
        if step < trainer_config.warmup_steps:
            return (step + 1) / (trainer_config.warmup_steps + 1)
        if trainer_config.lr_schedule == "constant":
            return 1.0
        progress = min(1.0, (step - trainer_config.warmup_steps) / max(1, total_steps - trainer_config.warmup_steps))
        if trainer_config.lr_schedule == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return multiplier
