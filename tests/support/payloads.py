"""Module-level functions the adversarial tests hand to rubrics and rollout functions (picklable, so they
take the same path as a config's reward functions)."""

from __future__ import annotations

import numpy as np


def huge_float(rollout, example) -> float:
    return 1e39


def huge_int(rollout, example) -> int:
    return 10**400


def numpy_reward(rollout, example) -> np.float32:
    return np.float32(0.5)


def one(rollout, example) -> float:
    return 1.0
