"""One reply that would freeze scoring (`\\boxed{2^{2^{40}}}` held the RewardActor's event loop 33 s past a 3 s
rubric timeout; `\\boxed{10^{10^{8}}}` over 90 s) against the real RewardActor in its own process: the
rollout becomes TIMEOUT at the rubric's deadline, and the replica's health probe answers meanwhile."""

import asyncio
import time

import pytest
from monarch.actor import this_host

from actors.reward import RewardActor
from rl.config import Config
from rollouts.types import Rollout, RolloutGroup, RolloutStatus, RolloutTurn

pytestmark = pytest.mark.e2e


def rollout(text: str, index: int) -> Rollout:
    turn = RolloutTurn(prompt_messages=[{"role": "user", "content": "2 + 2?"}], prompt_token_ids=[1], completion_token_ids=[2],
                       completion_logprobs=[-0.5], assistant_message={"role": "assistant", "content": text})
    return Rollout(rollout_id=f"g/{index}", group_id="g", task_name="arithmetic_retry", sample_index=index, turns=[turn],
                   status=RolloutStatus.COMPLETED)


async def test_a_poison_reply_times_out_while_the_reward_actor_stays_responsive():
    config = Config.model_validate({
        "model": {"path": "tiny-qwen3"},
        "tasks": [{"name": "arithmetic_retry", "rubric": {"reward_fns": [{"fn": "math_verify"}], "timeout_s": 3.0}}],
    })
    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        actor = procs.spawn("reward", RewardActor, config)
        await actor.ping.call_one()
        group = RolloutGroup(group_id="g", task_name="arithmetic_retry", example={"question": "2 + 2?", "answer": "4"}, rollouts=[
            rollout(r"\boxed{2^{2^{40}}}", 0), rollout(r"\boxed{10^{10^{8}}}", 1), rollout(r"\boxed{4}", 2)])
        scoring = asyncio.ensure_future(actor.score_group.call_one(group))
        await asyncio.sleep(1.0)  # the workers are busy with the poison replies now
        probes = []
        for _ in range(3):
            start = time.monotonic()
            await asyncio.wait_for(actor.ping.call_one(), 60)
            probes.append(time.monotonic() - start)
        scored = await asyncio.wait_for(scoring, 120)
    finally:
        await procs.stop()
    assert [r.status for r in scored.rollouts] == [RolloutStatus.TIMEOUT, RolloutStatus.TIMEOUT, RolloutStatus.COMPLETED]
    assert "took longer than 3.0 s" in scored.rollouts[0].error and scored.rollouts[2].reward == 1.0
    assert not scoring.cancelled() and len(probes) == 3  # every probe answered while the group was being scored
