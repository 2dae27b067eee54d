"""Rewards for end-to-end tests."""

import asyncio
import os
import time

from rollouts.types import Rollout


def even_token_share(rollout: Rollout, example: dict) -> float:
    """Share of sampled tokens with an even id: differs between samples, so advantages are non-zero."""
    tokens = [token for turn in rollout.turns for token in turn.completion_token_ids]
    return sum(token % 2 == 0 for token in tokens) / max(1, len(tokens))


SLOW_S = 0.5


async def slow_at_version_1(rollout: Rollout, example: dict) -> float:
    """`even_token_share` after `SLOW_S` s for the training rows policy version 1 sampled (a step 2's): a test that
    kills the reward replica while it scores such a row kills it in the call, not between a reply and its delivery.
    Async: it waits in the RewardActor's process."""
    if rollout.group_id.startswith("train/") and max(rollout.policy_versions) == 1:
        await asyncio.sleep(SLOW_S)
    return even_token_share(rollout, example)


def by_sample_index(rollout: Rollout, example: dict) -> float:
    """The sample's index in its group: every group's rewards differ, so no group is ever dropped for zero advantage."""
    return float(rollout.sample_index)


async def kill_reward_process(rollout: Rollout, example: dict) -> float:
    """Kills the RewardActor's process: an actor dying in the middle of a run (async, so it runs in the actor's
    process: a sync reward function runs in a worker process, whose death is only that call's failure)."""
    os._exit(1)


def judge_reply_length(reply: str) -> float:
    """A judge "verdict" any reply gives (a random-weight judge writes no yes/no): its length, capped at 1."""
    return min(1.0, len(reply) / 32)


def flaky(rollout: Rollout, example: dict) -> float | str:
    """A flaky reward, as a user's first hour met one, by the row's number: raises ValueError when it ends in 0 or 1,
    returns nan when it ends in 2 and the string "1.0" when it ends in 3 (4 of every 10 rows fail, all their rollouts
    alike); otherwise `even_token_share`, which differs between samples."""
    last_digit = example["number"] % 10
    if last_digit in (0, 1):
        raise ValueError(f"cannot grade number {example['number']}")
    if last_digit == 2:
        return float("nan")
    if last_digit == 3:
        return "1.0"
    return even_token_share(rollout, example)


def flaky_rows_fail(number: int) -> bool:
    """Whether `flaky` fails every rollout of the row of `number`."""
    return number % 10 in (0, 1, 2, 3)


def fails_from_version_1(rollout: Rollout, example: dict) -> float:
    """`even_token_share` for samples of the base policy (version 0), a raise for every later one: at staleness 0
    every row from step 2 on fails."""
    if max(rollout.policy_versions) >= 1:
        raise RuntimeError("this rubric fails on every sample of a trained policy")
    return even_token_share(rollout, example)


HOLD_FROM_VERSION_ENV = "RLMESH_TEST_HOLD_FROM_VERSION"
"""Set in a launcher's environment (its actor processes inherit it): the `held_*` rewards hold the training rows sampled
by this policy version or a later one (evaluation rows are not held)."""
HOLD_WHILE_ENV = "RLMESH_TEST_HOLD_WHILE"
"""With `RLMESH_TEST_HOLD_FROM_VERSION`, a file: the rows are held while it exists (unset: until the rubric's timeout,
`rubric.timeout_s`, fails them)."""
HOLD_POLL_S = 0.2


def is_held(rollout: Rollout) -> bool:
    """Whether the `held_*` rewards hold `rollout` now. While they do, the step that would train its row cannot: the run
    stays at the step before, its generators on the version that step made, and it does not end (a test reads what a
    clean end removes, or lets the run end only once what it waits for has happened)."""
    held_from = os.environ.get(HOLD_FROM_VERSION_ENV)
    if held_from is None or not rollout.group_id.startswith("train/") or max(rollout.policy_versions) < int(held_from):
        return False
    held_while = os.environ.get(HOLD_WHILE_ENV)
    return held_while is None or os.path.exists(held_while)


async def held_even_token_share(rollout: Rollout, example: dict) -> float:
    """`even_token_share` once `is_held` lets the rollout go. Async: it waits in the RewardActor's process, beside the
    other calls it scores (a held sync call would take a worker that evaluation rows need)."""
    while is_held(rollout):
        await asyncio.sleep(HOLD_POLL_S)
    return even_token_share(rollout, example)


def held_by_sample_index(rollout: Rollout, example: dict) -> float:
    """`by_sample_index` once `is_held` lets the rollout go; sync, so it runs in a reward worker process as
    `by_sample_index` does."""
    while is_held(rollout):
        time.sleep(HOLD_POLL_S)
    return by_sample_index(rollout, example)
