"""A non-finite gradient never reaches the weights: the update is skipped and counted, and the run stops
after `trainer.max_nonfinite_steps` such steps in a row (issue 19)."""

import copy
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from rl.algorithms.config import AlgorithmConfig
from rl.assets import resolve_model_path
from rl.batching import TrainSample, pack_samples, split_micro_batches
from rl.config import TrainerConfig
from rl.loop.admission import Admission
from rl.loop.controller import Controller
from rl.training.train_step import train_step

SEQ_LEN = 32


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-qwen3"), dtype=torch.float32).train()


def batch(advantage: float):
    samples = [TrainSample([5, 6, 7, 8, 9, 10], [False, False, True, True, True, True], [0.0, 0.0, -1.0, -1.0, -1.0, -1.0], advantage, 0),
               TrainSample([11, 12, 13, 14], [False, True, True, True], [0.0, -1.0, -1.0, -1.0], 1.0, 0)]
    return split_micro_batches(pack_samples(samples, seq_len=SEQ_LEN, pad_token_id=0), 2)


def test_a_step_with_a_nonfinite_gradient_norm_changes_nothing(model):
    trained = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(trained.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    metrics = train_step(trained, optimizer, scheduler, batch(float("inf")), AlgorithmConfig(), max_grad_norm=1.0, horizon=SEQ_LEN)
    assert metrics["skipped_nonfinite_steps"] == 1.0 and not torch.isfinite(torch.tensor(metrics["grad_norm"]))
    assert all(torch.equal(before, after) for before, after in zip(model.parameters(), trained.parameters()))
    assert optimizer.state == {} and scheduler.last_epoch == 0  # no AdamW moments, no schedule step
    assert all(parameter.grad is None for parameter in trained.parameters())
    metrics = train_step(trained, optimizer, scheduler, batch(1.0), AlgorithmConfig(), max_grad_norm=1.0, horizon=SEQ_LEN)
    assert metrics["skipped_nonfinite_steps"] == 0.0 and scheduler.last_epoch == 1
    assert all(torch.isfinite(parameter).all() for parameter in trained.parameters())


async def test_the_run_stops_after_max_nonfinite_steps_in_a_row():
    stopped = []
    controller = SimpleNamespace(
        config=SimpleNamespace(trainer=TrainerConfig(max_nonfinite_steps=2)), state=SimpleNamespace(step=4),
        nonfinite_steps_in_row=0, _stop_run=stopped.append,
        admission=Admission(max_concurrent=4, max_staleness=0, rows_per_step=2),
    )
    controller.admission.accepted = 2
    metrics = {"train/grad_norm": float("nan"), "train/skipped_nonfinite_steps": 1.0}
    await Controller._nonfinite_step(controller, metrics, rows=2)
    assert stopped == [] and controller.admission.accepted == 0  # the skipped step's rows free their slots
    await Controller._nonfinite_step(controller, metrics, rows=2)
    assert len(stopped) == 1 and "trainer.max_nonfinite_steps = 2" in stopped[0] and "stopping the run" in stopped[0]
