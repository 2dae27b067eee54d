"""Advantage types, per-task algorithm bundles and their validation, against hand-computed numbers."""

import asyncio
from pathlib import Path

import pytest
import torch

from rl.algorithms.advantages import max_rl_advantages, rloo_advantages, whiten_across_groups
from rl.algorithms.config import AlgorithmConfig
from rl.algorithms.samples import SampleBuilder
from rl.config import ConfigError, load_config
from env_types.renderer import RendererConfig
from rollouts.types import Rollout, RolloutGroup, RolloutStatus, RolloutTurn


def doubled(rewards, rollouts):
    """A custom advantage function (referenced by import path below)."""
    return [2 * r - len(rollouts) for r in rewards]


def test_rloo_is_reward_minus_the_mean_of_the_others():
    # [1, 0, 0, 1]: 1 - 1/3 = 0.66666667, 0 - 2/3 = -0.66666667
    torch.testing.assert_close(rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0])), torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3]))


def test_max_rl_divides_by_the_pass_rate():
    # mean 0.25: (1 - 0.25) / 0.25 = 3, (0 - 0.25) / 0.25 = -1; no success -> zeros
    torch.testing.assert_close(max_rl_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0])), torch.tensor([3.0, -1.0, -1.0, -1.0]))
    assert max_rl_advantages(torch.tensor([0.0, 0.0])).tolist() == [0.0, 0.0]


def test_reinforce_pp_whitens_across_the_batch():
    # [0.5, -0.5, 1, -1]: mean 0, sample std sqrt(2.5 / 3) = 0.91287093
    out = whiten_across_groups([torch.tensor([0.5, -0.5]), torch.tensor([1.0, -1.0])])
    torch.testing.assert_close(torch.cat(out), torch.tensor([0.5, -0.5, 1.0, -1.0]) / 0.91287093, atol=1e-5, rtol=0)


def _turn(prompt, completion, env_messages=(), version=0):
    return RolloutTurn(prompt_messages=[{"role": "user", "content": "Sum the digits of 47."}], prompt_token_ids=prompt,
                       completion_token_ids=completion, completion_logprobs=[-0.5] * len(completion),
                       env_messages=list(env_messages), policy_version=version)


def _group(task, rewards, example=None, turns=None):
    rollouts = [
        Rollout(rollout_id=f"{task}/{i}", group_id=task, task_name=task, sample_index=i, status=RolloutStatus.COMPLETED,
                reward=r, turns=turns or [_turn([1, 2], [3, 4])])
        for i, r in enumerate(rewards)
    ]
    return RolloutGroup(group_id=task, task_name=task, example=example or {}, rollouts=rollouts)


def _build(algorithms, groups, renderers=None, prompt_logprobs=None):
    return asyncio.run(SampleBuilder(algorithms, renderers or {}, prompt_logprobs).build(groups))


@pytest.mark.parametrize(
    "fields, expected",
    [
        (dict(type="grpo"), [0.5, -0.5, -0.5, 0.5]),
        (dict(type="rloo"), [2 / 3, -2 / 3, -2 / 3, 2 / 3]),
        (dict(type="max_rl"), [1.0, -1.0, -1.0, 1.0]),
        (dict(type="reward"), [1.0, 0.0, 0.0, 1.0]),
        (dict(type="custom", custom_advantage_fn="tests.test_algorithms:doubled"), [-2.0, -4.0, -4.0, -2.0]),
        # one group: centred [0.5, -0.5, -0.5, 0.5], sample std sqrt(1/3) -> +-0.8660254
        (dict(type="reinforce_pp"), [0.8660254, -0.8660254, -0.8660254, 0.8660254]),
    ],
)
def test_advantage_types_on_every_sampled_token(fields, expected):
    samples, _ = _build({"t": AlgorithmConfig(**fields)}, [_group("t", [1.0, 0.0, 0.0, 1.0])])
    assert [s.advantages for s in samples] == [pytest.approx([a] * 4, abs=1e-5) for a in expected]
    assert all(s.rl_weights == [0.0, 0.0, 1.0, 1.0] and s.ce_weights == [0.0] * 4 for s in samples)


def test_one_run_mixes_algorithms_with_per_task_metrics_and_dynamic_sampling():
    algorithms = {"a": AlgorithmConfig(type="grpo", drop_constant_reward_groups=True), "b": AlgorithmConfig(type="reward")}
    groups = [_group("a", [1.0, 0.0]), _group("a", [1.0, 1.0]), _group("b", [0.0, 2.0])]
    samples, metrics = _build(algorithms, groups)
    assert [s.advantages[-1] for s in samples] == [0.5, -0.5, 0.0, 2.0]
    assert metrics["rollouts/dropped_zero_adv_groups"] == 1 and metrics["rollouts/dropped_groups"] == 1
    # task a: advantages [0.5, -0.5, 0, 0] (the constant group counts before it is dropped)
    assert metrics["advantage/a/mean"] == 0 and metrics["advantage/a/frac_zero"] == 0.5
    assert metrics["advantage/a/std"] == pytest.approx(0.35355339)
    assert metrics["advantage/b/mean"] == 1.0 and metrics["advantage/b/frac_zero"] == 0.5


def test_echo_trains_environment_tokens_by_role():
    # turn 1: prompt [1, 2] -> [3, 4], the environment answers as "tool"; turn 2 extends it: env tokens [5, 6]
    turns = [_turn([1, 2], [3, 4], env_messages=[{"role": "tool", "content": "ok"}]), _turn([1, 2, 3, 4, 5, 6], [7])]
    samples, _ = _build({"t": AlgorithmConfig(type="echo", echo_role_weights={"tool": 0.25})}, [_group("t", [1.0, 0.0], turns=turns)])
    assert samples[0].ce_weights == [0.0, 0.0, 0.0, 0.0, 0.25, 0.25, 0.0]
    assert samples[0].rl_weights == [0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0]
    assert samples[0].advantages == [0.5] * 7


def test_opd_routes_sampled_tokens_to_ref_kl_with_teacher_logprobs():
    calls = []

    async def teacher(name, sequences):
        calls.append(name)
        return [[0.0] + [-0.1 * t for t in range(1, len(ids))] for ids in sequences]

    samples, _ = _build({"t": AlgorithmConfig(type="opd", teacher="big")}, [_group("t", [1.0, 1.0])], prompt_logprobs=teacher)
    assert calls == ["big"] and len(samples) == 2
    assert samples[0].ref_kl_weights == [0.0, 0.0, 1.0, 1.0] and samples[0].rl_weights == [0.0] * 4
    assert samples[0].ref_logprobs == pytest.approx([0.0, -0.1, -0.2, -0.3])


def _decode(ids):
    from transformers import AutoTokenizer

    from rl.assets import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path("tiny-qwen3")).decode(ids)


@pytest.fixture(scope="module")
def qwen3_renderer():
    return RendererConfig(name="qwen3").build("tiny-qwen3")


def test_sft_trains_cross_entropy_on_the_dataset_demonstration(qwen3_renderer):
    prompt = qwen3_renderer.render_ids([{"role": "user", "content": "Sum the digits of 47."}], add_generation_prompt=True)
    group = _group("t", [0.0, 0.0], example={"demonstration": "11"}, turns=[_turn(list(prompt), [3, 4])])
    [sample], _ = _build({"t": AlgorithmConfig(type="sft")}, [group], renderers={"t": qwen3_renderer})
    full = qwen3_renderer.render_ids([{"role": "user", "content": "Sum the digits of 47."}, {"role": "assistant", "content": "11"}])
    assert sample.input_ids == list(full)
    trained = [t for t, w in zip(sample.input_ids, sample.ce_weights) if w]
    assert _decode(trained).startswith("11") and sample.ce_weights[-len(trained):] == [1.0] * len(trained)
    assert sum(sample.rl_weights) == 0 and sum(sample.ce_weights) == len(trained)


def test_opsd_scores_the_sampled_tokens_under_the_demonstration_prompt(qwen3_renderer):
    prompt = list(qwen3_renderer.render_ids([{"role": "user", "content": "Sum the digits of 47."}], add_generation_prompt=True))
    seen = []

    async def policy(name, sequences):
        seen.append((name, sequences[0]))
        return [[-float(i) for i in range(len(ids))] for ids in sequences]  # logprob -i at position i

    group = _group("t", [1.0], example={"answer": 11}, turns=[_turn(prompt, [3, 4])])
    [sample], _ = _build({"t": AlgorithmConfig(type="opsd", demo_key="answer")}, [group], {"t": qwen3_renderer}, policy)
    name, teacher_ids = seen[0]
    demo_prompt_len = len(teacher_ids) - 2
    assert name == "policy" and teacher_ids[-2:] == [3, 4] and demo_prompt_len > len(prompt)
    assert "reference: 11" in _decode(teacher_ids)
    assert sample.ref_logprobs[-2:] == [-float(demo_prompt_len), -float(demo_prompt_len + 1)]
    assert sample.ref_kl_weights[-2:] == [1.0, 1.0] and sum(sample.ref_kl_weights) == 2


def _config(**overrides):
    return load_config(None, {"tasks": "[{name = 'sum_digits'}]", **overrides})


def test_task_algorithm_overrides_only_what_it_sets():
    config = _config(**{"algorithm.normalize_advantage_std": "true", "models.teacher.path": "'tiny-qwen3'",
                        "tasks.0.algorithm": "{type = 'opd', teacher = 'teacher'}"})
    resolved = config.algorithm.for_task(config.tasks[0].algorithm)
    assert resolved.type == "opd" and resolved.teacher == "teacher" and resolved.normalize_advantage_std


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"algorithm.group_size": "1"}, r"algorithm.type = 'grpo' is group-relative but algorithm.group_size = 1"),
        ({"algorithm.group_size": "1", "tasks.0.algorithm": "{type = 'rloo'}"}, r"tasks.0.algorithm.type = 'rloo' is group-relative"),
        ({"algorithm.type": "opd"}, r"algorithm.type = 'opd' needs algorithm.teacher"),
        ({"algorithm.type": "opd", "algorithm.teacher": "'policy'"}, r"algorithm.teacher = 'policy' with type 'opd'"),
        ({"algorithm.type": "opd", "algorithm.teacher": "'big'"}, r"algorithm.teacher = 'big' is not a declared model"),
        ({"models.big.path": "'tiny-qwen3'", "algorithm.sampler": "'big'"}, r"algorithm.sampler = 'big' \(a frozen model\) cannot feed algorithm.type = 'grpo'"),
        ({"models.policy.path": "'tiny-qwen3'"}, r"models.policy: the name 'policy' is reserved"),
        ({"models.big.path": "'/no/such/model'"}, r"models.big.path: '/no/such/model' is neither a built-in model"),
        ({"algorithm.type": "custom"}, r"needs algorithm.custom_advantage_fn"),
        ({"algorithm.kl_in_reward": "true"}, r"kl_in_reward is set but algorithm.kl_coef is 0"),
        ({"algorithm.rollout_correction.rollout_rs": "'token'"}, r"algorithm.rollout_correction.*rollout_rs_threshold is not"),
        ({"algorithm.rollout_correction.rollout_is_threshold": "true"}, r"algorithm.rollout_correction.rollout_is_threshold"),
        ({"algorithm.dual_clip_c": "0.5"}, r"algorithm.dual_clip_c"),
    ],
)
def test_bad_algorithm_configs_fail_naming_the_keys(overrides, message):
    with pytest.raises(ConfigError, match=message):
        _config(**overrides)


def test_sft_from_a_frozen_sampler_trains_its_tokens_and_never_goes_stale():
    from rl.loop.buffer import RolloutBuffer
    from rollouts.types import mark_frozen

    group = _group("t", [0.0, 1.0])
    mark_frozen([group], "big")
    samples, _ = _build({"t": AlgorithmConfig(type="sft", sampler="big")}, [group])
    assert [s.ce_weights for s in samples] == [[0.0, 0.0, 1.0, 1.0]] * 2
    assert all(s.rl_weights == [0.0] * 4 and s.loss_mask == [False] * 4 for s in samples)

    async def take():
        buffer = RolloutBuffer(max_staleness=0)
        await buffer.put(group)  # sampled at version 0, trained at version 5: a policy group would be evicted
        return await buffer.get(1, trainer_policy_version=5)

    assert asyncio.run(take()) == ([group], [])  # nothing evicted


def test_the_resolved_config_round_trips():
    import tomllib

    from rl.config import Config, dump_toml

    config = load_config(Path(__file__).resolve().parent.parent / "configs" / "tiny_qwen3_algorithms_e2e.toml")
    assert Config.model_validate(tomllib.loads(dump_toml(config))) == config


def test_task_echo_override_keeps_typed_role_weights():
    config = _config(**{"tasks.0.algorithm": "{type = 'echo', echo_role_weights = {user = 0.5}}"})
    resolved = config.algorithm.for_task(config.tasks[0].algorithm)
    assert resolved.echo_role_weights.model_dump() == {"system": 0.0, "user": 0.5, "assistant": 0.0, "tool": 0.1}
    with pytest.raises(ConfigError, match="echo_role_weights.narrator"):
        _config(**{"algorithm.echo_role_weights.narrator": "1.0"})
