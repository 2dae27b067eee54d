"""The controller's own failure branches, with stub actors: a non-finite step, samples too long to train, a drifting
sampler, a crashed producer, failing groups opening the circuit breaker. (Actor deaths and deadlines: test_controller_plumbing.py and tests/e2e/test_interrupt.py.)"""

import asyncio
import math
from types import SimpleNamespace

import pytest

from rl.config import load_config
from rl.loop.controller import Controller
from rl.loop.state import row_index_of
from rollouts.types import Rollout, RolloutGroup, RolloutStatus, RolloutTurn
from tests.support.paths import E2E_CONFIGS


def group(row: int, prompt_tokens: int = 2) -> RolloutGroup:
    """Row `row`'s group of 4 completed one-turn rollouts, rewards 1, 0, 0, 0 (so none is dropped as constant)."""
    row_id = f"train/row={row}"
    rollouts = [
        Rollout(
            rollout_id=f"{row_id}/{index}",
            group_id=row_id,
            task_name="sum_digits",
            sample_index=index,
            turns=[
                RolloutTurn(
                    prompt_messages=[],
                    prompt_token_ids=list(range(1, prompt_tokens + 1)),
                    completion_token_ids=[3],
                    completion_logprobs=[-0.5],
                    policy_version=0,
                )
            ],
            status=RolloutStatus.COMPLETED,
            reward=float(index == 0),
        )
        for index in range(4)
    ]
    return RolloutGroup(group_id=row_id, task_name="sum_digits", example={}, rollouts=rollouts)


class StubTrainer:
    """Answers every train step with the next of `answers` (the trainer's metric names, before the `train/` prefix)."""

    def __init__(self, *answers: dict[str, float]):
        self.answers = list(answers)
        self.train_step = SimpleNamespace(call_one=self._train_step)

    async def _train_step(self, micro_batches):
        return self.answers.pop(0)


def controller_with(trainer: StubTrainer, **overrides: str) -> tuple[Controller, list[int]]:
    """A controller on the tiny e2e config whose trainer is `trainer`; the list collects the versions it synced."""
    controller = Controller(load_config(E2E_CONFIGS / "tiny_qwen3_e2e.toml", overrides))
    controller.roles.trainer = trainer
    synced: list[int] = []

    async def sync_weights(policy_version: int) -> dict[str, float]:
        synced.append(policy_version)
        controller.state.policy_version = policy_version
        return {}  # the sync's own metrics (attestation): none here

    controller.sync_weights = sync_weights
    return controller, synced


NONFINITE = {"loss": math.nan, "grad_norm": math.inf, "skipped_nonfinite_steps": 1}


async def test_non_finite_steps_keep_the_weights_and_stop_the_run_after_the_limit(capsys):
    trainer = StubTrainer(NONFINITE, {"loss": 0.5, "grad_norm": 1.0}, NONFINITE, NONFINITE)
    controller, synced = controller_with(trainer, **{"trainer.max_nonfinite_steps": "2"})
    await controller.admission.acquire()  # two accepted rows hold slots until their step ends
    await controller.admission.acquire()
    await controller.admission.finish(True)
    await controller.admission.finish(True)

    await controller.train_step([group(0), group(1)])  # skipped: no sync, same version, the slots freed
    assert synced == [] and controller.state.policy_version == 0 and controller.actor_failures == []
    assert controller.admission.accepted == 0
    await controller.train_step([group(2), group(3)])  # a finite step resets the count
    assert synced == [1]
    await controller.train_step([group(4), group(5)])
    assert controller.actor_failures == []
    await controller.train_step([group(6), group(7)])  # the second in a row: the run stops
    assert synced == [1] and controller.state.policy_version == 1
    assert controller.actor_failures == [
        "step 1: gradient norm inf is not finite; the update was skipped (2 in a row, trainer.max_nonfinite_steps = 2)"
        ": stopping the run"
    ]
    assert capsys.readouterr().err.count("is not finite; the update was skipped") == 3


async def test_samples_longer_than_the_trainers_seq_len_are_counted_and_a_step_of_only_those_is_skipped():
    trainer = StubTrainer()  # never called
    controller, synced = controller_with(trainer)
    metrics = await controller.train_step([group(0, prompt_tokens=128), group(1, prompt_tokens=128)])
    assert metrics["rollouts/too_long"] == 8 and metrics["train/skipped"] == 1  # 129 tokens > seq_len 128
    assert synced == []


async def test_a_sampler_drifting_from_the_trainer_warns_once(capsys):
    trainer = StubTrainer(*({"loss": 0.1, "grad_norm": 1.0, "mismatch_k3": k3} for k3 in (0.002, 0.009, 0.011, 0.5)))
    controller, synced = controller_with(
        trainer, **{"run.mismatch_warn_factor": "5", "run.mismatch_warn_floor": "0.001"}
    )
    for step in range(4):
        await controller.train_step([group(2 * step), group(2 * step + 1)])
        warned = capsys.readouterr().err
        # the limit is max(5 x 0.002, 0.001) = 0.01: 0.009 is under it, 0.011 is over it, 0.5 is not warned again
        assert ("train/mismatch_k3 = 0.011 is above 0.01 (5 x its first value 0.002)" in warned) == (step == 2), warned
    assert synced == [1, 2, 3, 4]  # a warning only: every step still syncs


async def test_a_crashed_producer_raises_in_the_consumer_instead_of_hanging():
    controller, _ = controller_with(StubTrainer())

    async def crash(*args, **kwargs):
        raise RuntimeError("scoring crashed")

    controller.scored_groups.make = crash
    producer = asyncio.create_task(controller.produce())
    with pytest.raises(ExceptionGroup) as raised:
        await asyncio.wait_for(controller._next_batch(producer), timeout=10)
    assert {str(error) for error in raised.value.exceptions} == {"scoring crashed"}  # one per row that had started


async def test_groups_that_always_fail_open_the_breaker_which_stops_the_run():
    """The run's task is cancelled with the breaker's message (the CLI prints it: tests/unit/rl/commands/test_cli.py)."""
    controller, _ = controller_with(StubTrainer(), **{"services.breaker.max_consecutive_failed_groups": "3"})

    async def failed_group(row_id, task_name, row, group_size, sampling, sampler="policy", rollout_fn=None):
        failed = group(row_index_of(row_id))
        for rollout in failed.rollouts:
            rollout.status, rollout.error = RolloutStatus.ERROR, "ValueError: this rubric always fails"
        return failed

    controller.scored_groups.make = failed_group
    controller._run_task = run = asyncio.create_task(asyncio.sleep(3600))
    producer = asyncio.create_task(controller.produce())
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(run, timeout=10)
    producer.cancel()
    await asyncio.gather(producer, return_exceptions=True)
    assert controller.actor_failures == [
        "rollout circuit breaker: 3 consecutive groups failed (services.breaker.max_consecutive_failed_groups = 3); "
        "last error: ValueError: this rubric always fails"
    ]
