import math

import pytest

from rl.config.roles import TrainerConfig
from rl.training.schedule import lr_lambda


@pytest.mark.parametrize(
    "schedule, expected",
    [
        # warmup 2 over 6 steps: (step + 1) / 3 for steps 0, 1; then the schedule over the 4 remaining steps
        ("constant", [1 / 3, 2 / 3, 1.0, 1.0, 1.0, 1.0, 1.0]),
        ("linear", [1 / 3, 2 / 3, 1.0, 0.75, 0.5, 0.25, 0.0]),
        (
            "cosine",
            [1 / 3, 2 / 3, 1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5, 0.5 * (1 + math.cos(3 * math.pi / 4)), 0.0],
        ),
    ],
)
def test_lr_multiplier_per_step(schedule, expected):
    multiplier = lr_lambda(TrainerConfig(lr_schedule=schedule, warmup_steps=2), total_steps=6)
    assert [multiplier(step) for step in range(7)] == pytest.approx(expected, abs=1e-12)
