import asyncio
from types import SimpleNamespace

import pytest

from rl.config import load_config
from rl.config.services import ServiceConfig
from rl.loop.controller import Controller
from rl.loop.roles import DeadlineMissed, hosts_line, starting_line
from rl.loop.state import RunState, due_after
from rl.metrics.generation import GenerationStats, batch_metrics
from rl.services.service import Service
from rollouts.types import Rollout, RolloutGroup, RolloutStatus, RolloutTurn
from tests.support.paths import E2E_CONFIGS


def stub_endpoint(coroutine_fn):
    return SimpleNamespace(call_one=coroutine_fn, call=coroutine_fn)


async def test_weight_push_that_hangs_fails_loudly():
    """(A generator that hangs in its reload is replaced instead: tests/unit/rl/services/test_services.py.)"""
    controller = Controller(load_config(E2E_CONFIGS / "tiny_qwen3_e2e.toml", {"run.weight_sync_timeout_s": "0.05"}))

    async def never(version, fingerprint, full):
        await asyncio.sleep(3600)

    controller.roles.generators = Service(
        "generator", object, lambda replica: (), replicas=0, config=ServiceConfig(), spawn_procs=None, on_fatal=print
    )
    controller.roles.trainer = SimpleNamespace(push_weights=stub_endpoint(never))
    with pytest.raises(
        DeadlineMissed,
        match=r"trainer weight push \(policy version 1\) took longer than run.weight_sync_timeout_s=0.05 s; "
        r"resume from the last checkpoint with `rlmesh train --resume RUN_DIR`",
    ):
        await controller.sync_weights(1)
    assert controller.state.policy_version == 0


async def never(*args, **kwargs):
    await asyncio.sleep(3600)


async def test_a_hung_train_step_stops_the_run_at_its_deadline():
    controller = Controller(load_config(E2E_CONFIGS / "tiny_qwen3_e2e.toml", {"trainer.call_timeout_s": "0.05"}))
    controller.roles.trainer = SimpleNamespace(train_step=stub_endpoint(never))
    groups = [scored_group(f"train/row={row}", "sum_digits", {}, 4, 0) for row in range(2)]
    with pytest.raises(
        DeadlineMissed, match=r"trainer train step took longer than trainer.call_timeout_s=0.05 s; resume from the last"
    ):
        await controller.train_step(groups)


async def test_a_trainer_that_does_not_hand_over_its_metric_states_stops_the_run_at_the_deadline():
    controller = Controller(load_config(E2E_CONFIGS / "tiny_qwen3_e2e.toml", {"run.metrics_timeout_s": "0.05"}))
    controller.roles.trainer = SimpleNamespace(metric_states=stub_endpoint(never))
    controller.roles.reward = Service(
        "reward", object, lambda replica: (), replicas=0, config=ServiceConfig(), spawn_procs=None, on_fatal=print
    )
    with pytest.raises(
        DeadlineMissed, match=r"gathering the trainer's metric states took longer than run.metrics_timeout_s=0.05 s"
    ):
        await controller.roles.gather_states(1)


def test_run_state_data_cursor_advances_over_consumed_rows_in_any_order():
    state = RunState()
    state.mark_rows_done([1, 3])
    assert (state.data_cursor, state.rows_done_ahead) == (0, [1, 3])
    state.mark_rows_done([0])
    assert (state.data_cursor, state.rows_done_ahead) == (2, [3])
    state.mark_rows_done([2, 4])
    assert (state.data_cursor, state.rows_done_ahead) == (5, [])


def scored_group(row_id: str, task_name: str, row: dict, group_size: int, version: int) -> RolloutGroup:
    rollouts = []
    for index in range(group_size):
        turn = RolloutTurn(
            prompt_messages=[],
            prompt_token_ids=[1, 2],
            completion_token_ids=[3],
            completion_logprobs=[-0.5],
            policy_version=version,
        )
        rollouts.append(
            Rollout(
                rollout_id=f"{row_id}/{index}",
                group_id=row_id,
                task_name=task_name,
                sample_index=index,
                turns=[turn],
                status=RolloutStatus.COMPLETED,
                reward=float(index == 0),
            )
        )
    return RolloutGroup(group_id=row_id, task_name=task_name, example=row, rollouts=rollouts)


async def test_the_run_ends_when_the_data_runs_out():
    """7 rows, 2 per step, 1 of them dropped: the producer admits by row, the consumer gets 2 full batches, then the end."""
    controller = Controller(
        load_config(
            E2E_CONFIGS / "tiny_qwen3_e2e.toml",
            {
                "run.max_rows": "7",
                "run.steps": "10",
                "run.max_policy_staleness": "1",
                "algorithm.drop_constant_reward_groups": "true",
            },
        )
    )
    assert controller.planned_steps == 3 and controller.stream.limit == 7  # the LR schedule is sized for 3 steps
    dropped = []

    async def make_scored_group(row_id, task_name, row, group_size, sampling, sampler="policy", rollout_fn=None):
        await asyncio.sleep(0)
        group = scored_group(row_id, task_name, row, group_size, controller.state.policy_version)
        if row_id.endswith("=1"):  # the second row's rewards are constant: nothing to learn, its slot is reused
            dropped.append(row_id)
            for rollout in group.rollouts:
                rollout.reward = 1.0
        return group

    controller.scored_groups.make = make_scored_group
    producer = asyncio.create_task(controller.produce())
    batches = []
    while True:
        groups, evicted = await controller._next_batch(producer)
        if len(groups) < 2:
            break
        batches.append([group.group_id for group in groups])
        controller.state.policy_version += 1
        await controller.admission.set_policy_version(controller.state.policy_version)
    await producer
    assert dropped == ["train/row=1"] and evicted == []
    assert batches == [["train/row=0", "train/row=2"], ["train/row=3", "train/row=4"], ["train/row=5", "train/row=6"]]
    assert controller.stream.next() is None and groups == []


def test_version_offsets_count_only_policy_sampled_rollouts():
    # policy version 3; a policy group sampled at version 2 (offset 1) and a frozen model's group (version 0, which
    # would read as offset 3): the frozen one is not the policy's, so mean 1 and max 1 (before: mean 2, max 3).
    controller = Controller(load_config(E2E_CONFIGS / "tiny_qwen3_e2e.toml"))
    controller.state.policy_version = 3
    policy = scored_group("train/row=0", "sum_digits", {}, 2, version=2)
    frozen = scored_group("train/row=1", "sum_digits", {}, 2, version=0)
    for rollout in frozen.rollouts:
        rollout.metadata["sampler"] = "teacher"
    metrics = batch_metrics(
        [policy, frozen],
        evicted=[],
        stats=GenerationStats(),
        policy_version=controller.state.policy_version,
        wait_seconds=0.0,
    )
    assert metrics["async/version_offset_mean"] == 1.0 and metrics["async/version_offset_max"] == 1


def test_eval_and_checkpoint_fall_due_on_their_schedule_and_once_more_at_the_run_end():
    """(eval due, checkpoint due) after a step, worked out by hand for `eval_every = 7`, a checkpoint every 5 steps and
    14 planned steps; when the data runs out the run ends with whichever of the two the last step did not just do."""
    config = load_config(E2E_CONFIGS / "tiny_qwen3_e2e.toml", {"run.eval_every": "7", "checkpoint.every_steps": "5"})
    after_step = {3: (False, None), 5: (False, "full"), 7: (True, None), 10: (False, "full"), 14: (True, "full")}
    assert {step: due_after(step, 14, config, data_ran_out=False) for step in after_step} == after_step
    data_ran_out_at = {0: (False, None), 5: (True, None), 7: (False, "full"), 9: (True, "full")}
    assert {step: due_after(step, 14, config, data_ran_out=True) for step in data_ran_out_at} == data_ran_out_at
    no_schedule = load_config(
        E2E_CONFIGS / "tiny_qwen3_e2e.toml", {"run.eval_every": "0", "checkpoint.every_steps": "0"}
    )
    assert due_after(14, 14, no_schedule, data_ran_out=False) == (False, "full")  # the default final checkpoint
    assert due_after(6, 14, no_schedule, data_ran_out=True) == (False, "full")


@pytest.mark.parametrize("final", ["weights", "none"])
def test_the_final_checkpoint_is_the_kind_checkpoint_final_asks_for_and_regular_ones_stay_full(final):
    config = load_config(
        E2E_CONFIGS / "tiny_qwen3_e2e.toml", {"checkpoint.every_steps": "5", "checkpoint.final": final}
    )
    end = None if final == "none" else final
    assert due_after(14, 14, config, data_ran_out=False)[1] == end
    assert due_after(15, 15, config, data_ran_out=False)[1] == "full"  # a regular one falls on the last step
    assert due_after(10, 14, config, data_ran_out=False)[1] == "full"
    assert due_after(7, 14, config, data_ran_out=True)[1] == end  # the data ran out after step 7
    assert due_after(10, 14, config, data_ran_out=True)[1] is None  # step 10 was just checkpointed in full


def test_the_console_names_what_starts_while_the_actors_start():
    config = load_config(E2E_CONFIGS / "tiny_qwen3_e2e.toml")
    assert starting_line(config) == (
        "starting the trainer (1 process(es): loading tiny-qwen3), 1 vLLM generator(s) (tiny-qwen3, cpu), "
        "1 reward replica(s)"
    )
    assert starting_line(config, trainer=False) == "starting 1 vLLM generator(s) (tiny-qwen3, cpu), 1 reward replica(s)"


def test_a_run_on_allocated_hosts_names_the_host_of_every_rank_and_replica():
    line = hosts_line(["node1", "node2"], {"generator": ["node3", "node3"], "reward": ["login"], "frozen_judge": []})
    assert line == "on hosts: trainer ranks on node1, node2; generator on node3, node3; reward on login"
    assert hosts_line([], {"generator": ["node3"]}) == "on hosts: generator on node3"  # `rlmesh eval`: no trainer
