import math

import pytest
import torch
from tensordict import TensorDict

from rl.algorithms.losses import grpo_loss, k3_kl, ppo_clip_token_loss

LN2 = math.log(2.0)


def test_ppo_clip_token_loss_values_gradients_and_clip_flags() -> None:
    # eps_low = 0.2, eps_high = 0.28: ratios are clipped to [0.8, 1.28]. Per token (ratio r, advantage A):
    #   loss = -min(r*A, clamp(r)*A); d loss / d logp = -r*A when the unclipped branch is active, else 0.
    # (1.1, +1)  inside          -> loss -1.1,  grad -1.1
    # (1.28, +1) at the high edge -> loss -1.28, grad -1.28 (not clipped)
    # (1.5, +1)  beyond high      -> loss -1.28, grad 0     (clipped)
    # (0.5, +1)  below low, A > 0 -> loss -0.5,  grad -0.5  (min picks r*A)
    # (0.8, -1)  at the low edge  -> loss 0.8,   grad 0.8   (not clipped)
    # (0.5, -1)  beyond low       -> loss 0.8,   grad 0     (clipped)
    # (1.5, -1)  above high, A < 0-> loss 1.5,   grad 1.5   (min picks r*A)
    # (1.1, -2)  inside           -> loss 2.2,   grad 2.2
    # (1.0, 0)   zero advantage   -> loss 0,     grad 0
    ratios = [1.1, 1.28, 1.5, 0.5, 0.8, 0.5, 1.5, 1.1, 1.0]
    logprobs = torch.tensor([[math.log(r) for r in ratios]], requires_grad=True)  # [1,9]
    sampling_logprobs = torch.zeros(1, 9)
    advantages = torch.tensor([[1.0, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -2.0, 0.0]])

    loss, clipped = ppo_clip_token_loss(
        logprobs, sampling_logprobs, advantages, clip_eps_low=0.2, clip_eps_high=0.28
    )
    loss.sum().backward()

    torch.testing.assert_close(
        loss, torch.tensor([[-1.1, -1.28, -1.28, -0.5, 0.8, 0.8, 1.5, 2.2, 0.0]]), atol=1e-6, rtol=0
    )
    torch.testing.assert_close(
        logprobs.grad, torch.tensor([[-1.1, -1.28, 0.0, -0.5, 0.8, 0.0, 1.5, 2.2, 0.0]]), atol=1e-6, rtol=0
    )
    assert clipped.tolist() == [[False, False, True, False, False, True, False, False, False]]


def test_ppo_clip_uses_the_difference_of_logprobs() -> None:
    # logp - sampling_logp = (-2 + ln 1.5) - (-2) = ln 1.5 -> r = 1.5 with eps_high 0.6 is inside: loss -1.5*2 = -3
    logprobs = torch.tensor([[-2.0 + math.log(1.5)]])
    loss, clipped = ppo_clip_token_loss(
        logprobs, torch.tensor([[-2.0]]), torch.tensor([[2.0]]), clip_eps_low=0.2, clip_eps_high=0.6
    )
    torch.testing.assert_close(loss, torch.tensor([[-3.0]]), atol=1e-6, rtol=0)
    assert not clipped.item()


def test_k3_kl_values_gradients_and_clamp() -> None:
    # k1 = logp - ref_logp; k3 = exp(-k1) + k1 - 1, d k3 / d logp = 1 - exp(-k1) (0 where k1 is clamped)
    # k1 = 0     -> 1 + 0 - 1 = 0                          grad 0
    # k1 = ln 2  -> 0.5 + 0.69314718 - 1 = 0.19314718      grad 1 - 0.5 = 0.5
    # k1 = -ln 2 -> 2 - 0.69314718 - 1 = 0.30685282        grad 1 - 2 = -1
    # k1 = 30    -> clamped to 20: e^-20 + 19 = 19.00000000206115      grad 0
    # k1 = -30   -> clamped to -20: e^20 - 21 = 485165174.40979028    grad 0
    logprobs = torch.tensor([0.0, LN2, -LN2, 30.0, -30.0], dtype=torch.float64, requires_grad=True)
    k3 = k3_kl(logprobs, torch.zeros(5, dtype=torch.float64), log_ratio_clamp=20.0)
    k3.sum().backward()
    expected = torch.tensor([0.0, 0.19314718, 0.30685282, 19.00000000206115, 485165174.40979028], dtype=torch.float64)
    torch.testing.assert_close(k3, expected, atol=1e-8, rtol=1e-12)
    torch.testing.assert_close(logprobs.grad, torch.tensor([0.0, 0.5, -1.0, 0.0, 0.0], dtype=torch.float64))


def _hand_batch() -> tuple[torch.Tensor, torch.Tensor, TensorDict]:
    # Row 0: prompt token, trained r = 1.5 (A = +1), trained r = 1 (A = +1), pad.
    # Row 1: prompt token, trained r = 0.5 (A = -1), two pads; one pad has logp 100 (exp overflows float32).
    logprobs = torch.tensor(
        [[-3.0, -1.0 + math.log(1.5), -2.0, 0.0], [-3.0, -1.0 + math.log(0.5), 100.0, 0.0]], requires_grad=True
    )
    # ref: k1 = ln 2, 0 and -ln 2 on the trained tokens; junk on the others
    ref_logprobs = logprobs.detach() - torch.tensor([[-90.0, LN2, 0.0, 0.0], [0.0, -LN2, 0.0, 0.0]])
    batch = TensorDict(
        {
            "loss_mask": torch.tensor([[False, True, True, False], [False, True, False, False]]),
            "sampling_logprobs": torch.tensor([[0.0, -1.0, -2.0, 0.0], [0.0, -1.0, 0.0, 0.0]]),
            "advantages": torch.tensor([[1.0, 1.0, 1.0, 0.0], [-1.0, -1.0, 0.0, 0.0]]),
        },
        batch_size=[2],
    )
    return logprobs, ref_logprobs, batch


def test_grpo_loss_hand_computed_with_global_token_count() -> None:
    # Per trained token: r = 1.5, A = +1 -> clipped high, -1.28; r = 1, A = +1 -> -1; r = 0.5, A = -1 -> clipped
    # low, +0.8. The step has 4 trained tokens (one more in another micro-batch): loss = (-1.28 - 1 + 0.8) / 4
    # = -0.37. k3 on the trained tokens: 0.19314718 + 0 + 0.30685282 = 0.5 -> kl = 0.5 / 4 = 0.125, and
    # loss = -0.37 + 0.1 * 0.125 = -0.3575.
    # Gradient: pg part -r*A/4 only on the unclipped token (-1/4 = -0.25); kl part 0.1 * (1 - e^-k1) / 4:
    # 0.1 * 0.5 / 4 = 0.0125 at k1 = ln 2, 0.1 * (1 - 2) / 4 = -0.025 at k1 = -ln 2; untrained tokens 0.
    # Metrics / 4: ratio (1.5 + 1 + 0.5) / 4 = 0.75; clip fractions 1/4 each; mismatch k3 = r - 1 - ln r:
    # (0.5 - 0.40546511) + 0 + (-0.5 + 0.69314718) = 0.28768207 -> 0.07192052.
    logprobs, ref_logprobs, batch = _hand_batch()
    loss, metrics = grpo_loss(
        logprobs,
        batch,
        clip_eps_low=0.2,
        clip_eps_high=0.28,
        num_loss_tokens=4,
        kl_coef=0.1,
        ref_logprobs=ref_logprobs,
    )
    loss.backward()

    torch.testing.assert_close(loss, torch.tensor(-0.3575), atol=1e-6, rtol=0)
    torch.testing.assert_close(
        logprobs.grad, torch.tensor([[0.0, 0.0125, -0.25, 0.0], [0.0, -0.025, 0.0, 0.0]]), atol=1e-7, rtol=0
    )
    expected = {
        "pg_loss": -0.37,
        "clip_frac_low": 0.25,
        "clip_frac_high": 0.25,
        "ratio_mean": 0.75,
        "mismatch_k3": 0.07192052,
        "kl": 0.125,
    }
    assert metrics.keys() == expected.keys()
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, abs=1e-6), key


def test_grpo_loss_without_kl_has_no_kl_metric() -> None:
    logprobs, _, batch = _hand_batch()
    loss, metrics = grpo_loss(logprobs, batch, clip_eps_low=0.2, clip_eps_high=0.28, num_loss_tokens=3)
    # (-1.28 - 1 + 0.8) / 3 = -0.49333333
    torch.testing.assert_close(loss, torch.tensor(-0.49333333), atol=1e-6, rtol=0)
    assert "kl" not in metrics


def test_grpo_loss_rejects_kl_without_reference() -> None:
    logprobs, _, batch = _hand_batch()
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo_loss(logprobs, batch, clip_eps_low=0.2, clip_eps_high=0.28, num_loss_tokens=3, kl_coef=0.1)


def _policy_logprobs(weights: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """A tiny shared-parameter 'policy': a unigram distribution softmax(weights) over the vocab."""
    return torch.log_softmax(weights, dim=0)[input_ids]  # [B,L]


def _random_step(generator: torch.Generator) -> tuple[TensorDict, torch.Tensor]:
    # 4 rows with 1, 5, 2 and 3 trained tokens: per-micro-batch means would weigh them differently.
    loss_mask = torch.tensor(
        [
            [False, True, False, False, False, False],
            [False, True, True, True, True, True],
            [False, False, True, True, False, False],
            [False, True, False, True, True, False],
        ]
    )
    batch = TensorDict(
        {
            "input_ids": torch.randint(0, 5, (4, 6), generator=generator),
            "loss_mask": loss_mask,
            "sampling_logprobs": torch.where(loss_mask, -torch.rand(4, 6, generator=generator) * 3, 0.0),
            "advantages": torch.tensor([1.5, -0.5, 0.75, -1.0])[:, None].expand(4, 6).clone(),
        },
        batch_size=[4],
    )
    ref_logprobs = -torch.rand(4, 6, generator=generator) * 3
    return batch, ref_logprobs


def test_grpo_loss_is_invariant_to_the_micro_batch_split() -> None:
    generator = torch.Generator().manual_seed(0)
    batch, ref_logprobs = _random_step(generator)
    num_loss_tokens = int(batch["loss_mask"].sum())  # 11
    weights = torch.randn(5, generator=generator, requires_grad=True)
    kwargs = dict(clip_eps_low=0.2, clip_eps_high=0.28, num_loss_tokens=num_loss_tokens, kl_coef=0.05)

    results = {}
    for micro_batch_size in (1, 2, 4):
        weights.grad = None
        total_loss = 0.0
        total_metrics: dict[str, float] = {}
        for start in range(0, 4, micro_batch_size):
            rows = slice(start, start + micro_batch_size)
            micro = batch[rows]
            loss, metrics = grpo_loss(
                _policy_logprobs(weights, micro["input_ids"]), micro, ref_logprobs=ref_logprobs[rows], **kwargs
            )
            loss.backward()
            total_loss += loss.item()
            for key, value in metrics.items():
                total_metrics[key] = total_metrics.get(key, 0.0) + value
        results[micro_batch_size] = (total_loss, weights.grad.clone(), total_metrics)

    full_loss, full_grad, full_metrics = results[4]
    assert full_grad.abs().sum() > 0
    for micro_batch_size in (1, 2):
        loss, grad, metrics = results[micro_batch_size]
        assert loss == pytest.approx(full_loss, abs=1e-6)
        torch.testing.assert_close(grad, full_grad, atol=1e-6, rtol=0)
        for key, value in full_metrics.items():
            assert metrics[key] == pytest.approx(value, abs=1e-6), key

    # The data does discriminate: averaging per-micro-batch token means (micro-batches of 1) is different.
    per_row_means = []
    for row in range(4):
        micro = batch[row : row + 1]
        loss, _ = grpo_loss(
            _policy_logprobs(weights, micro["input_ids"]),
            micro,
            ref_logprobs=ref_logprobs[row : row + 1],
            **{**kwargs, "num_loss_tokens": int(micro["loss_mask"].sum())},
        )
        per_row_means.append(loss.item())
    assert abs(sum(per_row_means) / 4 - full_loss) > 1e-3
