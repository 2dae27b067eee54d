"""`tasks.openenv_env:OpenEnvTask` against real OpenEnv servers on loopback, each a subprocess the task starts: a
guessing game written with openenv-core's server API (its seeded secret and rewards recomputed here), and servers
that answer a step with text that is not JSON, a NaN reward, or nothing; those rollouts are ERRORs naming the server."""

import asyncio
import random
import socket

import httpx
import pytest

from rl.config.tasks import TaskConfig
from rollouts.types import RolloutStatus
from tasks.build import build_task
from tasks.openenv_env import OpenEnvServer, OpenEnvTask
from tests.support.gateway_rollouts import play

pytestmark = pytest.mark.processes  # each task starts its OpenEnv server as a subprocess

GUESS = {"app": "tests.support.openenv_guess:app", "observation_key": "prompt", "num_train": 4, "num_validation": 2}
PROMPT = "I picked a number from 1 to 4. Guess it: answer with just the number."


@pytest.fixture(scope="module")
def guess_task():
    task = build_task(TaskConfig(name="openenv", args=GUESS)).task
    yield task
    task.server.stop()


def test_rows_are_disjoint_seeds(guess_task):
    assert guess_task.load_dataset("validation") == [{"seed": 0}, {"seed": 1}]
    assert guess_task.load_dataset("train") == [{"seed": 2}, {"seed": 3}, {"seed": 4}, {"seed": 5}]


@pytest.mark.parametrize("guess", ["1", "4"])
async def test_an_episode_is_the_servers_observations_and_rewards(guess_task, renderer, tokenizer, guess):
    secret = random.Random(2).randint(1, 4)  # the first training row is seed 2
    rollouts = await play(guess_task, renderer, tokenizer, max_turns=2, reply=guess)
    for rollout in rollouts:
        assert rollout.status is RolloutStatus.COMPLETED, rollout.error
        assert rollout.turns[0].prompt_messages == [{"role": "user", "content": PROMPT}]
        if int(guess) == secret:
            [turn] = rollout.turns
            assert turn.reward == 1.0 and rollout.reward == 1.0
        else:  # a hint, a second (same) guess, then the server ends the episode
            first, second = rollout.turns
            hint = f"No, it is {'higher' if int(guess) < secret else 'lower'}."
            assert (
                first.env_messages == [{"role": "user", "content": hint}]
                and second.prompt_messages[-1]["content"] == hint
            )
            assert first.reward == second.reward == 0.0 and rollout.reward == 0.0
    assert guess_task.server.host == "127.0.0.1" and guess_task.server.process.poll() is None


@pytest.mark.parametrize(
    "app, error",
    [
        ("non_json_app", "sent a reply that is not JSON"),
        ("nan_reward_app", "sent reward nan, not a finite number"),
        ("hung_app", "did not answer within 1.0 s"),
    ],
)
async def test_a_hostile_server_makes_error_rollouts_and_the_group_goes_on(renderer, tokenizer, app, error):
    task = OpenEnvTask(app=f"tests.support.openenv_hostile:{app}", observation_key="prompt", message_timeout_s=1.0)
    task.rubric = task.build_rubric()
    try:
        rollouts = await asyncio.wait_for(play(task, renderer, tokenizer, max_turns=2, reply="hi"), 120)
    finally:
        task.server.stop()
    assert len(rollouts) == 2
    for rollout in rollouts:
        assert (
            rollout.status is RolloutStatus.ERROR and error in rollout.error and task.server.base_url in rollout.error
        )
        assert (
            rollout.turns[0].prompt_messages == [{"role": "user", "content": "Say anything."}] and rollout.reward == 0.0
        )


async def test_a_server_that_does_not_start_is_named(renderer, tokenizer):
    task = OpenEnvTask(app="tests.support.no_such_module:app", startup_timeout_s=60)
    task.rubric = task.build_rubric()
    [rollout] = await play(task, renderer, tokenizer, group_size=1)
    assert (
        rollout.status is RolloutStatus.ERROR
        and "exited at start" in rollout.error
        and "no_such_module" in rollout.error
    )


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="import path 'package.module:app'"):
        OpenEnvTask(app="tests.support.openenv_guess")
    with pytest.raises(ValueError, match="num_train must be >= 1"):
        OpenEnvTask(app="x:app", num_train=0)


async def test_the_servers_port_is_held_from_the_start_so_no_other_process_can_take_it():
    server = OpenEnvServer("tests.support.openenv_guess:app")
    try:
        server._spawn()  # the process started; uvicorn has not even imported yet
        squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        with squatter, pytest.raises(OSError, match="Address already in use"):
            squatter.bind((server.host, server.port))
        url = await server.ensure_started()
        assert url == f"http://127.0.0.1:{server.port}"
        async with httpx.AsyncClient(timeout=5.0) as client:
            assert (await client.get(f"{url}/health")).status_code == 200  # served on the inherited socket
    finally:
        server.stop()
