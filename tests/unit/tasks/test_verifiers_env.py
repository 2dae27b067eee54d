"""`tasks.verifiers_env:VerifiersTask` in-process with the real verifiers package: a local verifiers taskset's
episodes play through rlmesh's gateway (every model call one token-exact turn) and are scored by the taskset's own
`@vf.reward`; a failing episode or rubric becomes an ERROR rollout."""

import pytest

from rl.config.tasks import TaskConfig
from rollouts.types import RolloutStatus
from tasks.build import build_task
from tasks.verifiers_env import VerifiersTask, seats_reward
from tests.support.gateway_rollouts import IM_END, play

pytestmark = pytest.mark.processes  # the taskset's interception server and reward workers

QUIZ = "tests.support.verifiers_quiz"


def quiz(**taskset_args) -> VerifiersTask:
    task = VerifiersTask(taskset=QUIZ, taskset_args={"num_tasks": 6, **taskset_args}, num_validation=2)
    task.rubric = task.build_rubric()
    return task


def test_the_tasksets_tasks_are_the_rows_split_disjoint():
    task = build_task(TaskConfig(name="verifiers", args={"taskset": QUIZ, "num_validation": 3})).task
    validation, train = task.load_dataset("validation"), task.load_dataset("train")
    assert [row["index"] for row in validation] == [0, 1, 2] and [row["index"] for row in train] == list(range(3, 12))
    assert validation[0]["prompt"] == "What is 1 + 3? Answer with just the number." and validation[0]["answer"] == 4
    assert train[0]["answer"] == 1 + 4  # 1 + 4 is the fourth addition


@pytest.mark.parametrize("reply, reward", [("6", 1.0), ("It is 7.", 0.0)])  # the first training row asks 1 + 5
async def test_an_episode_is_one_gateway_turn_scored_by_the_environments_rubric(renderer, tokenizer, reply, reward):
    task = quiz()
    rollouts = await play(task, renderer, tokenizer, max_turns=1, reply=reply)
    for rollout in rollouts:
        assert rollout.status is RolloutStatus.COMPLETED, rollout.error
        [turn] = rollout.turns
        assert turn.prompt_messages == [{"role": "user", "content": "What is 1 + 5? Answer with just the number."}]
        # the prompt the model's own chat template makes (Qwen3, thinking off), token for token
        assert turn.prompt_token_ids == tokenizer.apply_chat_template(
            turn.prompt_messages, add_generation_prompt=True, return_dict=False, enable_thinking=False
        )
        assert turn.completion_token_ids == [*tokenizer.encode(reply, add_special_tokens=False), IM_END]
        assert turn.completion_logprobs == [-0.5] * len(turn.completion_token_ids) and turn.policy_version == 7
        assert rollout.reward == reward and rollout.reward_components == {"verifiers_reward": reward}
        assert rollout.metadata["verifiers_seat_rewards"] == [reward]  # one seat
    [server] = task.env._interception.servers  # one interception server, shared by the group's rollouts,
    assert server.clients == {}  # which keeps no client of a finished rollout's gateway URL


async def test_a_failed_model_call_or_rubric_is_an_error_rollout(renderer, tokenizer):
    async def broken_generator(request):
        raise RuntimeError("generator down")

    for rollout in await play(quiz(), renderer, tokenizer, max_turns=1, generate=broken_generator):
        assert rollout.status is RolloutStatus.ERROR and "generator down" in rollout.error
        assert rollout.reward == 0.0  # the rubric's error_reward
    for rollout in await play(quiz(broken_rubric=True), renderer, tokenizer, max_turns=1, reply="6"):
        assert rollout.status is RolloutStatus.ERROR and "the quiz rubric is broken on purpose" in rollout.error
        assert len(rollout.turns) == 1 and rollout.reward == 0.0


def test_bad_arguments_are_named():
    with pytest.raises(ModuleNotFoundError, match="tests.support.no_such_env"):
        VerifiersTask(taskset="tests.support.no_such_env")
    with pytest.raises(ModuleNotFoundError, match="taskset 'no_such_env' not found"):
        VerifiersTask(taskset="no_such_env")
    with pytest.raises(ValueError, match="has 12 tasks, not more than num_validation = 12"):
        VerifiersTask(taskset=QUIZ, num_validation=12)
    with pytest.raises(ValueError, match="must be > 0"):
        VerifiersTask(taskset=QUIZ, timeout_s=0)


def test_several_seats_share_their_mean_reward_and_say_so():
    assert seats_reward([0.25]) == (0.25, None)  # one seat: its reward, no word
    mean, warning = seats_reward([1.0, 0.0])  # a zero-sum game: the mean is the same whoever wins
    assert mean == 0.5 and warning.startswith("verifiers episodes have 2 seats (rewards [1.0, 0.0] in the first)")
    assert "no learning signal" in warning and "verifiers_seat_rewards" in warning
