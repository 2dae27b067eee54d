"""Running a task's rollouts in-process, for task tests: one sample at a time, on any generate function.

`play_group` drives each sample's environment turn by turn through a `RendererEnv` (as the
trainer's rollout loop does) and scores the group with `Task.score_group`; `transformers_generate`
samples with a transformers model on CPU (no vLLM, no actors), so `run_task` runs a task on a
genuine small model in seconds.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable
from typing import Any

from env_types.renderer import build_renderer, stop_token_ids
from rl.assets import resolve_model_path
from rl.config.tasks import RendererConfig, RendererEnvConfig
from rollouts.renderer_env import RendererEnv
from rollouts.types import Completion, GenerationFailed, GenerationRequest, Rollout, RolloutGroup, RolloutStatus
from rubrics.rubric import apply_reward
from tasks.task import Task

BatchGenerate = Callable[[list[GenerationRequest]], Awaitable[list["Completion | GenerationFailed"]]]
"""One completion per request, or a `GenerationFailed` for a request that failed."""


async def play(
    task: Task,
    row: dict[str, Any],
    renderer: Any,
    env_config: RendererEnvConfig,
    generate: BatchGenerate,
    *,
    rollout_id: str = "test/0",
    sample_index: int = 0,
) -> Rollout:
    """One rollout of `row`, its environment run to a terminal status."""
    group_id = rollout_id.rpartition("/")[0]
    rollout = Rollout(
        rollout_id=rollout_id, group_id=group_id, task_name=type(task).__name__, sample_index=sample_index
    )
    env = RendererEnv(task.make_env(copy.deepcopy(row)), renderer, env_config, rollout)
    request = await env.start()
    while request is not None:
        [completion] = await generate([request])
        if isinstance(completion, GenerationFailed):
            await env.abort(RolloutStatus.ERROR, str(completion))
            break
        request = await env.step(completion)
    return rollout


async def play_group(
    task: Task,
    row: dict[str, Any],
    renderer: Any,
    env_config: RendererEnvConfig,
    generate: BatchGenerate,
    *,
    group_size: int = 1,
    group_id: str = "test",
) -> RolloutGroup:
    """`group_size` rollouts of `row` (one after another), scored by `task.score_group`; rubric `build_rubric()` if unset."""
    if not hasattr(task, "rubric"):
        task.rubric = task.build_rubric()
    rollouts = [
        await play(task, row, renderer, env_config, generate, rollout_id=f"{group_id}/{index}", sample_index=index)
        for index in range(group_size)
    ]
    for rollout, reward in zip(rollouts, await task.score_group(rollouts, row)):
        apply_reward(rollout, reward)
    return RolloutGroup(group_id=group_id, task_name=type(task).__name__, example=row, rollouts=rollouts)


def transformers_generate(model_path: str, renderer: Any, *, temperature: float = 1.0, seed: int = 0) -> BatchGenerate:
    """A `BatchGenerate` sampling each request with a transformers model (one at a time, CPU)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(model_path), dtype=torch.float32).eval()
    stops = stop_token_ids(renderer)
    generator = torch.Generator().manual_seed(seed)

    def sample(request: GenerationRequest) -> Completion:
        ids, logprobs = list(request.prompt_token_ids), []
        finish_reason = "length"
        with torch.no_grad():
            for _ in range(request.max_new_tokens):
                logits = model(torch.tensor([ids])).logits[0, -1].float()  # [V]
                log_probs = torch.log_softmax(logits / max(temperature, 1e-6), dim=-1)
                token = (
                    int(torch.multinomial(log_probs.exp(), 1, generator=generator))
                    if temperature > 0
                    else int(logits.argmax())
                )
                ids.append(token)
                logprobs.append(float(log_probs[token]))
                if token in stops:
                    finish_reason = "stop"
                    break
        return Completion(
            token_ids=ids[len(request.prompt_token_ids) :],
            logprobs=logprobs,
            finish_reason=finish_reason,
            policy_version=0,
        )

    async def generate(requests: list[GenerationRequest]) -> list[Completion | GenerationFailed]:
        return [await asyncio.to_thread(sample, request) for request in requests]

    return generate


async def run_task(
    task: Task,
    rows: list[dict[str, Any]],
    *,
    model_path: str = "tiny-qwen3",
    renderer: str = "auto",
    env: RendererEnvConfig = RendererEnvConfig(max_new_tokens=16),
    group_size: int = 2,
) -> list[RolloutGroup]:
    """`group_size` scored rollouts of every row, sampled from `model_path` with transformers."""
    built_renderer = build_renderer(RendererConfig(name=renderer), model_path)
    generate = transformers_generate(model_path, built_renderer)
    return [
        await play_group(task, row, built_renderer, env, generate, group_size=group_size, group_id=f"test/{index}")
        for index, row in enumerate(rows)
    ]
