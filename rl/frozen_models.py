"""Frozen models (`[models.<name>]`): teachers and samplers served by their own, never-updated Generators.

The controller calls this module for three things: spawning the actors, the logprobs a teacher gives
to token sequences (vLLM's prompt-logprob path; "policy" goes to the live generators, for opsd), and a
generate function for tasks whose `sampler` is a frozen model. Frozen models must share the policy's
tokenizer: sequences are passed as token ids.
"""

from __future__ import annotations

import asyncio
from typing import Any

from monarch.actor import this_host

from actors.generator import Generator
from rl.algorithms.config import POLICY, AlgorithmConfig, FrozenModelConfig
from rl.config import Config, ModelConfig, SamplingConfig
from rollouts.types import RolloutGroup


def frozen_config(config: Config, model: FrozenModelConfig) -> Config:
    """The run config as a frozen model's Generator sees it: its own path, dtype, device and replicas."""
    generator = config.generator.model_copy(update={"dtype": model.dtype, "device": model.device, "num_replicas": model.replicas})
    return config.model_copy(update={"model": ModelConfig(path=model.path), "generator": generator})


def task_algorithms(config: Config) -> dict[str, AlgorithmConfig]:
    """Each task's resolved algorithm (`[algorithm]` with the task's override applied)."""
    return {task.name: config.algorithm.for_task(task.algorithm) for task in config.tasks}


class FrozenModels:
    def __init__(self, config: Config):
        self.config = config
        self.actors: dict[str, Any] = {}
        self.procs: list[Any] = []
        self._next: dict[str, int] = {}

    async def setup(self, stop_token_ids: list[int]) -> None:
        for name, model in self.config.models.items():
            procs = this_host().spawn_procs(per_host={"procs": model.replicas})
            self.procs.append(procs)
            self.actors[name] = procs.spawn(f"frozen_{name}", Generator, frozen_config(self.config, model), stop_token_ids)
            self._next[name] = 0
        await asyncio.gather(*(actor.initialized for actor in self.actors.values()))

    async def stop_engines(self) -> None:
        """Free every frozen engine (as the policy generators are freed) before their processes stop."""
        calls = [asyncio.wait_for(actor.shutdown.call(), 10) for actor in self.actors.values()]
        await asyncio.gather(*calls, return_exceptions=True)

    def take_procs(self) -> list[Any]:
        """The frozen models' process meshes, handed over to be stopped (and forgotten here)."""
        procs, self.procs, self.actors = self.procs, [], {}
        return procs

    def _replica(self, name: str, actors: Any, replicas: int) -> Any:
        index = self._next.get(name, 0)
        self._next[name] = index + 1
        return actors.slice(procs=index % replicas)

    async def prompt_logprobs(self, name: str, sequences: list[list[int]], policy: Any) -> list[list[float]]:
        """Each sequence's per-token logprobs under model `name` ("policy" = the live generators)."""
        if name == POLICY:
            actors, replicas = policy, self.config.generator.num_replicas
        else:
            actors, replicas = self.actors[name], self.config.models[name].replicas
        calls = [self._replica(name, actors, replicas).prompt_logprobs.call_one(ids) for ids in sequences]
        return list(await asyncio.gather(*calls))

    async def generate(self, name: str, requests: list[Any], sampling: SamplingConfig) -> list[Any]:
        """Completions from frozen model `name`; the rollouts they make never age for staleness."""
        replica = self._replica(name, self.actors[name], self.config.models[name].replicas)
        return await replica.generate.call_one(requests, sampling)


def mark_frozen(groups: list[RolloutGroup], sampler: str) -> None:
    """Record who sampled the groups' rollouts (the buffer exempts frozen-sampled groups from staleness)."""
    for group in groups:
        for rollout in group.rollouts:
            rollout.metadata["sampler"] = sampler
