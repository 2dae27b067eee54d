"""A task whose groups all have equal rewards step after step is named once: nothing is learned from it."""

import asyncio

from rl.metrics.signal import SignalWatch
from rollouts.types import Rollout, RolloutGroup, RolloutStatus
from tests.unit.rl.loop.test_interrupt_checkpoint import StubbedRun


def group(task: str, rewards: list[float], failed: int = 0) -> RolloutGroup:
    rollouts = [
        Rollout(rollout_id=f"g/{i}", group_id="g", task_name=task, sample_index=i, reward=reward,
                status=RolloutStatus.COMPLETED)
        for i, reward in enumerate(rewards)
    ]  # fmt: skip
    for rollout in rollouts[:failed]:
        rollout.status = RolloutStatus.ERROR  # left out: a failure is no reward signal either way
    return RolloutGroup(group_id="g", task_name=task, example={}, rollouts=rollouts)


def test_a_task_flat_for_n_steps_is_warned_about_once_and_again_only_after_a_signal():
    warnings: list[str] = []
    watch = SignalWatch(3)
    flat = [group("math", [0.0, 0.0]), group("math", [1.0, 1.0]), group("digits", [1.0, 0.0])]
    for step in (1, 2):
        warnings += watch.observe(step, flat)
    assert warnings == []
    warnings += watch.observe(3, flat)
    [warning] = warnings
    assert warning.startswith("step 3: task 'math' carried no learning signal for 3 steps: within every group all")
    assert "this step's values: 0, 1" in warning
    warnings += watch.observe(4, flat)
    assert len(warnings) == 1  # once
    warnings += watch.observe(5, [group("math", [0.0, 1.0])])  # a signal resets the count
    for step in (6, 7, 8):
        # 0.5 and 0.5 once the failure is left out
        warnings += watch.observe(step, [group("math", [0.0, 0.5, 0.5], failed=1)])
    assert len(warnings) == 2 and warnings[1].startswith("step 8: task 'math'")
    warnings += SignalWatch(0).observe(1, flat)  # 0 = never
    assert len(warnings) == 2


async def test_the_training_loop_warns_when_every_reward_is_the_same(tmp_path, capsys):
    run = StubbedRun(tmp_path)
    controller = run.controller
    controller.progress.signal_watch.steps = 3
    made = controller.scored_groups.make

    async def constant_rewards(*args, **kwargs):
        produced = await made(*args, **kwargs)
        for rollout in produced.rollouts:
            rollout.reward = 0.0  # a reward that never fires
        return produced

    controller.scored_groups.make = constant_rewards
    await asyncio.wait_for(controller.train(), 120)
    err = capsys.readouterr().err
    assert err.count("carried no learning signal") == 1
    assert "step 3: task 'sum_digits' carried no learning signal for 3 steps" in err
