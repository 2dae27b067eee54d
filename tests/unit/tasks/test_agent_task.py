"""`tasks.agent:AgentTask` in-process: a black-box agent's calls become the rollout's turns through the gateway, its
return value the reward (through the task's rubric); what it does wrong becomes an ERROR or TIMEOUT rollout."""

import asyncio
import re
import tomllib

import pytest

from rl.config.tasks import TaskConfig
from rollouts.types import RolloutStatus
from tasks.agent import AgentTask
from tasks.build import build_task
from tests.support.gateway_rollouts import IM_END, play
from tests.support.paths import REPO

AGENTS = "tests.support.agents"


def args(agent, **extra):
    return {"agent": f"{AGENTS}:{agent}", "rows": f"{AGENTS}:sum_rows", **extra}


async def test_the_agents_calls_are_its_turns_and_its_return_value_the_reward(renderer, tokenizer):
    built = build_task(TaskConfig(name="agent", args=args("two_turn_agent")))
    assert built.rollout_fn == built.task.rollout  # the task's own rollouts, not a MessageEnv's
    rollouts = await play(built.task, renderer, tokenizer)
    for rollout in rollouts:
        assert rollout.status is RolloutStatus.COMPLETED and len(rollout.turns) == 2
        assert rollout.turns[0].prompt_messages == [{"role": "user", "content": "What is 1 + 3?"}]
        sampled = rollout.turns[0].prompt_token_ids + rollout.turns[0].completion_token_ids
        assert rollout.turns[1].prompt_token_ids[: len(sampled)] == sampled
        assert rollout.turns[1].policy_version == 7
        assert rollout.turns[1].completion_token_ids == [
            *tokenizer.encode("It is 7.", add_special_tokens=False),
            IM_END,
        ]
        tokens = len(rollout.turns[1].completion_token_ids)
        assert rollout.reward == pytest.approx(1 / (1 + tokens))
        assert rollout.reward_components == {"agent_reward": pytest.approx(1 / (1 + tokens))}


@pytest.mark.parametrize(
    "agent, status, error",
    [
        ("failing_agent", RolloutStatus.ERROR, "the agent returned None"),
        ("raising_agent", RolloutStatus.ERROR, "RuntimeError: agent crashed on row 1"),
        ("nan_agent", RolloutStatus.ERROR, "agent 'nan_agent' returned nan"),
    ],
)
async def test_an_agent_that_fails_makes_an_error_rollout(renderer, tokenizer, agent, status, error):
    task = AgentTask(**args(agent))
    task.rubric = task.build_rubric()
    rollouts = await play(task, renderer, tokenizer)
    for rollout in rollouts:
        assert rollout.status is status and error in rollout.error
        assert rollout.reward == 0.0  # the rubric's error_reward


async def test_an_agent_past_its_timeout_is_a_timeout(renderer, tokenizer):
    task = AgentTask(**args("slow_agent", timeout_s=0.2))
    task.rubric = task.build_rubric()
    [rollout] = await asyncio.wait_for(play(task, renderer, tokenizer, group_size=1), 10)
    assert rollout.status is RolloutStatus.TIMEOUT and "timeout_s=0.2" in rollout.error


def test_bad_arguments_and_missing_rows_are_named():
    with pytest.raises(ValueError, match="must be an `async def run"):
        AgentTask(agent=f"{AGENTS}:sync_agent")
    with pytest.raises(ValueError, match="has no attribute 'nope'"):
        AgentTask(agent=f"{AGENTS}:nope")
    without_rows = AgentTask(agent=f"{AGENTS}:two_turn_agent")
    with pytest.raises(ValueError, match=r"needs rows: set args.rows"):
        without_rows.load_dataset("train")
    assert without_rows.load_dataset("validation") == []
    assert len(AgentTask(**args("two_turn_agent")).load_dataset("validation")) == 2


async def test_the_docs_agent_runs_as_a_users_package(renderer, tokenizer, tmp_path, monkeypatch):
    """The twenty-line agent of docs/agents.md, taken from the page, trains through AgentTask as written."""
    page = (REPO / "docs" / "agents.md").read_text()
    [agent_code] = [block for block in re.findall(r"```python\n(.*?)```", page, flags=re.S) if "async def run" in block]
    assert len(agent_code.strip().splitlines()) <= 22
    (tmp_path / "my_agents").mkdir()
    (tmp_path / "my_agents" / "__init__.py").write_text("")
    (tmp_path / "my_agents" / "quiz.py").write_text(agent_code)
    monkeypatch.syspath_prepend(str(tmp_path))
    [toml] = [block for block in re.findall(r"```toml\n(.*?)```", page, flags=re.S) if "my_agents.quiz:run" in block]
    task_config = tomllib.loads(toml)["tasks"][0]
    built = build_task(TaskConfig(**task_config))
    assert len(built.load_rows("train")) == 90 and len(built.load_rows("validation")) == 10
    for reply, reward in (("0", 1.0), ("1", 0.0)):  # the first training row asks for 0 + 0
        [rollout] = await play(built.task, renderer, tokenizer, group_size=1, reply=reply)
        assert rollout.status is RolloutStatus.COMPLETED and len(rollout.turns) == 2
        assert "gateway_new_samples" not in rollout.metadata  # the returned message, sent back, bridges
        assert rollout.reward == reward
