"""A rollout's token streams: the training samples of its turns, and the retargetings the algorithms share.

Every algorithm is expressed as per-token streams of a `TrainSample`: which tokens train the `rl`
component (with what advantage), which the `ce` component and which the `ref_kl` component.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rl.packing.rows import TrainSample
from rollouts.types import Rollout, RolloutTurn


def env_token_messages(renderer: Any, previous: RolloutTurn, prompt_ids: list[int]) -> list[dict | None] | None:
    """The environment message each token of `prompt_ids` renders (None: template scaffolding, such as the next
    assistant turn's generation prompt, or the earlier turns); None when the renderer cannot attribute tokens to
    messages for this prompt.

    The renderer's attribution (`RenderedTokens.message_indices`) comes from bridging the previous turn's
    prompt and completion to its environment messages, else from rendering the prompt's messages afresh.
    """
    new_messages = previous.env_messages
    bridged = renderer.bridge_to_next_turn(previous.prompt_token_ids, previous.completion_token_ids, new_messages)
    if (
        bridged is not None
        and list(bridged.token_ids) == prompt_ids
        and len(bridged.message_indices) == len(prompt_ids)
    ):
        return [new_messages[i] if i >= 0 else None for i in bridged.message_indices]
    if previous.assistant_message is None:
        return None
    messages = [*previous.prompt_messages, previous.assistant_message, *new_messages]
    rendered = renderer.render(messages, add_generation_prompt=True)
    if list(rendered.token_ids) != prompt_ids or len(rendered.message_indices) != len(prompt_ids):
        return None  # tools in the prompt, or a renderer without attribution: these tokens train nothing
    first_new = len(messages) - len(new_messages)
    return [messages[i] if i >= first_new else None for i in rendered.message_indices]


def new_samples(rollout: Rollout) -> int:
    """Samples of `rollout` after its first (`rollout_to_samples`): turns whose prompt does not extend the previous
    prompt + completion, a re-render that broke the token prefix and split the conversation (0 when it is one)."""
    return max(0, len(rollout_to_samples(rollout, 0.0)) - 1)


def rollout_to_samples(
    rollout: Rollout,
    advantage: float,
    *,
    env_weights: dict[str, float] | None = None,
    renderer: Any = None,
    env_filter: Callable[[dict], bool] | None = None,
) -> list[TrainSample]:
    """The training samples of a rollout: one per run of turns whose prompts extend each other.

    When every turn's prompt starts with the previous prompt + completion (the renderer bridged the
    turns), the whole conversation is one sample with the completions trained; where a re-render broke
    the prefix, a new sample starts. With `env_weights` (echo: weight by role) and the task's `renderer`,
    each environment message's tokens in a later prompt get the cross-entropy weight of its own role (with
    `env_filter`, only the messages it keeps; it is asked once per message); template tokens outside any message (the
    next generation prompt) get none.
    """
    samples: list[TrainSample] = []
    input_ids: list[int] = []
    loss_mask: list[bool] = []
    sampling_logprobs: list[float] = []
    ce_weights: list[float] = []
    versions: list[int] = []

    def close_sample() -> None:
        # A sample's version is its oldest sampled token's: staleness is measured from it.
        samples.append(
            TrainSample(input_ids, loss_mask, sampling_logprobs, advantage, min(versions), ce_weights=ce_weights)
        )

    kept: dict[int, bool] = {}  # env_filter's answer by message (id)

    def weight(message: dict | None) -> float:
        if message is None or env_weights is None:
            return 0.0
        if env_filter is not None:
            if id(message) not in kept:
                kept[id(message)] = bool(env_filter(message))
            if not kept[id(message)]:
                return 0.0
        return env_weights.get(message["role"], 0.0)

    previous: RolloutTurn | None = None
    for turn in rollout.turns:
        if not turn.completion_token_ids:
            continue
        prompt = turn.prompt_token_ids
        if input_ids and prompt[: len(input_ids)] != input_ids:
            close_sample()
            input_ids, loss_mask, sampling_logprobs, ce_weights, versions = [], [], [], [], []
        new_prompt = prompt[len(input_ids) :]
        env_weight = [0.0] * len(new_prompt)
        if env_weights and input_ids and previous is not None and previous.env_messages:
            messages = env_token_messages(renderer, previous, list(prompt))
            if messages is not None:
                env_weight = [weight(message) for message in messages[len(input_ids) :]]
        input_ids = input_ids + new_prompt + turn.completion_token_ids
        loss_mask = loss_mask + [False] * len(new_prompt) + [True] * len(turn.completion_token_ids)
        sampling_logprobs = sampling_logprobs + [0.0] * len(new_prompt) + list(turn.completion_logprobs)
        ce_weights = ce_weights + env_weight + [0.0] * len(turn.completion_token_ids)
        versions.append(turn.policy_version)
        previous = turn
    if input_ids:
        close_sample()
    return samples


def spread_token_advantages(samples: list[TrainSample], token_advantages: list[float]) -> list[TrainSample]:
    """The rollout's samples with per-token advantages: its sampled tokens take `token_advantages` in order (the
    completions of its turns, as `rollout_to_samples` lays them out), every other token 0."""
    values = iter(token_advantages)
    for sample in samples:
        sample.advantages = [next(values) if sampled else 0.0 for sampled in sample.loss_mask]
    return samples


def sample_first_turns(rollout: Rollout) -> list[RolloutTurn]:
    """The turn each of `rollout_to_samples(rollout)`'s samples starts at (its prompt is the sample's prefix)."""
    firsts: list[RolloutTurn] = []
    input_ids: list[int] = []
    for turn in rollout.turns:
        if not turn.completion_token_ids:
            continue
        if not input_ids or turn.prompt_token_ids[: len(input_ids)] != input_ids:
            firsts.append(turn)
            input_ids = []
        input_ids = list(turn.prompt_token_ids) + list(turn.completion_token_ids)
    return firsts


def distill(sample: TrainSample, teacher_logprobs: list[float]) -> TrainSample:
    """The sample retargeted to the ref_kl component: its sampled tokens pulled towards the teacher."""
    return TrainSample(
        sample.input_ids,
        sample.loss_mask,
        sample.sampling_logprobs,
        0.0,
        sample.policy_version,
        rl_weights=[0.0] * len(sample.input_ids),
        ref_kl_weights=[float(m) for m in sample.loss_mask],
        ref_logprobs=list(teacher_logprobs),
    )


def ce_only(sample: TrainSample) -> TrainSample:
    """The sample retargeted to the ce component: cross-entropy on its sampled tokens, nothing else."""
    return TrainSample(
        sample.input_ids,
        [False] * len(sample.input_ids),
        [0.0] * len(sample.input_ids),
        0.0,
        sample.policy_version,
        ce_weights=[float(m) for m in sample.loss_mask],
    )
