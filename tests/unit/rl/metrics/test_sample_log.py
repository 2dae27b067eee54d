"""Sample-level logging: the sample record and every `[sample_logging.filters]` filter."""

import json
from types import SimpleNamespace

import pytest

from rl.config import ConfigError, dump_toml, load_config
from rl.config.metrics import SampleFilters
from rl.loop.controller import Controller
from rl.loop.scored_groups import ScoredGroups
from rl.metrics.reduce import drain_states
from rl.metrics.sample_log import SampleFilter, SampleLogger, sample_record
from rollouts.types import Rollout, RolloutGroup, RolloutStatus, RolloutTurn
from rubrics.rubric import apply_reward
from tests.support.paths import E2E_CONFIGS


def rollout(index, reward, status=RolloutStatus.COMPLETED, completion=(5, 6), version=0):
    turn = RolloutTurn(
        prompt_messages=[{"role": "user", "content": "Sum the digits of 47."}],
        prompt_token_ids=[1, 2, 3, 4],
        completion_token_ids=list(completion),
        completion_logprobs=[-0.5] * len(completion),
        assistant_message={"role": "assistant", "content": f"answer {index}"},
        policy_version=version,
    )
    return Rollout(
        rollout_id=f"train/row=7/{index}",
        group_id="train/row=7",
        task_name="sum_digits",
        sample_index=index,
        turns=[turn],
        status=status,
        reward=reward,
        reward_components={"digit_sum_correct": reward or 0.0},
    )


def samples(rewards, advantages=None, response_lens=None):
    """Sample dicts with episode ids 0.. and the given rewards (advantage = reward - 0.5 unless given)."""
    return [
        {
            "episode_id": index,
            "reward": reward,
            "advantage": (advantages or [reward - 0.5 for reward in rewards])[index],
            "response_len": (response_lens or [1] * len(rewards))[index],
        }
        for index, reward in enumerate(rewards)
    ]


def select(rewards, at_step=1, advantages=None, response_lens=None, seed=0, **filters):
    chosen = SampleFilter(SampleFilters(top_k="off", bottom_k="off", **filters), seed=seed).select(
        samples(rewards, advantages, response_lens), at_step
    )
    return [sample["episode_id"] for sample in chosen]


REWARDS = [0.0, 1.0, 0.5, 0.25, 1.0, 0.0]


def test_no_filter_keeps_every_sample():
    assert select(REWARDS) == [0, 1, 2, 3, 4, 5]


def test_step_logs_every_nth_step_only():
    assert [at_step for at_step in range(1, 10) if select(REWARDS, at_step=at_step, step=3)] == [3, 6, 9]


def test_reward_below_and_above_are_inclusive_and_together_keep_either_tail():
    assert select(REWARDS, reward_below=0.25) == [0, 3, 5]
    assert select(REWARDS, reward_above=0.5) == [1, 2, 4]
    assert select(REWARDS, reward_below=0.0, reward_above=1.0) == [0, 1, 4, 5]


def test_reward_tails_skip_an_unscored_sample_instead_of_raising():
    # rewards [0, None, 1]: the None sample (an error) is in neither tail
    assert select([0.0, None, 1.0], advantages=[0.0, None, 0.0], reward_below=0.5) == [0]
    assert select([0.0, None, 1.0], advantages=[0.0, None, 0.0], reward_above=0.5) == [2]
    assert select([0.0, None, 1.0], advantages=[0.0, None, 0.0], reward_below=0.0, reward_above=1.0) == [0, 2]


def test_abs_advantage_above_keeps_extremes_and_never_untrained_samples():
    advantages = [-1.0, 0.5, None, 0.2, -0.5, 0.0]
    assert select(REWARDS, advantages=advantages, abs_advantage_above=0.5) == [0, 1, 4]


def test_top_k_and_bottom_k_by_reward_ties_to_the_lower_episode_id():
    rank = SampleFilter(SampleFilters(top_k=1, bottom_k=2), seed=0)
    assert [s["episode_id"] for s in rank.select(samples(REWARDS), 1)] == [0, 1, 5]
    assert [
        s["episode_id"] for s in SampleFilter(SampleFilters(top_k=2, bottom_k="off"), 0).select(samples(REWARDS), 1)
    ] == [1, 4]
    assert [
        s["episode_id"] for s in SampleFilter(SampleFilters(top_k=0, bottom_k=1), 0).select(samples(REWARDS), 1)
    ] == [0]


def test_custom_predicate_by_import_path():
    assert select(
        REWARDS, response_lens=[1, 3, 5, 2, 3, 0], predicate="tests.support.sample_predicates:long_response"
    ) == [1, 2, 4]


def test_freq_subsamples_with_a_seeded_rng_per_step():
    rewards = [0.5] * 400
    kept = select(rewards, freq=0.25, seed=3)
    assert kept == select(rewards, freq=0.25, seed=3)  # same seed and step: same samples
    assert kept != select(rewards, freq=0.25, seed=4) and kept != select(rewards, at_step=2, freq=0.25, seed=3)
    assert 60 < len(kept) < 140  # 100 expected; binomial sd 8.7


def test_filters_combine():
    # reward tail AND |advantage| AND predicate, then the best one of those left
    advantages = [-1.0, 0.9, 0.0, -0.9, 0.6, -1.0]
    chosen = SampleFilter(
        SampleFilters(
            reward_above=0.25,
            abs_advantage_above=0.5,
            predicate="tests.support.sample_predicates:long_response",
            top_k=1,
            bottom_k="off",
        ),
        seed=0,
    ).select(samples(REWARDS, advantages, response_lens=[9, 9, 9, 9, 2, 9]), 1)
    assert [s["episode_id"] for s in chosen] == [1]  # 3 has |adv| .9 and reward .25 but 1 ranks higher; 4 is too short


def test_rank_cuts_are_switched_off_in_toml_and_survive_the_resolved_config(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[sample_logging.filters]\ntop_k = "off"\nbottom_k = 3\n')
    config = load_config(path)
    assert (config.sample_logging.filters.top_k, config.sample_logging.filters.bottom_k) == ("off", 3)
    path.write_text(dump_toml(config))
    assert load_config(path) == config
    with pytest.raises(ConfigError, match=r"sample_logging\.filters\.top_k"):
        load_config(overrides={"sample_logging.filters.top_k": "-1"})


def test_unknown_filter_key_fails_config_validation_naming_it():
    with pytest.raises(ConfigError, match=r"sample_logging\.filters\.reward_bellow: Extra inputs are not permitted"):
        load_config(overrides={"sample_logging.filters.reward_bellow": "0.1"})


def test_sample_record_has_the_seed_fields():
    record = sample_record(rollout(2, 0.75, version=3), episode_id=42, target="11", advantage=0.25)
    assert record == {
        "episode_id": 42,
        "policy_version": 3,
        "task": "sum_digits",
        "prompt": "user: Sum the digits of 47.",
        "response": "answer 2",
        "target": "11",
        "reward": 0.75,
        "advantage": 0.25,
        "request_len": 4,
        "response_len": 2,
        "ref_logprobs": None,
        "status": "completed",
        "error": None,
        "rollout_id": "train/row=7/2",
        "reward/digit_sum_correct": 0.75,
    }


def run_sample_logger(config, targets, reference_logprobs=None):
    """The SampleLogger a run with `config` builds (as the controller does)."""
    return SampleLogger(
        config.sample_logging,
        targets,
        seed=config.run.seed,
        episodes_per_step=config.run.groups_per_step * config.algorithm.group_size,
        reference_logprobs=reference_logprobs,
    )


async def test_sample_logger_records_the_chosen_samples_of_a_trained_batch():
    config = load_config(overrides={"run.groups_per_step": "1", "algorithm.group_size": "4"})
    group = RolloutGroup(
        group_id="train/row=7",
        task_name="sum_digits",
        example={"answer": 11},
        rollouts=[
            rollout(0, 1.0),
            rollout(1, 0.0),
            rollout(2, None, status=RolloutStatus.ERROR),
            rollout(3, 0.5),
        ],
    )
    for r, advantage in zip(group.rollouts, [0.5, -0.5, None, 0.0]):  # as SampleBuilder.assign credited them
        r.advantage = advantage
    drain_states()
    await run_sample_logger(config, {"sum_digits": lambda example: str(example["answer"])}).record([group], step=3)
    logged = drain_states()["reward/samples"]["samples"]
    # default filters: the best and the worst of the step; episode ids continue from 2 steps x 4 rollouts
    assert [(s["episode_id"], s["reward"], s["advantage"], s["target"]) for s in logged] == [
        (8, 1.0, 0.5, "11"),
        (9, 0.0, -0.5, "11"),
    ]


async def test_disabled_sample_logging_records_nothing():
    config = load_config(overrides={"sample_logging.enabled": "false"})
    group = RolloutGroup(group_id="g", task_name="sum_digits", example={}, rollouts=[rollout(0, 1.0), rollout(1, 0.0)])
    drain_states()
    await run_sample_logger(config, {"sum_digits": lambda example: None}).record([group], step=1)
    assert drain_states() == {}


def test_a_predicate_that_cannot_be_imported_fails_validate(capsys):
    from rl.commands.cli import main

    assert main(["validate", "--sample_logging.filters.predicate", "tests.support.sample_predicates:nope"]) == 2
    assert "has no attribute 'nope'" in capsys.readouterr().err


async def test_ref_logprobs_is_the_mean_reference_logprob_of_the_sampled_tokens():
    async def reference(token_ids):  # a stand-in reference model: logprob -token_id / 10 for every token
        return [-token / 10 for token in token_ids]

    config = load_config(overrides={"run.groups_per_step": "1", "algorithm.group_size": "2"})
    group = RolloutGroup(
        group_id="g", task_name="sum_digits", example={}, rollouts=[rollout(0, 1.0, completion=(5, 6)), rollout(1, 0.0)]
    )
    drain_states()
    await run_sample_logger(config, {"sum_digits": lambda example: None}, reference_logprobs=reference).record(
        [group], step=1
    )
    logged = drain_states()["reward/samples"]["samples"]
    assert [s["ref_logprobs"] for s in logged] == [pytest.approx(-0.55), pytest.approx(-0.55)]  # mean of -0.5, -0.6


class DeadGenerators:
    """What `ScoredGroups` asks of `Roles`, with the policy's generators failing every request (as `Roles.generate`
    raises a `GenerationFailed`) and the task's real rubric as the reward actor."""

    def __init__(self, tasks, policy_version):
        self.tasks, self.version = tasks, policy_version
        self.generators = SimpleNamespace(router=SimpleNamespace(replica_of=lambda key: 0))

    def policy_version(self):
        return self.version

    async def generate(self, request, sampling, key, sampler="policy"):
        raise RuntimeError("replica 0 failed the request")

    async def score(self, group):
        for rollout, reward in zip(
            group.rollouts, await self.tasks[group.task_name].task.score_group(group.rollouts, group.example)
        ):
            apply_reward(rollout, reward)
        return group


async def failing_rollout_fn(row, context):
    raise ValueError("the environment could not be built")


async def test_a_turnless_error_rollout_logs_its_dispatch_version_and_prompt():
    # the sample record's types: policy_version is an int and prompt the prompt; a rollout whose first generator call failed (or that
    # failed before its environment rendered anything) has no turn, and logged `policy_version None` and `prompt ""`
    config = load_config(E2E_CONFIGS / "tiny_qwen3_e2e.toml", {"algorithm.group_size": "2"})
    controller = Controller(config)
    task_name, row = controller.stream.next()
    scored = ScoredGroups(controller.tasks, controller.renderers, DeadGenerators(controller.tasks, 3), run_seed=0)
    sampling = config.generator.sampling
    generation_failed = await scored.make("train/row=5", task_name, row, 2, sampling)
    never_started = await scored.make("train/row=6", task_name, row, 2, sampling, rollout_fn=failing_rollout_fn)
    for group in (generation_failed, never_started):
        assert [(r.status, r.turns) for r in group.rollouts] == [(RolloutStatus.ERROR, [])] * 2
    drain_states()
    logger = run_sample_logger(config, {"sum_digits": lambda example: str(example["answer"])})
    await logger.record([], step=1, dropped=[generation_failed, never_started])
    logged = {sample["rollout_id"]: sample for sample in drain_states()["reward/samples"]["samples"]}
    assert {sample["policy_version"] for sample in logged.values()} == {3}
    reset = await controller.tasks[task_name].task.make_env(row).reset()
    assert logged["train/row=5/0"]["prompt"] == "\n".join(f"{m['role']}: {m['content']}" for m in reset.messages)
    assert row["prompt"] in logged["train/row=5/0"]["prompt"]
    assert "generator call failed" in logged["train/row=5/0"]["error"]
    assert logged["train/row=6/1"]["prompt"] == "row: " + json.dumps(row, sort_keys=True)
    assert "could not be built" in logged["train/row=6/1"]["error"]
