"""A black-box agent as a task: any `async def run(client, row) -> float | None` written against the OpenAI API.

    [[tasks]]
    name = "agent"
    args = { agent = "my_agents.quiz:run", rows = "my_agents.quiz:rows" }
    env = { max_turns = 2, max_new_tokens = 64, max_total_tokens = 512, max_prompt_tokens = 448 }

Each sample of a row calls `run(client, row)` once, with an `openai.AsyncOpenAI` client whose base URL and key
are the rollout's own on the gateway (`rollouts.openai_gateway`): every chat or completions call it makes is
sampled by the policy's generators and recorded as one turn of the rollout, token-exact, with logprobs and
policy version. The agent returns its reward (None: it failed; the rollout is an ERROR). Group sampling,
staleness, algorithms, sample logs and resume are the same as for any task. `[tasks.env]` bounds each call
(`max_turns` is the number of calls, the token limits those of a call's prompt and completion); `timeout_s`
bounds the whole agent, `call_timeout_s` each call.

Rows come from `rows = "pkg.module:fn"` (`fn(split) -> list[dict]`, split "train" or "validation") or from
the task's `[tasks.data]` files.
"""

from __future__ import annotations

import asyncio
import inspect
import traceback
from typing import Any

from env_types.message_env import MessageEnv
from rl.components import fn_name, import_object
from rollouts.fanout import RolloutContext, RolloutFn
from rollouts.openai_gateway import OpenAIGateway
from rollouts.reward_value import InvalidReward, checked_reward
from rollouts.types import Rollout, RolloutStatus
from rubrics.rubric import RewardFn, Rubric
from tasks.task import Split, Task


def agent_reward(rollout: Rollout, example: dict[str, Any]) -> float:
    """The reward the agent returned for its rollout."""
    return rollout.metadata["agent_reward"]


class AgentTask(Task):
    """Rollouts played by `agent` (import path of `async def run(client, row) -> float | None`)."""

    def __init__(
        self,
        agent: str,
        rows: str | None = None,
        timeout_s: float = 300.0,
        call_timeout_s: float = 120.0,
        host: str = "127.0.0.1",
        port: int = 0,
    ):
        """`host`/`port`: where the gateway listens (loopback, a free port, unless set)."""
        self.agent = import_object(agent)
        if not inspect.iscoroutinefunction(self.agent):
            raise ValueError(f"agent {agent!r} must be an `async def run(client, row)`, got {self.agent!r}")
        self.rows = import_object(rows) if rows is not None else None
        if timeout_s <= 0 or call_timeout_s <= 0:
            raise ValueError(f"timeout_s and call_timeout_s must be > 0, got {timeout_s} and {call_timeout_s}")
        self.timeout_s, self.call_timeout_s = timeout_s, call_timeout_s
        self.gateway = OpenAIGateway(host, port)
        """Started on the first rollout, in the process that plays them (the controller's)."""

    def load_dataset(self, split: Split) -> list[dict[str, Any]]:
        if self.rows is None:
            if split == "train":
                raise ValueError("an agent task needs rows: set args.rows = 'pkg.module:fn' or [tasks.data] train")
            return []
        rows = self.rows(split)
        if not isinstance(rows, list):
            raise ValueError(f"rows function {fn_name(self.rows)!r} returned {type(rows).__name__}, not a list")
        return rows

    def make_env(self, example: dict[str, Any]) -> MessageEnv:
        raise TypeError("an AgentTask's rollouts are its agent's calls through the gateway, not a MessageEnv")

    def build_rubric(self) -> Rubric:
        return Rubric([RewardFn(agent_reward, weight=1.0)], error_reward=0.0)

    def rollout_fn(self) -> RolloutFn:
        return self.rollout

    async def rollout(self, row: dict[str, Any], context: RolloutContext) -> Rollout:
        """One run of the agent on `row`; its calls are the rollout's turns, its return value the reward."""
        import openai

        rollout = context.new_rollout()
        limits = context.env_config
        async with self.gateway.session(
            rollout,
            context.renderer,
            limits,
            context.generate,
            call_timeout_s=self.call_timeout_s,
            run_seed=context.run_seed,
        ) as session:
            client = openai.AsyncOpenAI(
                base_url=self.gateway.base_url(session),
                api_key=session.key,
                max_retries=0,
                timeout=self.call_timeout_s + 10,
            )
            try:
                reward = await asyncio.wait_for(self.agent(client, row), self.timeout_s)
            except TimeoutError:
                rollout.fail(RolloutStatus.TIMEOUT, f"the agent took longer than timeout_s={self.timeout_s} s")
                return rollout
            except Exception as exc:
                rollout.fail(RolloutStatus.ERROR, "".join(traceback.format_exception(exc))[-4000:])
                return rollout
            finally:
                await client.close()
        if reward is None:
            rollout.fail(RolloutStatus.ERROR, "the agent returned None (its own error)")
            return rollout
        try:
            rollout.metadata["agent_reward"] = checked_reward(reward, f"agent {fn_name(self.agent)!r}")
        except InvalidReward as exc:
            rollout.fail(RolloutStatus.ERROR, str(exc))
            return rollout
        rollout.status = RolloutStatus.TRUNCATED if session.hit_limit else RolloutStatus.COMPLETED
        return rollout
