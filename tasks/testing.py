"""Running a task's rollouts on a real (small) model in-process, for task tests.

`transformers_generate` samples with a transformers model on CPU: no vLLM, no actors, so a
task package's test runs its environment, renderer round trips and rubric on genuine model
output in seconds. `run_task` drives a row's rollouts through the same `collect_groups` and
`Task.score_group` the trainer uses.
"""

from __future__ import annotations

import asyncio
from typing import Any

from env_types.renderer_env import Completion, GenerationRequest, RendererEnvConfig
from rl.assets import resolve_model_path
from rl.renderer import RendererConfig, stop_token_ids
from rollouts.runner import GenerateFn, GroupSpec, collect_groups
from rollouts.types import RolloutGroup
from rubrics.rubric import apply_reward
from tasks.task import Task


def transformers_generate(model_path: str, renderer: Any, *, temperature: float = 1.0, seed: int = 0) -> GenerateFn:
    """A `GenerateFn` sampling each request with a transformers model (one at a time, CPU)."""
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
                token = int(torch.multinomial(log_probs.exp(), 1, generator=generator)) if temperature > 0 else int(logits.argmax())
                ids.append(token)
                logprobs.append(float(log_probs[token]))
                if token in stops:
                    finish_reason = "stop"
                    break
        return Completion(token_ids=ids[len(request.prompt_token_ids) :], logprobs=logprobs, finish_reason=finish_reason, policy_version=0)

    async def generate(requests: list[GenerationRequest]) -> list[Completion | str]:
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
    """`group_size` rollouts of every row on `model_path`, scored by `task.score_group` (rubric: `build_rubric()` if unset)."""
    built_renderer = RendererConfig(name=renderer).build(model_path)
    if not hasattr(task, "rubric"):
        task.rubric = task.build_rubric()
    specs = [GroupSpec(group_id=f"test/{index}", task_name=type(task).__name__, task=task, example=row, renderer=built_renderer, env_config=env)
             for index, row in enumerate(rows)]
    groups = await collect_groups(specs, group_size, transformers_generate(model_path, built_renderer))
    for group in groups:
        rewards = await task.score_group(group.rollouts, group.example)
        for rollout, reward in zip(group.rollouts, rewards):
            apply_reward(rollout, reward)
    return groups
