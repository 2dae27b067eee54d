import asyncio

from rl.algorithms.samples import SampleBuilder, rollout_to_samples
from rl.config.algorithm import AlgorithmConfig
from rollouts.types import Rollout, RolloutGroup, RolloutStatus, RolloutTurn


def group_to_samples(group, normalize_std, drop_constant_reward, **fields):
    algorithm = AlgorithmConfig(
        normalize_advantage_std=normalize_std, drop_constant_reward_groups=drop_constant_reward, **fields
    )
    samples, _metrics = asyncio.run(SampleBuilder({"t": algorithm}, {}, None).build([group]))
    return samples


def turn(prompt, completion, logprobs, version=0):
    return RolloutTurn(
        prompt_messages=[],
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        completion_logprobs=logprobs,
        policy_version=version,
    )


def rollout(index, reward, status=RolloutStatus.COMPLETED, turns=None):
    return Rollout(
        rollout_id=f"g/{index}",
        group_id="g",
        task_name="t",
        sample_index=index,
        status=status,
        reward=reward,
        turns=turns if turns is not None else [turn([1, 2], [3, 4], [-0.5, -0.25])],
    )


def test_bridged_multi_turn_rollout_is_one_sample_with_completion_mask():
    multi = rollout(
        0, 1.0, turns=[turn([1, 2], [3, 4], [-0.5, -0.25], version=2), turn([1, 2, 3, 4, 5, 6], [7], [-1.5], version=3)]
    )
    [sample] = rollout_to_samples(multi, advantage=0.5)
    assert sample.input_ids == [1, 2, 3, 4, 5, 6, 7]
    assert sample.loss_mask == [False, False, True, True, False, False, True]
    assert sample.sampling_logprobs == [0.0, 0.0, -0.5, -0.25, 0.0, 0.0, -1.5]
    assert sample.advantages == [0.5] * 7 and sample.policy_version == 2


def test_broken_prefix_starts_a_new_sample():
    rerendered = rollout(0, 1.0, turns=[turn([1, 2], [3, 4], [-0.5, -0.25]), turn([1, 9, 9, 5], [7], [-1.5])])
    first, second = rollout_to_samples(rerendered, advantage=-1.0)
    assert first.input_ids == [1, 2, 3, 4] and second.input_ids == [1, 9, 9, 5, 7]
    assert second.loss_mask == [False, False, False, False, True]


def test_a_broken_prefix_is_counted_in_the_step_record_and_shown_on_its_line(capsys):
    """Environment rollouts (no gateway): one whose re-render broke the prefix counts 1 new sample, a bridged one 0;
    the console's step line names the count only when it is not 0."""
    from rl.metrics.backends import ConsoleBackend
    from rl.metrics.generation import GenerationStats, batch_metrics

    rerendered = rollout(0, 1.0, turns=[turn([1, 2], [3, 4], [-0.5, -0.25]), turn([1, 9, 9, 5], [7], [-1.5])])
    bridged = rollout(1, 0.0, turns=[turn([1, 2], [3, 4], [-0.5, -0.25]), turn([1, 2, 3, 4, 5], [7], [-1.5])])
    group = RolloutGroup(group_id="g", task_name="t", example={}, rollouts=[rerendered, bridged])
    metrics = batch_metrics([group], evicted=[], stats=GenerationStats(), policy_version=0, wait_seconds=0.0)
    assert metrics["rollouts/new_samples"] == 1 and metrics["rollouts/gateway_new_samples"] == 0
    ConsoleBackend().log({"policy_version": 0, "loss": 0.5, "rollouts/new_samples": 1}, 1)
    ConsoleBackend().log({"policy_version": 1, "loss": 0.5, "rollouts/new_samples": 0}, 2)
    assert capsys.readouterr().out.splitlines() == [
        "step    1 v0 loss=0.5 rollouts/new_samples=1",
        "step    2 v1 loss=0.5",
    ]


def test_group_advantages_exclude_failed_rollouts():
    group = RolloutGroup(
        group_id="g",
        task_name="t",
        example={},
        rollouts=[
            rollout(0, 1.0),
            rollout(1, 0.0),
            rollout(2, 0.0, status=RolloutStatus.ERROR),
            rollout(3, 0.5, status=RolloutStatus.TRUNCATED),
        ],
    )
    samples = group_to_samples(group, normalize_std=False, drop_constant_reward=False)
    # baseline over rewards [1, 0, 0.5] = 0.5
    assert [sample.advantages[-1] for sample in samples] == [0.5, -0.5, 0.0]


def test_constant_reward_group_dropped_only_when_asked():
    group = RolloutGroup(group_id="g", task_name="t", example={}, rollouts=[rollout(0, 1.0), rollout(1, 1.0)])
    assert group_to_samples(group, normalize_std=False, drop_constant_reward=True) == []
    assert [s.advantages[-1] for s in group_to_samples(group, normalize_std=True, drop_constant_reward=False)] == [
        0.0,
        0.0,
    ]


def test_group_with_fewer_than_two_trainable_rollouts_is_dropped():
    group = RolloutGroup(
        group_id="g",
        task_name="t",
        example={},
        rollouts=[rollout(0, 1.0), rollout(1, 0.0, status=RolloutStatus.TIMEOUT)],
    )
    assert group_to_samples(group, normalize_std=False, drop_constant_reward=False) == []
