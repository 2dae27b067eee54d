"""Another process reaches a service through the gateway, with the router's failover (real Monarch actors, no vLLM)."""

import asyncio
import os
import signal

import monarch.actor
import pytest
from monarch.actor import this_host

from rl.config.services import ServiceConfig
from rl.services.gateway import open_gateway
from rl.services.replica import local_procs
from rl.services.service import Service, after_run_fault_hook
from tests.support.gateway_actors import Caller, Echo
from tests.support.paths import E2E_CONFIGS

pytestmark = pytest.mark.processes  # Monarch actors in processes of their own


async def test_a_call_through_the_gateway_fails_over_when_its_replica_dies():
    fatal: list[str] = []
    service = Service(
        "echo",
        Echo,
        lambda replica: (),
        replicas=2,
        spawn_procs=local_procs(),
        on_fatal=fatal.append,
        config=ServiceConfig(call_timeout_s=60, probe_interval_s=0.2, start_timeout_s=120),
    )
    previous_hook = monarch.actor.unhandled_fault_hook
    monarch.actor.unhandled_fault_hook = (
        lambda failure: None if service.handle_failure(failure) else previous_hook(failure)
    )
    caller_procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        await service.start()
        gateway = open_gateway({"echo": service})
        caller = caller_procs.spawn("caller", Caller)
        pids = {index: service.replicas[index].pid for index in service.healthy}
        first_pid, answer = await caller.ask.call_one(gateway.actor, 1)
        assert answer == 1 and first_pid in pids.values()
        os.kill(first_pid, signal.SIGKILL)
        answers = await asyncio.wait_for(
            asyncio.gather(*(caller.ask.call_one(gateway.actor, x) for x in range(2, 6))), 120
        )
        assert [x for _, x in answers] == [2, 3, 4, 5] and first_pid not in {pid for pid, _ in answers}
        while service.replacing or service.restarts == 0:
            await asyncio.sleep(0.1)
        assert service.restarts == 1 and len(service.healthy) == 2 and not fatal
        gateway.close()
    finally:
        await service.stop()
        await caller_procs.stop()
        # late reports of the killed replica
        monarch.actor.unhandled_fault_hook = after_run_fault_hook([service], previous_hook)


async def test_a_judge_in_a_reward_actor_grades_through_the_gateway_to_the_frozen_models_service():
    from actors.reward import RewardActor
    from rl.config import load_config
    from rollouts.types import Rollout, RolloutGroup, RolloutStatus, RolloutTurn
    from tests.support.gateway_actors import FakeJudgeModel

    config = load_config(E2E_CONFIGS / "tiny_qwen3_tasks_e2e.toml")  # sum_digits is graded by `judge` on model "judge"
    service = Service(
        "frozen_judge",
        FakeJudgeModel,
        lambda replica: (),
        replicas=1,
        spawn_procs=local_procs(),
        on_fatal=print,
        config=ServiceConfig(start_timeout_s=120),
    )
    reward_procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        await service.start()
        gateway = open_gateway({"judge": service})  # keyed by model name, as the controller opens it
        model_paths = {name: model.path for name, model in config.models.items()}
        reward = reward_procs.spawn(
            "reward",
            RewardActor,
            config.tasks,
            config.run.reward_concurrency,
            model_paths,
            config.generator.eval_sampling,
        )
        await reward.connect_models.call_one(gateway.actor, ["judge"])
        turn = RolloutTurn(
            prompt_messages=[{"role": "user", "content": "What is the sum of the digits of 17?"}],
            prompt_token_ids=[1, 2],
            completion_token_ids=[3],
            completion_logprobs=[-0.5],
            policy_version=0,
        )
        rollout = Rollout(
            rollout_id="r/0",
            group_id="r",
            task_name="sum_digits",
            sample_index=0,
            turns=[turn],
            status=RolloutStatus.COMPLETED,
        )
        group = RolloutGroup(
            group_id="r", task_name="sum_digits", example={"number": 17, "answer": 8}, rollouts=[rollout]
        )
        [scored] = (await reward.score_group.call_one(group)).rollouts
        assert scored.error is None and scored.reward_components == {"judge": 5 / 32}  # "Hello": judge_reply_length
        assert service.router.served == [1]
        gateway.close()
    finally:
        await reward_procs.stop()
        await service.stop()
