"""A scored group of a gateway-played task (AgentTask, VerifiersTask) in-process, its calls answered by a scripted
generator on the tiny Qwen3 tokenizer."""

from rollouts.fanout import RolloutContext, rollout_group
from rollouts.renderer_env import RendererEnvConfig
from rollouts.types import Completion, Rollout
from rubrics.rubric import apply_reward

IM_END = 151645


async def play(task, renderer, tokenizer, group_size=2, max_turns=2, reply=None, generate=None) -> list[Rollout]:
    """A scored group of the first training row; a first call samples "7", a second (after "Check it") "It is 7."
    (every call `reply` when given; `generate` replaces the scripted generator)."""

    async def scripted(request):
        text = reply or ("It is 7." if "Check it" in tokenizer.decode(request.prompt_token_ids) else "7")
        ids = [*tokenizer.encode(text, add_special_tokens=False), IM_END]
        return Completion(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop", policy_version=7)

    generate = generate or scripted
    env = RendererEnvConfig(max_turns=max_turns, max_new_tokens=16, max_total_tokens=256, max_prompt_tokens=200)

    def context(index):
        return RolloutContext("train/row=0", index, "agent", task, renderer, env, generate, run_seed=1)

    row = task.load_dataset("train")[0]
    group = await rollout_group("train/row=0", "agent", row, group_size, task.rollout_fn(), context)
    for rollout, reward in zip(group.rollouts, await task.score_group(group.rollouts, row)):
        apply_reward(rollout, reward)
    return group.rollouts
