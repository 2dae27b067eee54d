"""The services of a run: the policy generators and the reward actors (frozen models: `rl.loop.frozen_models`)."""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from rl.config import Config
from rl.services.replica import SpawnProcs
from rl.services.service import Service


def generator_service(
    config: Config, stop_token_ids: list[int], *, on_fatal: Callable[[str], None], load_policy: Callable[[Any], Awaitable[None]],
    spawn_procs: SpawnProcs,
) -> Service:
    """`generator.num_replicas` Generators; `load_policy(actor)` gives a replacement the current weights.

    `spawn_procs(index)` starts replica `index`'s process where it belongs (`rl.processes.cluster.Placement.replica_procs`).
    """
    from actors.generator import Generator

    return Service(
        "generator", Generator, lambda replica: (config, stop_token_ids, replica), replicas=config.generator.num_replicas,
        config=config.services.generator, spawn_procs=spawn_procs, on_fatal=on_fatal, prepare=load_policy, release="shutdown",
    )


def reward_service(
    config: Config, *, on_fatal: Callable[[str], None], prepare: Callable[[Any], Awaitable[None]], spawn_procs: SpawnProcs
) -> Service:
    """`services.reward.replicas` RewardActors; `prepare(actor)` connects a replacement to the frozen models."""
    from actors.reward import RewardActor

    return Service(
        "reward", RewardActor, lambda replica: (config, replica), replicas=config.services.reward.replicas, config=config.services.reward,
        spawn_procs=spawn_procs, on_fatal=on_fatal, prepare=prepare,
    )
