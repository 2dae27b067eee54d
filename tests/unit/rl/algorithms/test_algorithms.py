"""Advantage types, per-task algorithm bundles and their validation, against hand-computed numbers."""

import asyncio

import pytest
import torch

from env_types.renderer import build_renderer
from rl.algorithms.advantages import max_rl_advantages, rloo_advantages, whiten_over_tokens
from rl.algorithms.policy_gradient import GRPO
from rl.algorithms.samples import SampleBuilder
from rl.config import ConfigError, load_config
from rl.config.algorithm import AlgorithmConfig, CreditConfig, TaskAlgorithmConfig
from rl.config.tasks import RendererConfig
from rl.loop.resolve import resolve_config
from rollouts.types import Rollout, RolloutGroup, RolloutStatus, RolloutTurn
from tests.support.paths import E2E_CONFIGS


def doubled(rewards, rollouts):
    """A custom advantage function (referenced by import path below)."""
    return [2 * r - len(rollouts) for r in rewards]


def test_rloo_is_reward_minus_the_mean_of_the_others():
    # [1, 0, 0, 1]: 1 - 1/3 = 0.66666667, 0 - 2/3 = -0.66666667
    torch.testing.assert_close(
        rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0])), torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3])
    )


def test_max_rl_divides_by_the_pass_rate():
    # mean 0.25: (1 - 0.25) / 0.25 = 3, (0 - 0.25) / 0.25 = -1; no success -> zeros
    torch.testing.assert_close(
        max_rl_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0])), torch.tensor([3.0, -1.0, -1.0, -1.0])
    )
    assert max_rl_advantages(torch.tensor([0.0, 0.0])).tolist() == [0.0, 0.0]


def test_max_rl_rejects_rewards_outside_a_pass_rate_naming_the_task():
    # mixed signs with a small positive mean: [1, -0.9] has mean 0.05, so (r - mean) / mean would be +-19
    with pytest.raises(ValueError, match=r"max_rl needs rewards in \[0, 1\]"):
        max_rl_advantages(torch.tensor([1.0, -0.9]))
    with pytest.raises(ValueError, match="task 't': max_rl needs rewards in"):
        _build({"t": AlgorithmConfig(type="max_rl")}, [_group("t", [1.0, -0.9])])


def test_reinforce_pp_whitens_over_tokens_like_verl():
    # verl compute_reinforce_plus_plus_baseline_outcome_advantage: group-centred scores broadcast on the response
    # tokens, then masked_whiten over the batch's tokens (token mean, Bessel-corrected token variance).
    # Centred [0.5, -0.5] with 1 and 3 tokens, [0.5, -0.5] with 2 and 2: 8 tokens, mean (0.5 - 1.5 + 1 - 1) / 8 = -0.125;
    # centred 0.625 on 3 tokens, -0.375 on 5; var (3 * 0.390625 + 5 * 0.140625) / 7 = 0.26785714, std 0.51754917:
    # 0.625 / 0.51754917 = 1.20761473, -0.375 / 0.51754917 = -0.72456884 (per-rollout whitening would give +-0.8660254).
    out = whiten_over_tokens(
        [torch.tensor([0.5, -0.5]), torch.tensor([0.5, -0.5])], [torch.tensor([1.0, 3.0]), torch.tensor([2.0, 2.0])]
    )
    torch.testing.assert_close(
        torch.cat(out), torch.tensor([1.20761473, -0.72456884, 1.20761473, -0.72456884]), atol=1e-6, rtol=0
    )


def _turn(prompt, completion, env_messages=(), version=0):
    return RolloutTurn(
        prompt_messages=[{"role": "user", "content": "Sum the digits of 47."}],
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        completion_logprobs=[-0.5] * len(completion),
        env_messages=list(env_messages),
        policy_version=version,
    )


def _group(task, rewards, example=None, turns=None):
    rollouts = [
        Rollout(
            rollout_id=f"{task}/{i}",
            group_id=task,
            task_name=task,
            sample_index=i,
            status=RolloutStatus.COMPLETED,
            reward=r,
            turns=turns or [_turn([1, 2], [3, 4])],
        )
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
        (
            dict(type="custom", custom_advantage_fn="tests.unit.rl.algorithms.test_algorithms:doubled"),
            [-2.0, -4.0, -4.0, -2.0],
        ),
        # one group: centred [0.5, -0.5, -0.5, 0.5], 2 tokens each: token variance 8 * 0.25 / 7, std 0.53452248 -> +-0.93541435
        (dict(type="reinforce_pp"), [0.93541435, -0.93541435, -0.93541435, 0.93541435]),
    ],
)
def test_advantage_types_on_every_sampled_token(fields, expected):
    samples, _ = _build({"t": AlgorithmConfig(**fields)}, [_group("t", [1.0, 0.0, 0.0, 1.0])])
    assert [s.advantages for s in samples] == [pytest.approx([a] * 4, abs=1e-5) for a in expected]
    assert all(s.rl_weights == [0.0, 0.0, 1.0, 1.0] and s.ce_weights == [0.0] * 4 for s in samples)


def test_one_run_mixes_algorithms_with_per_task_metrics_and_dynamic_sampling():
    algorithms = {
        "a": AlgorithmConfig(type="grpo", drop_constant_reward_groups=True),
        "b": AlgorithmConfig(type="reward"),
    }
    groups = [_group("a", [1.0, 0.0]), _group("a", [1.0, 1.0]), _group("b", [0.0, 2.0])]
    samples, metrics = _build(algorithms, groups)
    assert [s.advantages[-1] for s in samples] == [0.5, -0.5, 0.0, 2.0]
    assert metrics["rollouts/dropped_zero_adv_groups"] == 1 and metrics["rollouts/dropped_groups"] == 1
    # task a: the trained advantages [0.5, -0.5] (a dropped group trains nothing and is not counted)
    assert metrics["advantage/a/mean"] == 0 and metrics["advantage/a/frac_zero"] == 0
    assert metrics["advantage/a/std"] == pytest.approx(0.5)
    assert metrics["advantage/b/mean"] == 1.0 and metrics["advantage/b/frac_zero"] == 0.5


def test_echo_weighs_each_environment_message_by_its_own_role(qwen3_renderer):
    # turn 1 answers; the environment replies with a tool message and then a user message; turn 2's prompt is the
    # bridge: the tool message's tokens get tool's weight (0.25), the user message's user's (0.5), and the
    # generation prompt of the assistant's next turn none (before: every new token got the last message's role).
    prompt, completion, env_messages, bridged, first = _answered_then_tool_and_user_reply(qwen3_renderer)
    second = _turn(list(bridged.token_ids), [7])
    weights = {"tool": 0.25, "user": 0.5}
    samples, _ = _build(
        {"t": AlgorithmConfig(type="echo", echo_role_weights=weights)},
        [_group("t", [1.0, 0.0], turns=[first, second])],
        renderers={"t": qwen3_renderer},
    )
    new = len(prompt) + len(completion)
    expected_env = [weights[env_messages[i]["role"]] if i >= 0 else 0.0 for i in bridged.message_indices[new:]]
    assert samples[0].ce_weights == [0.0] * new + expected_env + [0.0]
    assert {0.25, 0.5} <= set(expected_env) and expected_env[
        -1
    ] == 0.0  # both roles present; the generation prompt untrained
    tool_text = _decode([t for t, w in zip(samples[0].input_ids, samples[0].ce_weights) if w == 0.25])
    user_text = _decode([t for t, w in zip(samples[0].input_ids, samples[0].ce_weights) if w == 0.5])
    assert "ok" in tool_text and "again" not in tool_text and "again" in user_text and "ok" not in user_text
    assert samples[0].rl_weights == [0.0] * len(prompt) + [1.0] * len(completion) + [0.0] * len(expected_env) + [1.0]


def tool_messages_only(message: dict) -> bool:
    """An echo filter: train tool results, not what the environment says as the user."""
    return message["role"] == "tool"


def test_echo_trains_only_the_environment_messages_its_filter_keeps(qwen3_renderer):
    prompt, completion, env_messages, bridged, first = _answered_then_tool_and_user_reply(qwen3_renderer)
    second = _turn(list(bridged.token_ids), [7])
    weights = {"tool": 0.25, "user": 0.5}
    filtered = AlgorithmConfig(
        type="echo",
        echo_role_weights=weights,
        echo_filter="tests.unit.rl.algorithms.test_algorithms:tool_messages_only",
    )
    samples, _ = _build(
        {"t": filtered}, [_group("t", [1.0, 0.0], turns=[first, second])], renderers={"t": qwen3_renderer}
    )
    new = len(prompt) + len(completion)
    kept = [0.25 if i >= 0 and env_messages[i]["role"] == "tool" else 0.0 for i in bridged.message_indices[new:]]
    assert samples[0].ce_weights == [0.0] * new + kept + [0.0]
    assert 0.25 in kept and 0.5 not in samples[0].ce_weights  # the user message is left out, the tool result kept
    with pytest.raises(ValueError, match="algorithm.echo_filter is read by type = 'echo' only"):
        GRPO.check(AlgorithmConfig(echo_filter=filtered.echo_filter), "algorithm", 4)


def test_opd_routes_sampled_tokens_to_ref_kl_with_teacher_logprobs():
    calls = []

    async def teacher(name, sequences):
        calls.append(name)
        return [[0.0] + [-0.1 * t for t in range(1, len(ids))] for ids in sequences]

    samples, _ = _build(
        {"t": AlgorithmConfig(type="opd", teacher="big")}, [_group("t", [1.0, 1.0])], prompt_logprobs=teacher
    )
    assert calls == ["big"] and len(samples) == 2
    assert samples[0].ref_kl_weights == [0.0, 0.0, 1.0, 1.0] and samples[0].rl_weights == [0.0] * 4
    assert samples[0].ref_logprobs == pytest.approx([0.0, -0.1, -0.2, -0.3])


def test_echo_setting_one_role_replaces_the_whole_table(qwen3_renderer):
    # "setting any role replaces the whole table" (prime-rl's echo). The default table trains tool results at 0.1; a table
    # naming only user (0.5) trains user messages at 0.5 and tool results not at all (before: tool kept 0.1).
    assert AlgorithmConfig(type="echo").echo_role_weights.tool == 0.1
    config = load_config(
        E2E_CONFIGS / "tiny_qwen3_algorithms_e2e.toml", {"algorithm.echo_role_weights": "{user = 0.5}"}
    )
    assert config.algorithm.echo_role_weights.model_dump() == {
        "system": 0.0,
        "user": 0.5,
        "assistant": 0.0,
        "tool": 0.0,
    }
    prompt, completion, env_messages, bridged, first = _answered_then_tool_and_user_reply(qwen3_renderer)
    samples, _ = _build(
        {"t": AlgorithmConfig(type="echo", echo_role_weights={"user": 0.5})},
        [_group("t", [1.0, 0.0], turns=[first, _turn(list(bridged.token_ids), [7])])],
        renderers={"t": qwen3_renderer},
    )
    new = len(prompt) + len(completion)
    roles = [env_messages[i]["role"] if i >= 0 else None for i in bridged.message_indices[new:]]
    assert "tool" in roles and "user" in roles
    assert samples[0].ce_weights[new:-1] == [0.5 if role == "user" else 0.0 for role in roles]


def _answered_then_tool_and_user_reply(renderer):
    """A first turn that answers, then a tool message and a user message bridged into the second turn's prompt:
    (prompt, completion, env_messages, bridged, first turn)."""
    messages = [{"role": "user", "content": "Sum the digits of 47."}]
    prompt = list(renderer.render_ids(messages, add_generation_prompt=True))
    completion = list(renderer.render_ids([*messages, {"role": "assistant", "content": "11"}]))[len(prompt) :]
    env_messages = [{"role": "tool", "content": "ok"}, {"role": "user", "content": "again"}]
    bridged = renderer.bridge_to_next_turn(prompt, completion, env_messages)
    first = RolloutTurn(
        prompt_messages=messages,
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        completion_logprobs=[-0.5] * len(completion),
        env_messages=env_messages,
        assistant_message={"role": "assistant", "content": "11"},
    )
    return prompt, completion, env_messages, bridged, first


def _decode(ids):
    from transformers import AutoTokenizer

    from rl.assets import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path("tiny-qwen3")).decode(ids)


@pytest.fixture(scope="module")
def qwen3_renderer():
    return build_renderer(RendererConfig(name="qwen3"), "tiny-qwen3")


def _demonstration_group(algorithm, renderer, row):
    """sft's rows through the fan-out with its own rollout function; a generator call fails the test."""
    from rl.config.tasks import RendererEnvConfig
    from rollouts.fanout import RolloutContext, rollout_group
    from tasks.sum_digits import SumDigitsTask

    async def generate(request):
        raise AssertionError("sft from the dataset must generate nothing")

    def context(index):
        return RolloutContext(
            row_id="r",
            sample_index=index,
            task_name="t",
            task=SumDigitsTask(),
            renderer=renderer,
            env_config=RendererEnvConfig(),
            generate=generate,
        )

    return asyncio.run(rollout_group("r", "t", row, algorithm.rollouts_per_row(8), algorithm.rollout_fn(), context))


def test_sft_trains_cross_entropy_on_the_dataset_demonstration_and_generates_nothing(qwen3_renderer):
    builder = SampleBuilder({"t": AlgorithmConfig(type="sft")}, {"t": qwen3_renderer}, None)
    row = {"number": 47, "answer": 11, "prompt": "Sum the digits of 47.", "demonstration": "11"}
    group = _demonstration_group(builder.algorithms["t"], qwen3_renderer, row)
    [rollout] = group.rollouts  # one demonstration per row, not group_size generations
    assert rollout.metadata["sampler"] == "dataset" and rollout.status == RolloutStatus.COMPLETED
    rollout.reward = 1.0  # scored by the task's rubric in a run
    [sample], _ = asyncio.run(builder.build([group]))
    full = qwen3_renderer.render_ids(
        [{"role": "user", "content": "Sum the digits of 47."}, {"role": "assistant", "content": "11"}]
    )
    assert sample.input_ids == list(full)
    trained = [t for t, w in zip(sample.input_ids, sample.ce_weights) if w]
    assert _decode(trained).startswith("11") and sample.ce_weights[-len(trained) :] == [1.0] * len(trained)
    assert sum(sample.rl_weights) == 0 and sum(sample.ce_weights) == len(trained)
    missing = _demonstration_group(
        builder.algorithms["t"], qwen3_renderer, {k: v for k, v in row.items() if k != "demonstration"}
    )
    assert missing.rollouts[0].status == RolloutStatus.ERROR and "'demonstration'" in missing.rollouts[0].error


def per_token(rewards, rollouts):
    """Per-token credit: rollout i's k-th sampled token gets reward + k / 10; rollout 1 one value."""
    return [[rewards[0] + k / 10 for k in range(rollouts[0].num_completion_tokens)], rewards[1] - 1]


def test_custom_per_token_advantages_reach_each_sampled_token():
    # two turns whose prompts do not extend each other: two samples, sampled tokens [3, 4] then [7, 8, 9]
    turns = [_turn([1, 2], [3, 4]), _turn([5, 6], [7, 8, 9])]
    config = AlgorithmConfig(type="custom", custom_advantage_fn=f"{__name__}:per_token")
    group = _group("t", [1.0, 0.5], turns=turns)
    samples, metrics = _build({"t": config}, [group])
    first, second = [1.0, 1.1, 1.2, 1.3, 1.4], -0.5  # rollout 0: 1 + k/10 over 5 tokens; rollout 1: 0.5 - 1
    assert samples[0].advantages == pytest.approx([0.0, 0.0, first[0], first[1]])
    assert samples[1].advantages == pytest.approx([0.0, 0.0, first[2], first[3], first[4]])
    assert [s.advantages for s in samples[2:]] == [[second] * 4, [second] * 5]  # the scalar, broadcast
    assert group.rollouts[0].advantage == pytest.approx(sum(first) / 5) and group.rollouts[1].advantage == second
    assert metrics["advantage/t/mean"] == pytest.approx((1.2 - 0.5) / 2)


def short(rewards, rollouts):
    return [[1.0], [1.0]]


def test_custom_per_token_advantages_must_cover_every_sampled_token():
    config = AlgorithmConfig(type="custom", custom_advantage_fn=f"{__name__}:short")
    with pytest.raises(ValueError, match="returned 1 per-token advantages for rollout 0, which sampled 2 tokens"):
        _build({"t": config}, [_group("t", [1.0, 0.0])])


def test_a_custom_advantage_function_runs_once_per_group():
    calls = []

    def counted(rewards, rollouts):
        calls.append(rewards)
        return [r - 0.5 for r in rewards]

    import sys

    sys.modules[__name__].counted = counted
    config = AlgorithmConfig(type="custom", custom_advantage_fn=f"{__name__}:counted")
    builder = SampleBuilder({"t": config}, {}, None)
    group = _group("t", [1.0, 0.0])
    assert builder.drop_reason(group, seq_len=64) is None  # the producer: credit assigned here
    samples, _ = asyncio.run(builder.build([group]))  # the train step reuses it
    assert [r.advantage for r in group.rollouts] == [0.5, -0.5]  # what the sample log reads
    assert len(calls) == 1 and [s.advantages[-1] for s in samples] == [0.5, -0.5]


def test_opsd_scores_the_sampled_tokens_under_the_demonstration_prompt(qwen3_renderer):
    prompt = list(
        qwen3_renderer.render_ids([{"role": "user", "content": "Sum the digits of 47."}], add_generation_prompt=True)
    )
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


def test_opsd_scores_every_sample_of_a_re_rendered_multi_turn_rollout(qwen3_renderer):
    # turn 2's prompt is a re-render that does not extend turn 1's prompt + sampled tokens [3, 4]: a second sample.
    # Its teacher prompt is turn 2's messages with the demonstration in the first user message (before: dropped).
    question = {"role": "user", "content": "Sum the digits of 47."}
    history = [question, {"role": "assistant", "content": "11"}, {"role": "user", "content": "Again."}]
    first = _turn(list(qwen3_renderer.render_ids([question], add_generation_prompt=True)), [3, 4])
    second_prompt = list(qwen3_renderer.render_ids(history, add_generation_prompt=True))
    second = _turn(second_prompt, [5, 6, 7])
    second.prompt_messages = history
    seen = []

    async def policy(name, sequences):
        seen.extend(sequences)
        return [[-float(i) for i in range(len(ids))] for ids in sequences]  # logprob -i at position i

    group = _group("t", [1.0], example={"answer": 11}, turns=[first, second])
    samples, _ = _build({"t": AlgorithmConfig(type="opsd", demo_key="answer")}, [group], {"t": qwen3_renderer}, policy)
    assert [s.input_ids for s in samples] == [[*first.prompt_token_ids, 3, 4], [*second_prompt, 5, 6, 7]]
    demo = {**question, "content": "Sum the digits of 47.\n\nA correct answer, for reference: 11"}
    demo_prompts = [
        list(qwen3_renderer.render_ids(messages, add_generation_prompt=True))
        for messages in ([demo], [demo, *history[1:]])
    ]
    assert seen == [[*demo_prompts[0], 3, 4], [*demo_prompts[1], 5, 6, 7]]
    n = len(demo_prompts[1])
    assert samples[1].ref_logprobs == [0.0] * len(second_prompt) + [-float(n), -float(n + 1), -float(n + 2)]
    assert samples[1].ref_kl_weights == [0.0] * len(second_prompt) + [1.0, 1.0, 1.0]


def _config(**overrides):
    """Loaded and resolved, as every entry point runs a config (`rl.loop.resolve`)."""
    return resolve_config(load_config(None, {"tasks": "[{name = 'sum_digits'}]", **overrides}))


def test_task_algorithm_overrides_only_what_it_sets():
    config = _config(
        **{
            "algorithm.normalize_advantage_std": "true",
            "model.path": "'tiny-qwen3'",  # a teacher shares the policy's tokenizer
            "models.teacher.path": "'tiny-qwen3'",
            "tasks.0.algorithm": "{type = 'opd', teacher = 'teacher'}",
        }
    )
    resolved = config.algorithm.for_task(config.tasks[0].algorithm)
    assert resolved.type == "opd" and resolved.teacher == "teacher" and resolved.normalize_advantage_std
    # the override is derived from the credit fields: each one overridable, the trainer-wide loss and group size not
    with pytest.raises(ConfigError, match="tasks.0.algorithm.kl_coef: Extra inputs"):
        _config(**{"tasks.0.algorithm": "{kl_coef = 0.1}"})
    with pytest.raises(ConfigError, match="tasks.0.algorithm.group_size: Extra inputs"):
        _config(**{"tasks.0.algorithm": "{group_size = 4}"})
    assert set(TaskAlgorithmConfig.model_fields) == set(CreditConfig.model_fields)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"algorithm.group_size": "1"}, r"algorithm.type = 'grpo' is group-relative but algorithm.group_size = 1"),
        (
            {"algorithm.group_size": "1", "tasks.0.algorithm": "{type = 'rloo'}"},
            r"tasks.0.algorithm.type = 'rloo' is group-relative",
        ),
        ({"algorithm.type": "opd"}, r"algorithm.type = 'opd' needs algorithm.teacher"),
        ({"algorithm.type": "opd", "algorithm.teacher": "'policy'"}, r"algorithm.teacher = 'policy' with type 'opd'"),
        ({"algorithm.type": "opd", "algorithm.teacher": "'big'"}, r"algorithm.teacher = 'big' is not a declared model"),
        (
            {"models.big.path": "'tiny-qwen3'", "algorithm.sampler": "'big'"},
            r"algorithm.sampler = 'big' \(a frozen model\) cannot feed algorithm.type = 'grpo'",
        ),
        ({"models.policy.path": "'tiny-qwen3'"}, r"models.policy: the name 'policy' is reserved"),
        ({"models.big.path": "'/no/such/model'"}, r"models.big.path: '/no/such/model' is neither a built-in model"),
        ({"algorithm.type": "custom"}, r"needs algorithm.custom_advantage_fn"),
        (
            {"models.big.path": "'tiny-qwen3'", "algorithm.type": "opsd", "algorithm.teacher": "'big'"},
            r"algorithm.teacher = 'big' with type 'opsd': its teacher is the live policy",
        ),
        ({"loss.kl_in_reward": "true"}, r"loss.kl_in_reward is set but loss.kl_coef is 0"),
        (
            {"loss.rollout_correction.rollout_rs": "'token'"},
            r"loss.rollout_correction.*rollout_rs_threshold is not",
        ),
        (
            {"loss.rollout_correction.rollout_is_threshold": "true"},
            r"loss.rollout_correction.rollout_is_threshold",
        ),
        ({"loss.dual_clip_c": "0.5"}, r"loss.dual_clip_c"),
        ({"algorithm.kl_coef": "0.1"}, r"algorithm: kl_coef: the trainer-wide loss is its own section \[loss\]"),
        ({"algorithm.loss": "'gspo'"}, r"algorithm: loss: the trainer-wide loss is its own section \[loss\]"),
        ({"loss.type": "'dapo'"}, r"loss.type: 'dapo' is neither a registered loss"),
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

    config = resolve_config(load_config(E2E_CONFIGS / "tiny_qwen3_algorithms_e2e.toml"))
    assert Config.model_validate(tomllib.loads(dump_toml(config))) == config


def test_task_echo_override_keeps_typed_role_weights():
    config = _config(**{"tasks.0.algorithm": "{type = 'echo', echo_role_weights = {user = 0.5}}"})
    resolved = config.algorithm.for_task(config.tasks[0].algorithm)
    assert resolved.echo_role_weights.model_dump() == {"system": 0.0, "user": 0.5, "assistant": 0.0, "tool": 0.0}
    with pytest.raises(ConfigError, match="echo_role_weights.narrator"):
        _config(**{"algorithm.echo_role_weights.narrator": "1.0"})


class LengthCredit(GRPO):
    """A user's algorithm by import path: GRPO's credit, plus 0.25 per completion token (to tell it apart)."""

    def advantages(self, rewards, rollouts):
        return super().advantages(rewards, rollouts) + 0.25 * torch.tensor(
            [float(r.num_completion_tokens) for r in rollouts]
        )


def test_a_users_algorithm_class_by_import_path():
    config = _config(**{"tasks.0.algorithm": "{type = 'tests.unit.rl.algorithms.test_algorithms:LengthCredit'}"})
    resolved = config.algorithm.for_task(config.tasks[0].algorithm)
    # group-relative like GRPO: [1, 0] -> [0.5, -0.5], plus 0.25 x 2 completion tokens each
    samples, _ = _build({"t": resolved}, [_group("t", [1.0, 0.0])])
    assert [s.advantages[-1] for s in samples] == [1.0, 0.0]
    with pytest.raises(
        ConfigError, match=r"tasks.0.algorithm.type: 'tests.unit.rl.algorithms.test_algorithms:doubled' resolves to"
    ):
        _config(**{"tasks.0.algorithm": "{type = 'tests.unit.rl.algorithms.test_algorithms:doubled'}"})
    with pytest.raises(ConfigError, match=r"'ppo' is neither a registered algorithm"):
        _config(**{"algorithm.type": "'ppo'"})


def test_echo_attributes_a_rerendered_prompt_too():
    # SmolLM2's template renderer never bridges: the next prompt is a re-render, attributed message by message.
    renderer = build_renderer(RendererConfig(), "smollm2-135m-instruct")
    messages = [{"role": "user", "content": "Sum the digits of 47."}]
    reply = {"role": "assistant", "content": "11"}
    prompt = list(renderer.render_ids(messages, add_generation_prompt=True))
    completion = list(renderer.render_ids([*messages, reply]))[len(prompt) :]
    env_messages = [{"role": "user", "content": "again"}]
    rendered = renderer.render([*messages, reply, *env_messages], add_generation_prompt=True)
    # the prefix holds: one sample
    assert list(rendered.token_ids[: len(prompt) + len(completion)]) == prompt + completion
    first = RolloutTurn(
        prompt_messages=messages,
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        completion_logprobs=[-0.5] * len(completion),
        env_messages=env_messages,
        assistant_message=reply,
    )
    second = _turn(list(rendered.token_ids), [7])
    [sample, _], _ = _build(
        {"t": AlgorithmConfig(type="echo", echo_role_weights={"user": 0.5})},
        [_group("t", [1.0, 0.0], turns=[first, second])],
        renderers={"t": renderer},
    )
    new = len(prompt) + len(completion)
    # message 2 is the environment's user message
    expected = [0.5 if i == 2 else 0.0 for i in rendered.message_indices[new:]]
    assert sample.ce_weights == [0.0] * new + expected + [0.0] and 0.5 in expected and expected[-1] == 0.0
