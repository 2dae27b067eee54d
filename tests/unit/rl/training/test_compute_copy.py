"""The trainer's bf16 compute copy: stochastic rounding, its gradients, and the updates a bf16 forward sees."""

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from rl.assets import resolve_model_path
from rl.config.loss import LossConfig, RolloutCorrectionConfig
from rl.packing.rows import TrainSample, pack_samples, split_micro_batches
from rl.training.compute_copy import ComputeCopy, stochastic_round_bf16
from rl.training.logprobs import token_logprobs
from rl.training.train_step import train_step


def _bf16_neighbours(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The bf16 values just below and just above each fp32 value in magnitude (equal where it is a bf16 value)."""
    nearest = values.to(torch.bfloat16)
    away = torch.nextafter(nearest, torch.where(values < 0, -torch.inf, torch.inf).to(torch.bfloat16))
    toward = torch.nextafter(nearest, torch.zeros_like(nearest))
    exact = nearest.float() == values
    above = nearest.float().abs() > values.abs()  # nearest rounded away from zero
    low = torch.where(exact | ~above, nearest, toward)
    high = torch.where(exact, nearest, torch.where(above, nearest, away))
    return low.float(), high.float()


def test_stochastic_rounding_lands_on_a_neighbour_with_the_probability_of_the_remainder():
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(64, generator=generator) * torch.logspace(-4, 2, 64)  # both signs, many binades
    values[:4] = torch.tensor([1.0, -0.5, 0.0, 3.0]).to(torch.bfloat16).float()  # exact bf16 values
    low, high = _bf16_neighbours(values)
    draws = torch.stack([stochastic_round_bf16(values).float() for _ in range(4000)])  # [4000, 64]
    assert bool(((draws == low) | (draws == high)).all())
    torch.testing.assert_close(draws[:, :4], values[:4].expand(4000, 4), atol=0, rtol=0)
    up = (high.abs() - low.abs()).clamp_min(torch.finfo(torch.float32).tiny)  # the rounding step
    expected = ((values.abs() - low.abs()) / up).where(high != low, 0.0)  # P(rounded away from zero)
    observed = (draws == high).double().mean(0).where(high != low, 0.0)
    assert float((observed - expected).abs().max()) < 5 * (0.25 / 4000) ** 0.5  # five binomial standard errors
    # unbiased: the mean of the draws is the value, far closer than a rounding step
    assert float(((draws.double().mean(0) - values) / up).abs().max()) < 5 * (0.25 / 4000) ** 0.5


@pytest.fixture(scope="module")
def bf16_exact_model():
    """The tiny Qwen3 with fp32 weights that are bf16 values, as a model loaded from a bf16 checkpoint has."""
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-qwen3"), dtype=torch.float32)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(parameter.to(torch.bfloat16))
    return model.train()


def _batch(vocab: int = 1000) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """input_ids, position_ids, trained-token mask [4, 16] and one advantage per row [4, 1]."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (4, 16), generator=generator)
    positions = torch.arange(16).expand(4, 16)
    mask = positions >= 4
    return ids, positions, mask, torch.randn(4, 1, generator=generator)


def _objective(model, autocast: bool = False) -> torch.Tensor:
    """Advantage-weighted sum of the trained tokens' logprobs (a policy-gradient surrogate)."""
    ids, positions, mask, advantages = _batch()
    context = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else torch.autocast("cpu", enabled=False)
    with context:
        logprobs = token_logprobs(model, ids, positions, mask=mask)  # [4, 16] float32
    return (logprobs * advantages * mask).sum()


def test_gradients_through_the_copy_are_its_weights_gradients_in_fp32_master_grads(bf16_exact_model):
    model = copy.deepcopy(bf16_exact_model)
    copied = ComputeCopy(model, torch.optim.SGD(model.parameters()))
    with copied.active():
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
        _objective(model).backward()
        weights = [p.detach().double() for p in model.parameters()]  # the copy the passes computed with
    grads = [p.grad for p in model.parameters()]
    assert {p.dtype for p in model.parameters()} == {g.dtype for g in grads} == {torch.float32}
    # reference: the same objective in float64 at the copy's weights
    reference = copy.deepcopy(bf16_exact_model).double()
    with torch.no_grad():
        for parameter, weight in zip(reference.parameters(), weights, strict=True):
            parameter.copy_(weight)
    _objective(reference).backward()
    expected = torch.cat([p.grad.flatten() for p in reference.parameters()])
    got = torch.cat([g.flatten() for g in grads]).double()
    assert float((got - expected).norm() / expected.norm()) < 0.03  # bf16 activations: ~1% per element
    assert float(torch.nn.functional.cosine_similarity(got, expected, dim=0)) > 0.999
    # and autocast's gradients at the same (bf16-exact) weights agree with them as closely
    autocast = copy.deepcopy(bf16_exact_model)
    _objective(autocast, autocast=True).backward()
    of_autocast = torch.cat([p.grad.flatten() for p in autocast.parameters()]).double()
    assert float((got - of_autocast).norm() / of_autocast.norm()) < 0.03


def test_two_passes_add_their_gradients_to_the_master_gradients_they_had(bf16_exact_model):
    model = copy.deepcopy(bf16_exact_model)
    copied = ComputeCopy(model, torch.optim.SGD(model.parameters()))
    with copied.active():
        _objective(model).backward()
    once = [p.grad.clone() for p in model.parameters()]
    with copied.active():  # no update in between: the same copy, so the same gradient once more
        _objective(model).backward()
    for parameter, grad in zip(model.parameters(), once, strict=True):
        torch.testing.assert_close(parameter.grad, 2 * grad)


def test_a_bf16_forward_on_the_copy_sees_an_update_below_the_rounding_step(bf16_exact_model):
    """An update of 0.3 of a rounding step on every matmul weight, each in the direction that raises the objective:
    fp32 sees it; autocast's casts round each of those weights back to where it was, so its bf16 forward is
    bit-identical; the copy's forward moves by the fp32 change on average over its draws."""
    model = copy.deepcopy(bf16_exact_model)
    _objective(model).backward()
    before_fp32 = float(_objective(model).detach())
    before_autocast = float(_objective(model, autocast=True).detach())
    embedding = model.get_input_embeddings().weight  # autocast looks embeddings up in fp32
    matmuls = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear) and m.weight is not embedding]
    with torch.no_grad():
        for parameter in matmuls:
            nearest = parameter.to(torch.bfloat16)
            up, down = (
                torch.nextafter(nearest, torch.full_like(nearest, end)).float() for end in (torch.inf, -torch.inf)
            )
            step = torch.minimum(up - parameter, parameter - down)  # the smaller step at a power of two
            parameter.add_(0.3 * step * parameter.grad.sign())
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        fp32_change = float(_objective(model)) - before_fp32
        autocast_change = float(_objective(model, autocast=True)) - before_autocast
        copied = ComputeCopy(model, torch.optim.SGD(model.parameters()))
        changes = []
        for _ in range(48):
            copied.refresh()  # a fresh draw, as after each optimizer step
            with copied.active():
                changes.append(float(_objective(model)) - before_autocast)
    mean = sum(changes) / len(changes)
    assert fp32_change > 0.05
    assert autocast_change == 0.0
    assert mean == pytest.approx(fp32_change, rel=0.1)


def _samples(model, n: int = 6) -> list[TrainSample]:
    generator = torch.Generator().manual_seed(2)
    samples = []
    for i in range(n):
        length = 6 + i
        ids = torch.randint(0, 1000, (length,), generator=generator).tolist()
        with torch.no_grad():
            own = token_logprobs(model, torch.tensor([ids]), torch.arange(length)[None])[0]
        mask = [False, False] + [True] * (length - 2)
        sampling = [float(own[t]) + 0.1 if mask[t] else 0.0 for t in range(length)]
        samples.append(TrainSample(ids, mask, sampling, float(torch.randn((), generator=generator)), 0))
    return samples


def test_a_train_step_on_the_copy_anchors_ppo_on_the_copy_it_updates_with_and_steps_the_fp32_weights(
    bf16_exact_model,
):
    """Decoupled mode: the no-grad pass and the update compute with one draw (ratio exactly 1 before the optimizer
    step), the optimizer updates fp32 master weights, and the next step draws a new copy of them."""
    model = copy.deepcopy(bf16_exact_model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    copied = ComputeCopy(model, optimizer)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    config = LossConfig(rollout_correction=RolloutCorrectionConfig(preset="decoupled_token_is"))
    before = [p.detach().clone() for p in model.parameters()]
    drawn = []
    for _ in range(2):
        with copied.active():
            drawn.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
        batch = pack_samples(_samples(bf16_exact_model), seq_len=32, pad_token_id=0)
        metrics = train_step(
            model,
            optimizer,
            scheduler,
            split_micro_batches(batch, 2),
            config,
            max_grad_norm=1.0,
            horizon=32,
            compute=lambda: torch.autocast("cpu", dtype=torch.bfloat16),
            weights=copied.active,
        )
        assert metrics["ratio_min"] == metrics["ratio_max"] == 1.0
        assert metrics["optimizer_steps"] == 1.0
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert drawn[0].dtype == torch.bfloat16
    assert bool((drawn[0] != drawn[1]).any())  # drawn again after the optimizer step
    moved = [bool((p.detach() != b).any()) for p, b in zip(model.parameters(), before, strict=True)]
    assert all(moved)
