"""The environment a task author writes: messages in, messages out, no tokens."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

from env_types.messages import Message, ToolCallError


@dataclass(frozen=True)
class ResetOutput:
    """The conversation the first assistant turn answers, and the tools it may call."""

    messages: list[Message]
    tools: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class StepOutput:
    """The environment's answer to an assistant message.

    `messages` are appended to the conversation (tool results, a new user turn);
    `reward_components` are rewards the environment can assign on the spot and `reward` this
    turn's reward (both recorded on the turn); `tool_call_errors` are the tool calls of the
    assistant message that were wrong or failed (recorded on the turn, counted in metrics);
    `done` ends the rollout as COMPLETED.
    """

    messages: list[Message] = field(default_factory=list)
    reward_components: dict[str, float] = field(default_factory=dict)
    done: bool = True
    reward: float | None = None
    tool_call_errors: list[ToolCallError] = field(default_factory=list)


class MessageEnv(abc.ABC):
    """A conversation partner for the policy.

    Example (single turn, the usual case):

        class EchoEnv(MessageEnv):
            def __init__(self, question: str):
                self.question = question

            async def reset(self) -> ResetOutput:
                return ResetOutput(messages=[{"role": "user", "content": self.question}])

            async def step(self, assistant_message: Message) -> StepOutput:
                return StepOutput(done=True)

    Rewards are normally computed after the rollout by the task's `Rubric`, which sees the
    whole group; `StepOutput.reward_components` is for rewards only the environment can know.
    """

    @abc.abstractmethod
    async def reset(self) -> ResetOutput: ...

    @abc.abstractmethod
    async def step(self, assistant_message: Message) -> StepOutput: ...

    async def close(self) -> None:
        """Release resources (sandboxes, connections). Called once the rollout is terminal."""
