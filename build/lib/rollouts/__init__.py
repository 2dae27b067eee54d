"""Rollouts: the typed records of what happened (`Rollout`, `RolloutGroup`, the generator's wire records),
how one is driven through a renderer (`RendererEnv`) and how a row fans out to `group_size` of them.

Kept empty of imports."""
