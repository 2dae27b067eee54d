"""Sample-level logging: one flat dict per trained rollout, filtered, recorded as Reduce.SAMPLE.

Samples are built when their batch is trained and logged under the step that trained them (wandb steps
only increase); the advantage is the one the step trained with (`Rollout.advantage`, computed once). Filters (`[sample_logging.filters]`)
pick which ones reach the backends; the defaults keep the best and the worst sample of each step.
"""

from __future__ import annotations

import json
import random
from collections.abc import Awaitable, Callable
from typing import Any

from rl.algorithms.streams import rollout_to_samples
from rl.components import import_object
from rl.config import Config
from rl.config.metrics import SampleFilters, SampleLoggingConfig
from rl.metrics.reduce import Reduce, record_metric
from rollouts.types import FAILED_STATUSES, Rollout, RolloutGroup, message_text

SAMPLES_KEY = "reward/samples"

ReferenceLogprobs = Callable[[list[int]], Awaitable[list[float] | None]]
"""token ids → logprob of each token under the reference model (None without one): the trainer's `logprobs`."""


async def mean_reference_logprob(rollout: Rollout, reference_logprobs: ReferenceLogprobs) -> float | None:
    """Mean reference logprob of the rollout's sampled tokens, over its training sequences; None without a reference."""
    total, count = 0.0, 0
    for sample in rollout_to_samples(rollout, advantage=0.0):
        logprobs = await reference_logprobs(sample.input_ids)
        if logprobs is None:
            return None
        total += sum(logprob for logprob, trained in zip(logprobs, sample.loss_mask) if trained)
        count += sum(sample.loss_mask)
    return total / count if count else None


def sample_record(
    rollout: Rollout,
    *,
    episode_id: int | None,
    target: str | None,
    advantage: float | None,
    example: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The seed's fields for one rollout, plus its task, status, id and reward components (`reward/<fn>`).

    prompt: the first turn's messages as `role: text` lines; response: every assistant reply (and, in
    multi-turn rollouts, the environment's messages between them as `role: text`); lengths in tokens,
    request_len of the first prompt, response_len of all sampled tokens; policy_version of the oldest
    sampled token. `ref_logprobs` is filled in later, and only when the run has a reference model. `error`: why a
    failed rollout (status error, timeout, aborted) failed, e.g. its reward function's exception; None otherwise.
    A rollout with no turn shows the version its row was dispatched under and the prompt its environment rendered,
    or, when it failed before that, its row (`example`) as JSON.
    """
    first = rollout.turns[0] if rollout.turns else None
    if first is not None:
        prompt_messages = first.prompt_messages
    else:
        prompt_messages = rollout.unsampled_prompt
    prompt = "\n".join(f"{m['role']}: {message_text(m)}" for m in prompt_messages)
    if not prompt and example is not None:
        prompt = "row: " + json.dumps(example, default=str, sort_keys=True)
    response: list[str] = []
    for turn in rollout.turns:
        if turn.assistant_message is not None:
            response.append(message_text(turn.assistant_message))
        response.extend(f"{m['role']}: {message_text(m)}" for m in turn.env_messages)
    return {
        "episode_id": episode_id,
        "policy_version": min(rollout.policy_versions) if rollout.turns else rollout.dispatch_policy_version,
        "task": rollout.task_name,
        "prompt": prompt,
        "response": "\n".join(response),
        "target": target,
        "reward": rollout.reward,
        "advantage": advantage,
        "request_len": len(first.prompt_token_ids) if first else 0,
        "response_len": rollout.num_completion_tokens,
        "ref_logprobs": None,
        "status": rollout.status.value,
        "error": rollout.error,
        "rollout_id": rollout.rollout_id,
        **{f"reward/{name}": value for name, value in sorted(rollout.reward_components.items())},
    }


class SampleFilter:
    """`[sample_logging.filters]` applied to one step's samples, in order: the step gate, the per-sample
    tests (reward tails, |advantage|, the custom predicate), seeded `freq` subsampling, then top/bottom-k."""

    def __init__(self, filters: SampleFilters, seed: int):
        self.filters = filters
        self.seed = seed
        self.predicate: Callable[[dict[str, Any]], bool] | None = (
            import_object(filters.predicate) if filters.predicate else None
        )

    def wants_step(self, step: int) -> bool:
        return step % self.filters.step == 0

    def passes(self, sample: dict[str, Any]) -> bool:
        f, reward, advantage = self.filters, sample["reward"], sample["advantage"]
        bounds = [bound for bound in (f.reward_below, f.reward_above) if bound is not None]
        if bounds and reward is None:
            return False  # an unscored sample is in neither tail
        tails = [(f.reward_below, lambda bound: reward <= bound), (f.reward_above, lambda bound: reward >= bound)]
        if bounds and not any(test(bound) for bound, test in tails if bound is not None):
            return False
        if f.abs_advantage_above is not None and (advantage is None or abs(advantage) < f.abs_advantage_above):
            return False
        return self.predicate is None or bool(self.predicate(sample))

    def select(self, samples: list[dict[str, Any]], step: int) -> list[dict[str, Any]]:
        """The samples of `step` to log, in episode order."""
        f = self.filters
        if not self.wants_step(step):
            return []
        kept = [sample for sample in samples if self.passes(sample)]
        if f.freq < 1:
            rng = random.Random(f"{self.seed}/{step}")
            kept = [sample for sample in kept if rng.random() < f.freq]
        if f.top_k == "off" and f.bottom_k == "off":
            return kept
        ranked = [sample for sample in kept if sample["reward"] is not None]
        chosen: set[int] = set()
        if f.top_k != "off":
            chosen.update(
                s["episode_id"] for s in sorted(ranked, key=lambda s: (-s["reward"], s["episode_id"]))[: f.top_k]
            )
        if f.bottom_k != "off":
            chosen.update(
                s["episode_id"] for s in sorted(ranked, key=lambda s: (s["reward"], s["episode_id"]))[: f.bottom_k]
            )
        return [sample for sample in ranked if sample["episode_id"] in chosen]


class SampleLogger:
    """Builds, filters and records (Reduce.SAMPLE, key `reward/samples`) the samples of each trained batch."""

    def __init__(
        self,
        config: SampleLoggingConfig,
        targets: dict[str, Callable[[dict[str, Any]], str | None]],
        *,
        seed: int,
        episodes_per_step: int,
        reference_logprobs: ReferenceLogprobs | None = None,
    ):
        """`seed`: `run.seed`; `episodes_per_step`: rollouts a step trains (`run.groups_per_step` x `algorithm.group_size`)."""
        self.config = config
        self.targets = targets
        self.episodes_per_step = episodes_per_step
        self.reference_logprobs = reference_logprobs
        self.filter = SampleFilter(config.filters, seed=seed)

    @classmethod
    def for_run(cls, config: Config, targets: dict[str, Any], reference_logprobs: ReferenceLogprobs) -> SampleLogger:
        """The sample logger of a run; `reference_logprobs` is used only where the run loads a reference (`kl_coef` > 0)."""
        return cls(
            config.sample_logging,
            targets,
            seed=config.run.seed,
            episodes_per_step=config.run.groups_per_step * config.algorithm.group_size,
            reference_logprobs=reference_logprobs if config.loss.kl_coef > 0 else None,
        )

    async def record(self, groups: list[RolloutGroup], step: int, dropped: list[RolloutGroup] = ()) -> None:
        """Record the chosen samples of the batch trained at `step` (episode ids count trained rollouts from 0).

        With `reference_logprobs` (runs with `loss.kl_coef > 0`) each chosen sample gets `ref_logprobs`,
        the mean reference logprob of its sampled tokens: one reference forward per logged sample. Every failed
        rollout of `dropped` (groups the step did not train, e.g. every rollout's reward function raised) is
        logged too, whatever the filters, with no episode id: a failure is never out of sight.
        """
        if not self.config.enabled:
            return
        for group in dropped:
            target = self.targets[group.task_name](group.example)
            for rollout in group.rollouts:
                if rollout.status in FAILED_STATUSES:
                    record_metric(
                        SAMPLES_KEY,
                        sample_record(rollout, episode_id=None, target=target, advantage=None, example=group.example),
                        Reduce.SAMPLE,
                    )
        if not self.filter.wants_step(step):
            return
        episode_id = (step - 1) * self.episodes_per_step
        samples, rollouts = [], {}
        for group in groups:
            target = self.targets[group.task_name](group.example)
            for rollout in group.rollouts:
                rollouts[episode_id] = rollout
                samples.append(
                    sample_record(
                        rollout,
                        episode_id=episode_id,
                        target=target,
                        advantage=rollout.advantage,
                        example=group.example,
                    )
                )
                episode_id += 1
        for sample in self.filter.select(samples, step):
            if self.reference_logprobs is not None:
                sample["ref_logprobs"] = await mean_reference_logprob(
                    rollouts[sample["episode_id"]], self.reference_logprobs
                )
            record_metric(SAMPLES_KEY, sample, Reduce.SAMPLE)
