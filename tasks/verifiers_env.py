"""A verifiers (v1) environment as a task: its taskset's tasks are the rows, its own agent loop plays each rollout
through rlmesh's gateway, and its own rubric (the task's `@vf.reward`s, weighted) is the reward.

    [[tasks]]
    name = "verifiers"
    args = { taskset = "my_envs.quiz", taskset_args = { num_tasks = 40 }, num_validation = 8 }
    env = { max_turns = 1, max_new_tokens = 64, max_total_tokens = 512, max_prompt_tokens = 448 }

`taskset` is a verifiers taskset id (an installed package or a local module exporting its `vf.Taskset` subclass
through `__all__`, as `vf.load_taskset` resolves it), `taskset_args` its config's fields, `env` an `Env` id (empty:
the taskset's own, else `SingleAgentEnv`). Each rollout runs `Env.run_episode` with every seat's harness replaced by
`tasks.verifiers_harness:GatewayChatHarness` (a single-turn chat run in-process: no uv program, no network) on the
local runtime; its model call goes through verifiers' interception server to an `EvalClientConfig` pointed at the
rollout's own gateway URL, so every call is sampled by the policy and recorded token-exact as one turn. The
episode's trace is scored by the task's own rewards (`trace.reward`); an episode with several seats (traces) gets
the mean of their rewards, with a warning (`seats_reward`); an episode that fails (its errors) or records no reward is
an ERROR rollout.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import sys
import traceback
from typing import Any

from env_types.message_env import MessageEnv
from rl.console import warn
from rollouts.fanout import RolloutContext, RolloutFn
from rollouts.openai_gateway import OpenAIGateway
from rollouts.reward_value import InvalidReward, checked_reward
from rollouts.types import Rollout, RolloutStatus
from rubrics.rubric import RewardFn, Rubric
from tasks.task import Split, Task

HARNESS_ID = "rlmesh_gateway_chat"
"""The harness id verifiers resolves to `tasks.verifiers_harness:GatewayChatHarness` (an alias of its module)."""


def plugin_id(module_path: str) -> str:
    """A verifiers plugin id for `module_path`: itself when it is a top-level module (an installed environment
    package), else a top-level alias of the imported module (verifiers' loaders import ids as top-level names)."""
    if "." not in module_path:
        return module_path
    alias = "rlmesh_vf_" + module_path.replace(".", "__").lower()
    sys.modules.setdefault(alias, importlib.import_module(module_path))
    return alias


def seats_reward(rewards: list[float]) -> tuple[float, str | None]:
    """The rollout's reward from an episode's rewards, one per seat (trace): their mean, which every seat's turns train
    on (all seats call the policy through the rollout's one gateway session, so their turns are one rollout); with a
    warning when there are several seats (in a zero-sum game the mean is constant: no learning signal)."""
    mean = sum(rewards) / len(rewards)
    if len(rewards) == 1:
        return mean, None
    return mean, (
        f"verifiers episodes have {len(rewards)} seats (rewards {rewards} in the first): every seat's turns train on "
        "their mean, one reward for all (in a zero-sum game a constant: no learning signal). Train one seat per "
        "environment, or give the seats a shared objective; each episode's seat rewards are in the rollout's "
        "metadata `verifiers_seat_rewards`"
    )


def verifiers_reward(rollout: Rollout, example: dict[str, Any]) -> float:
    """The episode's reward under the environment's own rubric (its weighted `@vf.reward`s)."""
    return rollout.metadata["verifiers_reward"]


class VerifiersTask(Task):
    """Rollouts of verifiers taskset `taskset` (config fields `taskset_args`) in env `env`, through the gateway.

    The held-out split is the taskset's first `num_validation` tasks, the training split the rest.
    """

    def __init__(
        self,
        taskset: str,
        taskset_args: dict[str, Any] | None = None,
        env: str = "",
        num_validation: int = 0,
        timeout_s: float = 300.0,
        call_timeout_s: float = 120.0,
        host: str = "127.0.0.1",
        port: int = 0,
    ):
        """`host`/`port`: where the gateway listens (loopback, a free port, unless set)."""
        import verifiers.v1 as vf

        if timeout_s <= 0 or call_timeout_s <= 0:
            raise ValueError(f"timeout_s and call_timeout_s must be > 0, got {timeout_s} and {call_timeout_s}")
        if num_validation < 0:
            raise ValueError(f"num_validation must be >= 0, got {num_validation}")
        from verifiers.v1.configs.agent import agent_config_fields

        sys.modules.setdefault(HARNESS_ID, importlib.import_module("tasks.verifiers_harness"))
        taskset_id, env_id = plugin_id(taskset), plugin_id(env) if env else ""
        self.env_config = vf.resolve_env_config({"id": env_id, "taskset": {"id": taskset_id, **(taskset_args or {})}})
        for role in agent_config_fields(self.env_config).values():
            role.harness = vf.HarnessConfig(id=HARNESS_ID)  # every seat plays through the gateway, in-process,
            role.runtime = vf.SubprocessConfig()  # on this host (a remote runtime would need a Prime tunnel)
        self.env = vf.load_environment(self.env_config)
        self.tasks = list(self.env.taskset)
        self._warned_seats = False  # the multi-seat warning, once per task
        if len(self.tasks) <= num_validation:
            raise ValueError(
                f"verifiers taskset {taskset!r} has {len(self.tasks)} tasks, not more than num_validation = "
                f"{num_validation}: no training tasks left"
            )
        self.num_validation = num_validation
        self.timeout_s, self.call_timeout_s = timeout_s, call_timeout_s
        self.gateway = OpenAIGateway(host, port)
        """Started on the first rollout, in the process that plays them (the controller's)."""
        self._serving_loop: asyncio.AbstractEventLoop | None = None
        self._serving_lock: asyncio.Lock | None = None
        self._serving_stack = contextlib.AsyncExitStack()
        self._serving_entered = False

    async def _ensure_serving(self) -> None:
        """Enter the env's `serving()` (its interception server, shared by the rollouts) once per event loop; it
        stays up for the task's life, like the gateway. Rollouts run concurrently, so they must not each enter it."""
        loop = asyncio.get_running_loop()
        if self._serving_loop is not loop:
            self._serving_loop, self._serving_lock = loop, asyncio.Lock()
            self._serving_stack = contextlib.AsyncExitStack()
            self._serving_entered = False
        assert self._serving_lock is not None
        async with self._serving_lock:
            if not self._serving_entered:
                await self._serving_stack.enter_async_context(self.env.serving())
                self._serving_entered = True

    async def _release_client(self, client: Any) -> None:
        """Close the HTTP client verifiers' interception servers made for `client`: they keep one per distinct endpoint
        config until they close, and each rollout's config is its own (its gateway URL), so a long run would otherwise
        hold one client and its keep-alive connection per rollout."""
        key = client.model_dump_json()
        for server in getattr(self.env._interception, "servers", []):
            made = server.clients.pop(key, None)
            if made is not None:
                await made.close()

    def load_dataset(self, split: Split) -> list[dict[str, Any]]:
        chosen = self.tasks[: self.num_validation] if split == "validation" else self.tasks[self.num_validation :]
        return [{"index": task.data.idx, **task.data.model_dump(mode="json", exclude_defaults=True)} for task in chosen]

    def make_env(self, example: dict[str, Any]) -> MessageEnv:
        raise TypeError("a VerifiersTask's rollouts are verifiers episodes through the gateway, not a MessageEnv")

    def build_rubric(self) -> Rubric:
        return Rubric([RewardFn(verifiers_reward, weight=1.0)], error_reward=0.0)

    def rollout_fn(self) -> RolloutFn:
        return self.rollout

    async def rollout(self, row: dict[str, Any], context: RolloutContext) -> Rollout:
        """One verifiers episode of the row's task; its model calls are the rollout's turns."""
        import verifiers.v1 as vf

        rollout = context.new_rollout()
        async with self.gateway.session(
            rollout,
            context.renderer,
            context.env_config,
            context.generate,
            call_timeout_s=self.call_timeout_s,
            run_seed=context.run_seed,
        ) as session:
            key_var = f"RLMESH_GATEWAY_KEY_{session.key}"
            os.environ[key_var] = session.key  # verifiers reads an endpoint's API key from an environment variable
            client = vf.EvalClientConfig(base_url=self.gateway.base_url(session), api_key_var=key_var)
            try:
                await self._ensure_serving()
                episode = await asyncio.wait_for(
                    self.env.run_episode(self.tasks[row["index"]], vf.ModelContext(model="policy", client=client)),
                    self.timeout_s,
                )
            except TimeoutError:
                rollout.fail(
                    RolloutStatus.TIMEOUT, f"the verifiers episode took longer than timeout_s={self.timeout_s} s"
                )
                return rollout
            except Exception as exc:
                rollout.fail(RolloutStatus.ERROR, "".join(traceback.format_exception(exc))[-4000:])
                return rollout
            finally:
                os.environ.pop(key_var, None)
                await self._release_client(client)
        errors = [*episode.errors, *(error for trace in episode.traces for error in trace.errors)]
        if errors or not episode.ok:
            described = "; ".join(f"{error.type}: {error.message}" for error in errors) or "the episode is not ok"
            rollout.fail(RolloutStatus.ERROR, f"verifiers episode failed: {described}"[-4000:])
            return rollout
        if not any(trace.rewards for trace in episode.traces):
            rollout.fail(RolloutStatus.ERROR, "the verifiers episode recorded no reward (its task has no @vf.reward)")
            return rollout
        try:
            rewards = [checked_reward(trace.reward, "the verifiers rubric") for trace in episode.traces]
        except InvalidReward as exc:
            rollout.fail(RolloutStatus.ERROR, str(exc))
            return rollout
        rollout.metadata["verifiers_reward"], warning = seats_reward(rewards)
        rollout.metadata["verifiers_seat_rewards"] = rewards
        if warning is not None and not self._warned_seats:
            self._warned_seats = True
            warn(warning)
        rollout.status = RolloutStatus.TRUNCATED if session.hit_limit else RolloutStatus.COMPLETED
        return rollout
