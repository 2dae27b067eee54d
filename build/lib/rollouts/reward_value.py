"""Checking a reward where it enters the run: a real number, finite in float32, within a bound.

Advantages and the loss are computed in float32, so a reward finite in float64 (`1e39`) still
turns a whole group's advantages into NaN; a bound well inside float32 also keeps a group's
variance finite. numpy scalars are real numbers and are accepted.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

MAX_ABS_REWARD = 1e6
"""Default bound on |reward| (a rubric's `max_abs_reward` changes it)."""


class InvalidReward(ValueError):
    """A reward value that is not a real number, not finite, or out of bounds."""


def checked_reward(value: Any, source: str, max_abs: float = MAX_ABS_REWARD) -> float:
    """`value` as a float, or `InvalidReward` naming `source` (the function or environment that returned it)."""
    if not isinstance(value, numbers.Real):
        raise InvalidReward(f"{source} returned {_short(value)} ({type(value).__name__}), not a number")
    try:
        number = float(value)
    except OverflowError:
        raise InvalidReward(f"{source} returned {_short(value)}, too large for a float") from None
    if not math.isfinite(number) or abs(number) > max_abs:
        raise InvalidReward(
            f"{source} returned {_short(value)}, outside the allowed rewards [-{max_abs:g}, {max_abs:g}]"
        )
    return number


def _short(value: Any) -> str:
    text = (
        repr(value)
        if not isinstance(value, int) or value.bit_length() < 256
        else f"an integer of {value.bit_length()} bits"
    )
    return text if len(text) <= 80 else text[:77] + "..."
