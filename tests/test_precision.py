"""Trainer precision: autocast over fp32 master weights, and the sampler-mismatch warning."""

import torch

from rl.training.precision import MismatchWatch, compute_context


def test_bf16_compute_keeps_fp32_master_weights_and_small_updates():
    layer = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(layer.parameters(), lr=1e-4)
    before = layer.weight.detach().clone()
    with compute_context("cpu", "float32", "bfloat16"):
        out = layer(torch.ones(2, 4))
    assert out.dtype == torch.bfloat16 and layer.weight.dtype == torch.float32
    out.float().sum().backward()
    optimizer.step()
    # Each weight moves by lr * 2 = 2e-4: kept in fp32, lost in bf16 for weights of magnitude > 0.06.
    torch.testing.assert_close(layer.weight.detach(), before - 2e-4, atol=1e-7, rtol=0)
    as_bf16 = before.to(torch.bfloat16)
    assert ((as_bf16 - 2e-4).to(torch.bfloat16) == as_bf16)[before.abs() > 0.07].all()


def test_same_dtype_compute_is_not_autocast():
    layer = torch.nn.Linear(4, 4)
    with compute_context("cpu", "float32", "float32"):
        assert layer(torch.ones(1, 4)).dtype == torch.float32


def test_mismatch_watch_warns_once_past_factor_and_floor():
    watch = MismatchWatch(factor=5.0, floor=1e-3)
    assert watch.check(0.001) is None  # first step sets the level
    assert watch.check(0.0049) is None
    warning = watch.check(0.03)
    assert warning is not None and "0.03" in warning and "generator.dtype" in warning
    assert watch.check(0.1) is None  # once


def test_mismatch_watch_floor_ignores_noise_of_an_exact_sampler():
    watch = MismatchWatch(factor=5.0, floor=1e-3)
    assert watch.check(1e-9) is None
    assert watch.check(1e-6) is None  # 1000x the first value, far below the floor
    assert watch.check(2e-3) is not None
