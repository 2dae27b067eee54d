"""Typed records of what happened in a rollout: turns, status, rewards.

A `Rollout` is one trajectory of one sample of a task row; a `RolloutGroup` holds the
`group_size` rollouts of the same row (the unit GRPO computes advantages over). Every record
round-trips through JSON losslessly, so a run's rollouts file is a faithful debugging record.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from env_types.messages import Message, ToolCallError, message_text


class RolloutStatus(StrEnum):
    """Where a rollout stands. Every status but ONGOING is terminal."""

    ONGOING = "ongoing"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    """Stopped by a limit: max new tokens of a turn, max turns, or max total tokens."""
    PROMPT_OVERFLOW = "prompt_overflow"
    """The prompt alone exceeded the limit; nothing was sent to a generator."""
    ABORTED = "aborted"
    TIMEOUT = "timeout"
    ERROR = "error"

    def is_terminal(self) -> bool:
        return self is not RolloutStatus.ONGOING

    def is_trainable(self) -> bool:
        """Completed and truncated rollouts carry policy samples with a meaningful reward."""
        return self in (RolloutStatus.COMPLETED, RolloutStatus.TRUNCATED)

    def transition(self, new: RolloutStatus) -> RolloutStatus:
        """The next status; a terminal status never changes."""
        if self.is_terminal():
            raise ValueError(f"rollout status {self.value!r} is terminal; cannot move to {new.value!r}")
        return new


FAILED_STATUSES = (RolloutStatus.ERROR, RolloutStatus.TIMEOUT, RolloutStatus.ABORTED)
"""A rollout that ended in one of these failed (its environment, generator or reward function): it carries an `error`."""


@dataclass(frozen=True)
class GenerationRequest:
    """What to ask the generator for next."""

    prompt_token_ids: list[int]
    max_new_tokens: int
    seed: int | None = None
    """Per-request sampling seed (None: the engine's own random state)."""


@dataclass(frozen=True)
class Completion:
    """One sampled completion as the generator returns it."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    policy_version: int
    """The oldest policy version that sampled any of `token_ids`."""
    token_policy_versions: list[int] = field(default_factory=list)
    """Per token, the version that sampled it, when a weight update paused the request mid-completion and it
    continued under newer weights (`generator.on_weight_update = "continue"`); empty: `policy_version` sampled all."""


class GenerationFailed(Exception):
    """A generator could not complete one request (e.g. its engine rejected it).

    A batched `generate` returns it in that request's place (as `asyncio.gather(..., return_exceptions=True)`
    would) so the batch's other requests still get their completions; a single-request caller raises it.
    """


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RolloutTurn(_Record):
    """One generator call and the environment's answer to it."""

    prompt_messages: list[Message]
    """The conversation the generator saw (all history up to this turn)."""
    prompt_token_ids: list[int]
    """Exact tokens sent to the generator; a later turn's prompt extends this turn's prompt + completion."""
    completion_token_ids: list[int] = Field(default_factory=list)
    completion_logprobs: list[float] = Field(default_factory=list)
    """Sampler logprob of each completion token, aligned with `completion_token_ids`."""
    finish_reason: str | None = None
    """The generator's reason to stop: "stop", "length", "abort"."""
    assistant_message: Message | None = None
    """The completion parsed back to a message by the renderer."""
    env_messages: list[Message] = Field(default_factory=list)
    """What the environment answered (tool results, a new user message)."""
    reward_components: dict[str, float] = Field(default_factory=dict)
    """Rewards the environment assigned during this step, by name."""
    reward: float | None = None
    """The environment's reward for this turn (`StepOutput.reward`); the `env_reward` function sums them."""
    tool_call_errors: list[ToolCallError] = Field(default_factory=list)
    """Tool calls of this turn that were malformed or failed (each answered with an error message)."""
    policy_version: int = 0
    """Version of the policy weights that sampled `completion_token_ids` (the oldest, when several did)."""
    token_policy_versions: list[int] = Field(default_factory=list)
    """Version that sampled each completion token, aligned with `completion_token_ids`, when a weight update paused
    the turn mid-completion and it continued under newer weights; empty: `policy_version` sampled all of them."""


class Rollout(_Record):
    """One trajectory: its turns, how it ended, and its reward."""

    rollout_id: str
    group_id: str
    task_name: str
    sample_index: int
    turns: list[RolloutTurn] = Field(default_factory=list)
    status: RolloutStatus = RolloutStatus.ONGOING
    reward: float | None = None
    reward_components: dict[str, float] = Field(default_factory=dict)
    error: str | None = None
    """Exception text when an environment, generator or reward function failed."""
    advantage: float | None = None
    """The credit its task's algorithm gave it, set once when its group is scored (None: no rl credit); with
    `token_advantages`, their mean."""
    token_advantages: list[float] | None = None
    """Per-token credit, one value per sampled token (every turn's completion, in order), when the algorithm gives
    it (a `custom` function returning a list for the rollout); None: `advantage` on every sampled token."""
    dispatch_policy_version: int | None = None
    """The policy version the generators served when its row was dispatched (stamped by the loop; a rollout with
    no turn has no sampled version, so its sample log shows this one)."""
    unsampled_prompt: list[Message] = Field(default_factory=list)
    """A rollout that ended before its first turn (a failed generator call, an overflowing prompt): the
    environment's first prompt, which no turn records."""
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def policy_versions(self) -> list[int]:
        return [turn.policy_version for turn in self.turns]

    @property
    def num_completion_tokens(self) -> int:
        return sum(len(turn.completion_token_ids) for turn in self.turns)

    @property
    def num_malformed_tool_calls(self) -> int:
        return sum(error.is_malformed for turn in self.turns for error in turn.tool_call_errors)

    def last_assistant_text(self) -> str:
        """Content of the last assistant message, "" when there is none."""
        for turn in reversed(self.turns):
            if turn.assistant_message is not None:
                return message_text(turn.assistant_message)
        return ""

    def fail(self, status: RolloutStatus, error: str) -> None:
        """Move an ongoing rollout to a failure status, keeping its partial turns."""
        self.status = self.status.transition(status)
        self.error = error


class RolloutGroup(_Record):
    """The rollouts sampled for one task row; GRPO's advantage baseline is taken over it."""

    group_id: str
    task_name: str
    example: dict[str, Any]
    rollouts: list[Rollout]

    @property
    def min_policy_version(self) -> int:
        """Oldest policy version that sampled any token of the group (staleness is measured from it)."""
        versions = [v for rollout in self.rollouts for v in rollout.policy_versions]
        return min(versions) if versions else 0


def mark_frozen(groups: list[RolloutGroup], sampler: str) -> None:
    """Record who sampled the groups' rollouts: frozen model `sampler` (`[models.<name>]`), not the policy."""
    for group in groups:
        for rollout in group.rollouts:
            rollout.metadata["sampler"] = sampler


def is_frozen_sampled(group: RolloutGroup) -> bool:
    """Sampled by a frozen model: its sampler never changes, so it never goes stale (buffer, policy lag)."""
    return bool(group.rollouts) and all(r.metadata.get("sampler", "policy") != "policy" for r in group.rollouts)
