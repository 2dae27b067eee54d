"""Rewards: `Rubric` and `RewardFn`, the built-in reward functions, and the judge (a frozen model as a reward).

Kept empty of imports."""
