"""Token plumbing around a `MessageEnv`: render prompts, parse completions, enforce limits.

`RendererEnv` owns the rollout record and its status. The controller only moves tokens:
it asks for a prompt, sends it to a generator, and hands back the completion. Multi-turn
prompts extend the previous prompt + sampled completion token-for-token (the renderer's
`bridge_to_next_turn`), so the tokens trained on are exactly the tokens sampled.
"""

from __future__ import annotations

import asyncio
import hashlib
import traceback
from typing import Any

from env_types.message_env import MessageEnv, ResetOutput, StepOutput
from env_types.renderer import invalid_tool_call_errors, next_turn_prompt, parse_completion, render_prompt
from rl.config.tasks import RendererEnvConfig
from rollouts.reward_value import checked_reward
from rollouts.types import Completion, GenerationRequest, Message, Rollout, RolloutStatus, RolloutTurn


def sampling_seed(run_seed: int, rollout_id: str, turn: int) -> int:
    """The sampling seed of one turn of one rollout: a stable hash of the run's seed, the rollout id and the turn.

    Each request samples from its own generator seeded with it, so what a rollout samples does not
    depend on engine state, on which replica serves it or on which requests it was batched with.
    """
    digest = hashlib.sha256(f"{run_seed}/{rollout_id}/{turn}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


class RendererEnv:
    """Runs one rollout of a `MessageEnv` with a renderer, recording every turn."""

    def __init__(
        self,
        env: MessageEnv,
        renderer: Any,
        config: RendererEnvConfig,
        rollout: Rollout,
        run_seed: int | None = None,
    ):
        self.env = env
        self.run_seed = run_seed
        self.renderer = renderer
        self.config = config
        self.rollout = rollout
        self._messages: list[Message] = []
        self._tools: list[dict[str, Any]] | None = None
        self._prompt_token_ids: list[int] = []

    @property
    def done(self) -> bool:
        return self.rollout.status.is_terminal()

    async def start(self) -> GenerationRequest | None:
        """Reset the environment and render the first prompt; None if the rollout already ended."""
        try:
            return await self._start()
        except Exception as exc:
            await self._fail_from_exception(exc)
            return None

    async def step(self, completion: Completion) -> GenerationRequest | None:
        """Record a completion, let the environment answer, and return the next request if any.

        Anything the environment or renderer raises, returns malformed, or takes longer than
        `env_timeout_s` for ends the rollout as ERROR or TIMEOUT, keeping the turns so far.
        """
        try:
            return await self._step(completion)
        except Exception as exc:
            await self._fail_from_exception(exc)
            return None

    async def _start(self) -> GenerationRequest | None:
        reset = await asyncio.wait_for(self.env.reset(), self.config.env_timeout_s)
        _check_type(reset, ResetOutput, "reset")
        self._messages = list(reset.messages)
        self._tools = reset.tools
        return await self._next_request(render_prompt(self.renderer, self._messages, tools=self._tools))

    async def _step(self, completion: Completion) -> GenerationRequest | None:
        turn = RolloutTurn(
            prompt_messages=list(self._messages),
            prompt_token_ids=self._prompt_token_ids,
            completion_token_ids=completion.token_ids,
            completion_logprobs=completion.logprobs,
            finish_reason=completion.finish_reason,
            policy_version=completion.policy_version,
            token_policy_versions=completion.token_policy_versions,
        )
        self.rollout.turns.append(turn)
        assistant_message = parse_completion(
            self.renderer, completion.token_ids, prompt_ids=self._prompt_token_ids, tools=self._tools
        )
        turn.assistant_message = assistant_message
        turn.tool_call_errors = invalid_tool_call_errors(assistant_message)
        self._messages.append(assistant_message)
        if completion.finish_reason == "abort":
            return await self._finish(RolloutStatus.ABORTED)
        if completion.finish_reason == "length":
            return await self._finish(RolloutStatus.TRUNCATED)

        env_step = await asyncio.wait_for(self.env.step(assistant_message), self.config.env_timeout_s)
        _check_type(env_step, StepOutput, "step")
        turn.env_messages = list(env_step.messages)
        turn.reward_components = dict(env_step.reward_components)
        if env_step.reward is not None:
            turn.reward = checked_reward(env_step.reward, f"{type(self.env).__name__}.step")
        turn.tool_call_errors = [*turn.tool_call_errors, *env_step.tool_call_errors]
        if env_step.done:
            return await self._finish(RolloutStatus.COMPLETED)
        if len(self.rollout.turns) >= self.config.max_turns:
            return await self._finish(RolloutStatus.TRUNCATED)
        next_prompt_token_ids = next_turn_prompt(
            self.renderer,
            self._messages,
            self._prompt_token_ids,
            completion.token_ids,
            env_step.messages,
            tools=self._tools,
        )
        self._messages.extend(env_step.messages)
        return await self._next_request(next_prompt_token_ids)

    async def abort(self, status: RolloutStatus, error: str) -> None:
        """End the rollout from outside (a failed generator call, a cancelled run)."""
        if not self.done:
            self.rollout.fail(status, error)
            self._keep_unsampled_prompt()
            await self._close_env()

    async def _next_request(self, prompt_token_ids: list[int]) -> GenerationRequest | None:
        if len(prompt_token_ids) > self.config.max_prompt_tokens:
            status = RolloutStatus.PROMPT_OVERFLOW if not self.rollout.turns else RolloutStatus.TRUNCATED
            return await self._finish(status)
        # >= 1: the prompt fits max_prompt_tokens, which is below max_total_tokens
        budget = min(self.config.max_new_tokens, self.config.max_total_tokens - len(prompt_token_ids))
        self._prompt_token_ids = prompt_token_ids
        seed = (
            None
            if self.run_seed is None
            else sampling_seed(self.run_seed, self.rollout.rollout_id, len(self.rollout.turns))
        )
        return GenerationRequest(prompt_token_ids=prompt_token_ids, max_new_tokens=budget, seed=seed)

    async def _finish(self, status: RolloutStatus) -> None:
        self.rollout.status = self.rollout.status.transition(status)
        self._keep_unsampled_prompt()
        await self._close_env()
        return None

    def _keep_unsampled_prompt(self) -> None:
        """A rollout ending before its first turn keeps the prompt it was rendered (no turn records it)."""
        if not self.rollout.turns:
            self.rollout.unsampled_prompt = list(self._messages)

    async def _fail_from_exception(self, exc: BaseException) -> None:
        if isinstance(exc, asyncio.TimeoutError):
            await self.abort(RolloutStatus.TIMEOUT, f"environment took longer than {self.config.env_timeout_s} s")
        else:
            await self.abort(RolloutStatus.ERROR, "".join(traceback.format_exception(exc))[-4000:])

    async def _close_env(self) -> None:
        try:
            await asyncio.wait_for(self.env.close(), self.config.env_timeout_s)
        except Exception as exc:
            self.rollout.metadata["close_error"] = repr(exc)


def _check_type(value: Any, expected: type, method: str) -> None:
    if not isinstance(value, expected):
        raise TypeError(f"MessageEnv.{method} returned {type(value).__name__}, expected {expected.__name__}")
