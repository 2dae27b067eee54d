"""A non-finite gradient never reaches the weights: the update is skipped and counted, and the run stops
after `trainer.max_nonfinite_steps` such steps in a row."""

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from rl.assets import resolve_model_path
from rl.config.loss import LossConfig
from rl.packing.rows import TrainSample, pack_samples, split_micro_batches
from rl.precision import NonfiniteSteps
from rl.training.train_step import train_step

SEQ_LEN = 32


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-qwen3"), dtype=torch.float32).train()


def batch(advantage: float):
    samples = [
        TrainSample(
            [5, 6, 7, 8, 9, 10],
            [False, False, True, True, True, True],
            [0.0, 0.0, -1.0, -1.0, -1.0, -1.0],
            advantage,
            0,
        ),
        TrainSample([11, 12, 13, 14], [False, True, True, True], [0.0, -1.0, -1.0, -1.0], 1.0, 0),
    ]
    return split_micro_batches(pack_samples(samples, seq_len=SEQ_LEN, pad_token_id=0), 2)


def test_a_step_with_a_nonfinite_gradient_norm_changes_nothing(model):
    trained = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(trained.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    metrics = train_step(
        trained, optimizer, scheduler, batch(float("inf")), LossConfig(), max_grad_norm=1.0, horizon=SEQ_LEN
    )
    assert metrics["skipped_nonfinite_steps"] == 1.0 and not torch.isfinite(torch.tensor(metrics["grad_norm"]))
    assert all(torch.equal(before, after) for before, after in zip(model.parameters(), trained.parameters()))
    assert optimizer.state == {} and scheduler.last_epoch == 0  # no AdamW moments, no schedule step
    assert all(parameter.grad is None for parameter in trained.parameters())
    metrics = train_step(trained, optimizer, scheduler, batch(1.0), LossConfig(), max_grad_norm=1.0, horizon=SEQ_LEN)
    assert metrics["skipped_nonfinite_steps"] == 0.0 and scheduler.last_epoch == 1
    assert all(torch.isfinite(parameter).all() for parameter in trained.parameters())


def test_the_run_stops_after_max_nonfinite_steps_in_a_row():
    watch = NonfiniteSteps(limit=2)
    skipped = {"train/grad_norm": float("nan"), "train/skipped_nonfinite_steps": 1.0}
    assert watch.check(5, {"train/grad_norm": 0.3, "train/skipped_nonfinite_steps": 0.0}, minibatches=1) is None
    warning, stop = watch.check(6, skipped, minibatches=1)
    assert not stop and "step 6" in warning and "1 in a row" in warning
    # resets
    assert watch.check(7, {"train/grad_norm": 0.3, "train/skipped_nonfinite_steps": 0.0}, minibatches=1) is None
    assert watch.check(8, skipped, minibatches=1)[1] is False
    warning, stop = watch.check(9, skipped, minibatches=1)
    assert stop and "2 in a row, trainer.max_nonfinite_steps = 2" in warning
    # with 2 minibatches a step whose only one update was skipped still changed the weights
    assert NonfiniteSteps(limit=1).check(1, skipped, minibatches=2) is None
