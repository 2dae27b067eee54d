"""A reward function that fails on some rows (a flaky reward: ValueError, nan, the string "1.0"): every
failed rollout is an ERROR with its exception text, counted, logged to rollouts.jsonl and the sample logs though
its group is dropped, and named on the console; the run's end says what share of groups failed.

The controller's own producer and step run on 30 rows; generation is replaced by fixed token ids, scoring is the
task's real rubric (worker processes included) and the trainer by the sample building a step does before it."""

import asyncio
import json
from pathlib import Path

import pytest

from rl.config import load_config
from rl.loop.controller import Controller
from rl.metrics.reduce import drain_states
from rollouts.types import Rollout, RolloutGroup, RolloutStatus, RolloutTurn
from rubrics.rubric import apply_reward
from tests.support.e2e_rewards import flaky_rows_fail
from tests.support.paths import E2E_CONFIGS

pytestmark = pytest.mark.processes  # reward functions run in worker processes

ROWS, GROUP_SIZE, GROUPS_PER_STEP = 30, 4, 2


def generated_group(row_id: str, task_name: str, row: dict, group_size: int, version: int) -> RolloutGroup:
    """`group_size` finished rollouts whose completions differ in how many token ids are even (so do their rewards)."""
    rollouts = [
        Rollout(
            rollout_id=f"{row_id}/{index}",
            group_id=row_id,
            task_name=task_name,
            sample_index=index,
            status=RolloutStatus.COMPLETED,
            turns=[
                RolloutTurn(
                    prompt_messages=[{"role": "user", "content": row["prompt"]}],
                    prompt_token_ids=[1, 2],
                    completion_token_ids=[2 * index, 2 * index + 1, 2 * index + (index % 2) + 1],
                    completion_logprobs=[-0.5] * 3,
                    assistant_message={"role": "assistant", "content": str(index)},
                    policy_version=version,
                )
            ],
        )
        for index in range(group_size)
    ]
    return RolloutGroup(group_id=row_id, task_name=task_name, example=row, rollouts=rollouts)


async def test_a_flaky_reward_shows_every_failure(tmp_path, capsys):
    config = load_config(
        E2E_CONFIGS / "tiny_qwen3_e2e.toml",
        {
            "run.output_dir": str(tmp_path),
            "run.max_rows": str(ROWS),
            "run.steps": "100",
            "run.groups_per_step": str(GROUPS_PER_STEP),
            "algorithm.group_size": str(GROUP_SIZE),
            "tasks.0.rubric.reward_fns": "[{fn = 'tests.support.e2e_rewards:flaky'}]",
            "wandb.enabled": "false",
        },
    )
    controller = Controller(config)
    task = controller.tasks["sum_digits"].task
    rows: dict[str, dict] = {}  # every row the producer drew, by group id

    async def make_scored_group(row_id, task_name, row, group_size, sampling, sampler="policy", rollout_fn=None):
        rows[row_id] = row
        group = generated_group(row_id, task_name, row, group_size, controller.state.policy_version)
        for rollout, reward in zip(group.rollouts, await task.score_group(group.rollouts, row)):
            apply_reward(rollout, reward)  # as the RewardActor does
        return group

    async def train_step(groups):  # what a step does before it calls the trainer
        _samples, metrics = await controller.samples.build(groups)
        controller.state.policy_version += 1
        await controller.admission.set_policy_version(controller.state.policy_version)
        return metrics

    async def no_actor_states(step):
        return []

    controller.scored_groups.make = make_scored_group
    controller.train_step = train_step
    controller.roles.gather_states = no_actor_states
    run_dir = controller._open_run_dir()
    drain_states()
    producer = asyncio.create_task(controller.produce())
    step_metrics = []
    while len(groups := (await controller._next_batch(producer))[0]) == GROUPS_PER_STEP:
        step_metrics.append((await controller._step(groups, [], wait_seconds=0.0))[0])
    await producer
    samples = drain_states().get("reward/samples", {}).get("samples", [])
    controller.logger.log_rollouts(
        controller.state.step + 1, "dropped", controller.generation_stats.drain().dropped_failed
    )
    controller.logger.close()

    failing = sorted(row_id for row_id, row in rows.items() if flaky_rows_fail(row["number"]))
    assert len(rows) == ROWS and 0 < len(failing) < ROWS
    logged = [json.loads(line) for line in (Path(run_dir) / "rollouts.jsonl").read_text().splitlines()]
    errors = [record["rollout"] for record in logged if record["rollout"]["status"] == "error"]
    assert sorted({rollout["group_id"] for rollout in errors}) == failing
    assert len(errors) == len(failing) * GROUP_SIZE
    assert {record["kind"] for record in logged if record["rollout"]["status"] == "error"} == {"dropped"}
    texts = {rollouts_error_kind(rollout["error"]) for rollout in errors}
    assert texts == {"ValueError", "nan", "str"}
    assert sum(m["rollouts/status/error"] for m in step_metrics) == len(errors)  # every one of them counted
    assert sum(m["rollouts/dropped_groups"] for m in step_metrics) == len(failing)
    error_samples = [sample for sample in samples if sample["status"] == "error"]
    assert sorted({sample["rollout_id"] for sample in error_samples}) == sorted(r["rollout_id"] for r in errors)
    assert all(sample["error"] and sample["episode_id"] is None for sample in error_samples)
    err = capsys.readouterr().err
    step_lines = [line for line in err.splitlines() if "rollouts failed and were not trained on" in line]
    assert len(step_lines) == sum(m["rollouts/status/error"] > 0 for m in step_metrics) > 0
    assert "reward function 'flaky'" in step_lines[0]
    share = f"{len(failing)} of {ROWS} groups ({len(failing) / ROWS:.0%}) failed"
    assert share in controller.group_failures.summary()


def rollouts_error_kind(error: str) -> str:
    """Which of the flaky reward's three failures an error text reports (it names the function each time)."""
    assert error.startswith("reward function 'flaky' ")
    if "raised: ValueError: cannot grade number" in error:
        return "ValueError"
    if "returned nan" in error:
        return "nan"
    if "returned '1.0' (str), not a number" in error:
        return "str"
    raise AssertionError(error)
