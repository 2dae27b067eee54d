"""Teacher scoring (opd, opsd): a concurrency bound and its seconds in `time/scoring_s`. The trainer calls in
flight, which a trainer recovery names. Non-finite published weights stop the run before any generator loads them."""

import asyncio
import time
from types import SimpleNamespace

import pytest
import torch

from rl.config import load_config
from rl.loop.roles import NonFiniteWeights, Roles
from rl.metrics.reduce import drain_states, reduce_states
from rl.weights.attestation import fingerprint_state_dict
from tests.support.paths import E2E_CONFIGS


class CountingTeacher:
    """Stands in for a frozen model's generator service: scores a sequence in 50 ms (logprob -id for each token),
    counting how many it scores at once."""

    def __init__(self):
        self.running = self.most = 0
        self.prompt_logprobs = SimpleNamespace(route=self.route)

    async def route(self, ids):
        self.running += 1
        self.most = max(self.most, self.running)
        await asyncio.sleep(0.05)
        self.running -= 1
        return [-float(token) for token in ids]


async def test_teacher_scoring_is_bounded_and_timed():
    config = load_config(E2E_CONFIGS / "tiny_qwen3_e2e.toml", {"run.max_concurrent_scoring": "3"})
    roles = Roles(config, stop_run=lambda message: None, policy_version=lambda: 0)
    roles.frozen["teacher"] = teacher = CountingTeacher()
    sequences = [[index, index + 1] for index in range(10)]
    drain_states()
    start = time.perf_counter()
    scored = await roles.prompt_logprobs("teacher", sequences)
    elapsed = time.perf_counter() - start
    assert scored == [[-float(index), -float(index + 1)] for index in range(10)]
    assert teacher.most == 3  # 10 sequences, at most 3 at once: 4 waves of 50 ms
    metrics, _ = reduce_states([drain_states()])
    assert 4 * 0.05 <= metrics["time/scoring_s"] <= elapsed


class PausedTrainer:
    """Stands in for the trainer's actor: `train_step` answers when `release` is set, `save_checkpoint` fails."""

    def __init__(self):
        self.release = asyncio.Event()
        self.train_step = SimpleNamespace(call_one=self.step)
        self.save_checkpoint = SimpleNamespace(call_one=self.fail)

    async def step(self, micro_batches):
        await self.release.wait()
        return {"loss": 0.5}

    async def fail(self, path, weights_only):
        raise RuntimeError("the rank died")


async def test_the_trainer_calls_in_flight_are_counted_until_they_end_or_fail():
    roles = Roles(
        load_config(E2E_CONFIGS / "tiny_qwen3_e2e.toml"), stop_run=lambda message: None, policy_version=lambda: 0
    )
    roles.trainer = trainer = PausedTrainer()
    steps = [asyncio.create_task(roles.train_step([])) for _ in range(2)]
    await asyncio.sleep(0.01)
    assert roles.trainer_calls == {"train step": 2}
    trainer.release.set()
    assert await asyncio.gather(*steps) == [{"loss": 0.5}, {"loss": 0.5}]
    assert roles.trainer_calls == {}
    with pytest.raises(RuntimeError, match="the rank died"):
        await roles.trainer_call(trainer.save_checkpoint.call_one("ckpt", False), "checkpoint save")
    assert roles.trainer_calls == {}


class PublishingTrainer:
    """Stands in for the trainer's actor: `push_weights` returns the fingerprints of `weights`."""

    def __init__(self, weights):
        self.push_weights = SimpleNamespace(call_one=lambda version, attest, full: self.push(version))
        self.weights = weights

    async def push(self, version):
        return fingerprint_state_dict(self.weights, version)


async def test_non_finite_weights_stop_the_run_before_any_generator_loads_them():
    roles = Roles(
        load_config(E2E_CONFIGS / "tiny_qwen3_e2e.toml"), stop_run=lambda message: None, policy_version=lambda: 0
    )
    weights = {"a.weight": torch.ones(4, 4), "b.weight": torch.ones(4, 4)}
    roles.trainer = PublishingTrainer(weights)
    assert (await roles.push_weights(1)).non_finite() == []
    weights["b.weight"][2, 3] = float("nan")
    with pytest.raises(NonFiniteWeights, match=r"weights of policy version 2 are not finite \(b.weight\)"):
        await roles.push_weights(2)
    assert roles.published.policy_version == 1  # a replacement generator is never handed the broken version
