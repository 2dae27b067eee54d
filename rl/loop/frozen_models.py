"""Frozen models (`[models.<name>]`): teachers and samplers served by their own, never-updated Generators.

The controller calls this module for three things: spawning each model's service (`rl.services`,
`services.models` sets its deadlines and restarts), the logprobs a teacher gives to token sequences
(vLLM's prompt-logprob path; "policy" goes to the live generators, for opsd), and a generate
function for tasks whose `sampler` is a frozen model. Frozen models must share the policy's
tokenizer: sequences are passed as token ids.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from actors.generator import Generator
from rl.algorithms.config import POLICY, AlgorithmConfig, FrozenModelConfig
from rl.config import Config, ModelConfig, SamplingConfig
from rl.processes.cluster import Placement
from rl.services.service import Service
from rollouts.types import RolloutGroup


def frozen_config(config: Config, model: FrozenModelConfig) -> Config:
    """The run config as a frozen model's Generator sees it: its own path, dtype, device and replicas."""
    generator = config.generator.model_copy(update={"dtype": model.dtype, "device": model.device, "num_replicas": model.replicas})
    return config.model_copy(update={"model": ModelConfig(path=model.path), "generator": generator})


def task_algorithms(config: Config) -> dict[str, AlgorithmConfig]:
    """Each task's resolved algorithm (`[algorithm]` with the task's override applied)."""
    return {task.name: config.algorithm.for_task(task.algorithm) for task in config.tasks}


class FrozenModels:
    def __init__(self, config: Config, on_fatal: Callable[[str], None]):
        self.config = config
        self.on_fatal = on_fatal
        self.services: dict[str, Service] = {}

    async def setup(self, stop_token_ids: list[int], placement: Placement) -> None:
        """Start every model's service, its replicas where `[cluster]` places them (`Placement.frozen_procs`)."""
        for name, model in self.config.models.items():
            model_config = frozen_config(self.config, model)
            self.services[name] = Service(
                f"frozen_{name}", Generator, lambda replica, model_config=model_config: (model_config, stop_token_ids, replica),
                replicas=model.replicas, config=self.config.services.models, spawn_procs=placement.frozen_procs(name), on_fatal=self.on_fatal,
                config_key="services.models", release="shutdown",
            )
        await asyncio.gather(*(service.start() for service in self.services.values()))

    @property
    def actors(self) -> dict[str, list[Any]]:
        """Each model's healthy replica actors (for `judge` reward functions in the reward actors)."""
        return {name: service.actors() for name, service in self.services.items()}

    async def prompt_logprobs(self, name: str, sequences: list[list[int]], policy: Service) -> list[list[float]]:
        """Each sequence's per-token logprobs under model `name` ("policy" = the live generators)."""
        service = policy if name == POLICY else self.services[name]
        return list(await asyncio.gather(*(service.call("prompt_logprobs", ids) for ids in sequences)))

    async def generate(self, name: str, requests: list[Any], sampling: SamplingConfig, key: str | None = None) -> list[Any]:
        """Completions from frozen model `name`; the rollouts they make never age for staleness."""
        return await self.services[name].call("generate", requests, sampling, key=key)


def mark_frozen(groups: list[RolloutGroup], sampler: str) -> None:
    """Record who sampled the groups' rollouts (the buffer exempts frozen-sampled groups from staleness)."""
    for group in groups:
        for rollout in group.rollouts:
            rollout.metadata["sampler"] = sampler
