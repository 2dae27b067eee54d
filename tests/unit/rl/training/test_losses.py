import math

import pytest
import torch
from tensordict import TensorDict

from rl.config.loss import LossConfig, loss_warnings
from rl.metrics.reduce import StepStats, merge_all, step_metrics
from rl.packing.rows import component_counts
from rl.training.losses import compute_loss, k3_kl, kl_estimate, ppo_clip_token_loss

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

    loss, clipped = ppo_clip_token_loss(logprobs, sampling_logprobs, advantages, clip_eps_low=0.2, clip_eps_high=0.28)
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


def test_k3_loss_term_is_clamped_to_ten_like_verl_and_skyrl() -> None:
    # verl kl_penalty_forward / SkyRL compute_approx_kl: k3 clamped to [-10, 10], no gradient beyond.
    # k1 = -2 -> e^2 - 2 - 1 = 4.38905610         grad 1 - e^2 = -6.38905610
    # k1 = -5 -> e^5 - 5 - 1 = 142.41315910 -> 10  grad 0
    # k1 = -9 -> e^9 - 9 - 1 = 8093.08392758 -> 10 grad 0
    # k1 = 12 -> e^-12 + 12 - 1 = 11.00000614 -> 10 grad 0
    logprobs = torch.tensor([-2.0, -5.0, -9.0, 12.0], dtype=torch.float64, requires_grad=True)
    k3 = kl_estimate(logprobs, torch.zeros(4, dtype=torch.float64), estimator="k3")
    k3.sum().backward()
    torch.testing.assert_close(k3, torch.tensor([4.38905610, 10.0, 10.0, 10.0], dtype=torch.float64), atol=1e-8, rtol=0)
    torch.testing.assert_close(
        logprobs.grad, torch.tensor([-6.38905610, 0.0, 0.0, 0.0], dtype=torch.float64), atol=1e-8, rtol=0
    )


def test_dual_clip_bounds_negative_advantage_tokens() -> None:
    # c = 2. (r, A): (3, -1) above c -> loss -c*A = 2, grad 0; (1.5, -1) below c -> unchanged 1.5, grad 1.5;
    # (3, +1) -> the ordinary high clip: -1.28, grad 0.
    logprobs = torch.tensor([math.log(3.0), math.log(1.5), math.log(3.0)], requires_grad=True)
    loss, clipped = ppo_clip_token_loss(
        logprobs, torch.zeros(3), torch.tensor([-1.0, -1.0, 1.0]), clip_eps_low=0.2, clip_eps_high=0.28, dual_clip_c=2.0
    )
    loss.sum().backward()
    torch.testing.assert_close(loss, torch.tensor([2.0, 1.5, -1.28]), atol=1e-6, rtol=0)
    torch.testing.assert_close(logprobs.grad, torch.tensor([0.0, 1.5, 0.0]), atol=1e-6, rtol=0)
    assert clipped.tolist() == [True, False, True]


def test_k1_and_k2_estimators_values_gradients_and_clamp() -> None:
    # k1 = logp - ref clamped to +-20: [0, ln2, -ln2, 20]; grad 1 except clamped. k2 = k1^2/2, grad k1.
    logprobs = torch.tensor([0.0, LN2, -LN2, 30.0], dtype=torch.float64, requires_grad=True)
    k1 = kl_estimate(logprobs, torch.zeros(4, dtype=torch.float64), estimator="k1")
    (grad_k1,) = torch.autograd.grad(k1.sum(), logprobs)
    k2 = kl_estimate(logprobs, torch.zeros(4, dtype=torch.float64), estimator="k2")
    (grad_k2,) = torch.autograd.grad(k2.sum(), logprobs)
    torch.testing.assert_close(k1, torch.tensor([0.0, LN2, -LN2, 20.0], dtype=torch.float64))
    torch.testing.assert_close(grad_k1, torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(
        k2, torch.tensor([0.0, 0.24022651, 0.24022651, 200.0], dtype=torch.float64), atol=1e-8, rtol=0
    )
    torch.testing.assert_close(grad_k2, torch.tensor([0.0, LN2, -LN2, 0.0], dtype=torch.float64))


def _hand_batch(**weights) -> tuple[torch.Tensor, TensorDict]:
    """One packed row: sequence 0 = positions 0..2 (tokens 1, 2 sampled), sequence 1 = positions 3..4 (token 4
    sampled), then a pad. Ratios vs the sampler: 1.5 (A +1), 1 (A +1), 0.5 (A -1); the pad has logp 100."""
    logprobs = torch.tensor([[-3.0, -1.0 + math.log(1.5), -2.0, -3.0, -1.0 + math.log(0.5), 100.0]], requires_grad=True)
    sampled = torch.tensor([[False, True, True, False, True, False]])
    batch = TensorDict(
        {
            "sequence_ids": torch.tensor([[0, 0, 0, 1, 1, -1]]),
            "loss_mask": sampled,
            "sampling_logprobs": torch.tensor([[0.0, -1.0, -2.0, 0.0, -1.0, 0.0]]),
            "advantages": torch.tensor([[1.0, 1.0, 1.0, -1.0, -1.0, 0.0]]),
            "rl_weights": weights.get("rl", sampled.float()),
            "ce_weights": weights.get("ce", torch.zeros(1, 6)),
            "ref_kl_weights": weights.get("ref_kl", torch.zeros(1, 6)),
            "ref_logprobs": torch.tensor([[0.0, -1.0, 0.0, 0.0, 0.0, 0.0]]),
        },
        batch_size=[1],
    )
    batch["old_logprobs"] = batch["sampling_logprobs"]
    return logprobs, batch


def _loss(batch, logprobs, **algorithm):
    stats = StepStats()
    loss = compute_loss(logprobs, batch, component_counts([batch]), LossConfig(**algorithm), stats, horizon=4)
    loss.backward()
    return loss.item(), logprobs.grad[0].tolist(), step_metrics(stats.states(), spread=("ratio",))


# Per-token values and d loss / d logp on the three sampled tokens (positions 1, 2, 4), token-mean over 3:
#   ppo   [-1.28, -1, 0.8]                  grads [0, -1, 0] / 3
#   pg    -r*A = [-1.5, -1, 0.5]            grads -r*A / 3
#   cispo -clamp(r)*A = [-1.28, -1, 0.8]    grads -clamp(r)*A / 3 (no token loses its gradient)
#   gspo  sequence 0: s = exp((ln 1.5 + 0) / 2) = 1.22474487 (inside [0.8, 1.28]) -> -s on both tokens, grad -s;
#         sequence 1: s = 0.5 with A < 0 -> clipped at 0.8, grad 0
# gspo's default aggregation is one mean per sequence (seq-mean-token-mean, as the paper, verl and SkyRL):
#         (mean(-s, -s) + 0.8) / 2 sequences; each token of sequence 0 gets -s / 2 tokens / 2 sequences.
@pytest.mark.parametrize(
    "loss_type, value, grads",
    [
        ("ppo", (-1.28 - 1 + 0.8) / 3, [0.0, -1 / 3, 0.0]),
        ("pg", (-1.5 - 1 + 0.5) / 3, [-0.5, -1 / 3, 0.5 / 3]),
        ("cispo", (-1.28 - 1 + 0.8) / 3, [-1.28 / 3, -1 / 3, 0.8 / 3]),
        ("gspo", (-1.22474487 + 0.8) / 2, [-1.22474487 / 4, -1.22474487 / 4, 0.0]),
    ],
)
def test_policy_losses_hand_computed(loss_type, value, grads) -> None:
    logprobs, batch = _hand_batch()
    loss, grad, metrics = _loss(batch, logprobs, type=loss_type)
    assert loss == pytest.approx(value, abs=1e-6)
    assert [grad[1], grad[2], grad[4]] == pytest.approx(grads, abs=1e-6)
    assert grad[0] == grad[3] == grad[5] == 0.0
    assert metrics["pg_loss"] == pytest.approx(value, abs=1e-6)


def test_gspo_defaults_to_one_mean_per_sequence_and_warns_on_another_aggregation() -> None:
    assert LossConfig(type="gspo").aggregation == "seq-mean-token-mean"
    assert LossConfig().aggregation == "token-mean"
    config = LossConfig(type="gspo", aggregation="token-mean")
    [warning] = loss_warnings(config)
    assert "weight sequences by length" in warning
    assert loss_warnings(LossConfig(type="gspo")) == loss_warnings(LossConfig(aggregation="seq-mean-token-sum")) == []
    logprobs, batch = _hand_batch()
    loss, _, _ = _loss(batch, logprobs, **config.model_dump(include={"type", "aggregation"}))
    assert loss == pytest.approx((-2 * 1.22474487 + 0.8) / 3, abs=1e-6)  # token-mean: sequence 0 counts twice


def test_ppo_metrics_hand_computed() -> None:
    logprobs, batch = _hand_batch()
    _, _, metrics = _loss(batch, logprobs)
    # clipped: r = 1.5 (A > 0) high, r = 0.5 (A < 0) low; ratios 1.5, 1, 0.5
    assert metrics["clip_frac_high"] == pytest.approx(1 / 3) and metrics["clip_frac_low"] == pytest.approx(1 / 3)
    assert metrics["ratio_mean"] == pytest.approx(1.0) and metrics["ratio_min"] == pytest.approx(0.5)
    assert metrics["ratio_max"] == pytest.approx(1.5) and metrics["ratio_std"] == pytest.approx(math.sqrt(1 / 6))
    # mismatch k3 = r - 1 - ln r: (0.5 - 0.40546511) + 0 + (-0.5 + 0.69314718), over 3
    assert metrics["mismatch_k3"] == pytest.approx(0.28768207 / 3, abs=1e-7)
    # no step-start snapshot given (one minibatch, no no-grad pass): the policy has not drifted from itself
    assert metrics["ppo_kl"] == 0.0


def test_ppo_kl_is_the_k3_drift_from_the_step_start_snapshot() -> None:
    # AReaL's k3 drift: mean of exp(d) - d - 1, d = logp_new - logp_snapshot, on the rl tokens (positions 1, 2, 4).
    # d = [ln 2, 0, ln 0.8]: (2 - 1 - 0.69314718) + 0 + (0.8 - 1 + 0.22314355) = 0.30685282 + 0.02314355, / 3
    # = 0.10999879 > 0, while the k1 mean(snapshot - new) = -(ln 2 + ln 0.8) / 3 = -0.15666788 < 0.
    logprobs, batch = _hand_batch()
    batch["snapshot_logprobs"] = logprobs.detach() - torch.tensor([[0.0, LN2, 0.0, 0.0, math.log(0.8), 0.0]])
    _, _, metrics = _loss(batch, logprobs)
    assert metrics["ppo_kl"] == pytest.approx(0.10999879, abs=1e-6)


# ppo per-token losses [-1.28, -1, 0.8]; sequence 0 holds the first two, sequence 1 the third; only the
# middle token has a gradient (-1 per unit weight).
@pytest.mark.parametrize(
    "aggregation, value, grad",
    [
        ("token-mean", -1.48 / 3, -1 / 3),
        ("seq-mean-token-mean", (-2.28 / 2 + 0.8) / 2, -1 / 4),
        ("seq-mean-token-sum", (-2.28 + 0.8) / 2, -1 / 2),
        ("seq-mean-token-sum-norm", (-2.28 + 0.8) / 2 / 4, -1 / 8),  # horizon 4
    ],
)
def test_aggregations_hand_computed(aggregation, value, grad) -> None:
    logprobs, batch = _hand_batch()
    loss, grads, _ = _loss(batch, logprobs, aggregation=aggregation)
    assert loss == pytest.approx(value, abs=1e-6)
    assert grads == pytest.approx([0.0, 0.0, grad, 0.0, 0.0, 0.0], abs=1e-7)


def test_ce_and_ref_kl_components_each_normalized_by_their_own_token_counts() -> None:
    # rl off. ce weight 1 on position 2 (logp -2) and 0.5 on position 4 (logp -1 + ln 0.5 = -1.69314718), over
    # its 2 tokens (a component's own token count, not Σw, as prime-rl's fixed cores): (2 + 0.5 * 1.69314718) / 2 = 1.42328680,
    # grads -w / 2. ref_kl weight 1 on position 1: teacher -1, k1 = -1 + ln 1.5 + 1 = 0.40546511, value k1 / 1, grad k1.
    logprobs, batch = _hand_batch(
        rl=torch.zeros(1, 6),
        ce=torch.tensor([[0.0, 0.0, 1.0, 0.0, 0.5, 0.0]]),
        ref_kl=torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0, 0.0]]),
    )
    loss, grads, metrics = _loss(batch, logprobs)
    assert metrics["ce_loss"] == pytest.approx(1.42328680, abs=1e-6)
    assert metrics["ref_kl_loss"] == pytest.approx(0.40546511, abs=1e-6)
    assert metrics["ref_kl/kl"] == pytest.approx(0.40546511, abs=1e-6)
    assert loss == pytest.approx(1.42328680 + 0.40546511, abs=1e-6)
    assert grads == pytest.approx([0.0, 0.40546511, -1 / 2, 0.0, -0.5 / 2, 0.0], abs=1e-6)
    assert "pg_loss" not in metrics


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_ce_and_ref_kl_are_token_means_whatever_the_policy_loss_aggregation(aggregation) -> None:
    # the ce and ref_kl cores are fixed token-count terms, unaffected by the policy loss's aggregation
    # (gspo's default seq-mean-token-mean included). ce weight 1 on positions 1, 2 (sequence 0; logp
    # -1 + ln 1.5 = -0.59453489 and -2) and 4 (sequence 1; logp -1.69314718): (0.59453489 + 2 + 1.69314718) / 3
    # = 1.42922736, gradient -1/3 each (per sequence it would be (1.29726745 + 1.69314718) / 2 = 1.49520731).
    # ref_kl weight 1 on the same tokens, teachers -1, 0, 0: k1 = 0.40546511, -2, -1.69314718, token mean
    # -3.28768207 / 3 = -1.09589402, gradient k1 / 3.
    weights = torch.tensor([[0.0, 1.0, 1.0, 0.0, 1.0, 0.0]])
    for loss_type in ("ppo", "gspo"):
        logprobs, batch = _hand_batch(rl=torch.zeros(1, 6), ce=weights)
        extra = {} if loss_type == "gspo" else {"aggregation": aggregation}
        _, grads, metrics = _loss(batch, logprobs, type=loss_type, **extra)
        assert metrics["ce_loss"] == pytest.approx(1.42922736, abs=1e-6)
        assert grads == pytest.approx([0.0, -1 / 3, -1 / 3, 0.0, -1 / 3, 0.0], abs=1e-6)
        logprobs, batch = _hand_batch(rl=torch.zeros(1, 6), ref_kl=weights)
        _, grads, metrics = _loss(batch, logprobs, type=loss_type, **extra)
        assert metrics["ref_kl_loss"] == pytest.approx(-1.09589402, abs=1e-6)
        assert grads == pytest.approx([0.0, 0.40546511 / 3, -2 / 3, 0.0, -1.69314718 / 3, 0.0], abs=1e-6)


@pytest.mark.parametrize("alpha", [1.0, 0.1, 0.001])
@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_a_component_weight_scales_its_loss_and_gradient(alpha, aggregation) -> None:
    # ce weight alpha on positions 2 (logp -2) and 4 (logp -1.69314718), each its sequence's only ce token:
    # token-mean alpha * (2 + 1.69314718) / 2 tokens; seq-mean-token-mean the same (1 token per sequence, 2 sequences).
    # Gradient -alpha / 2 on each: alpha scales the component, where a Σw normalizer would cancel it.
    logprobs, batch = _hand_batch(rl=torch.zeros(1, 6), ce=torch.tensor([[0.0, 0.0, alpha, 0.0, alpha, 0.0]]))
    _, grads, metrics = _loss(batch, logprobs, aggregation=aggregation)
    assert metrics["ce_loss"] == pytest.approx(alpha * 1.84657359, rel=1e-6)
    assert grads == pytest.approx([0.0, 0.0, -alpha / 2, 0.0, -alpha / 2, 0.0], rel=1e-6, abs=1e-12)


def test_reference_kl_term_uses_the_chosen_estimator() -> None:
    # kl_coef 0.1 with k1 on the sampled tokens: ref = logp - [ln 2, 0, -ln 2] -> k1 = [ln 2, 0, -ln 2], mean 0;
    # gradient 0.1 * 1 / 3 on every sampled token on top of the ppo gradient.
    logprobs, batch = _hand_batch()
    batch["kl_ref_logprobs"] = logprobs.detach() - torch.tensor([[0.0, LN2, 0.0, 0.0, -LN2, 0.0]])
    loss, grads, metrics = _loss(batch, logprobs, kl_coef=0.1, kl_estimator="k1")
    assert loss == pytest.approx(-1.48 / 3, abs=1e-6)
    assert [grads[1], grads[2], grads[4]] == pytest.approx([0.1 / 3, -1 / 3 + 0.1 / 3, 0.1 / 3], abs=1e-6)
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-7)


def test_empty_components_cost_nothing_and_backward_still_runs() -> None:
    logprobs, batch = _hand_batch(rl=torch.zeros(1, 6))
    loss, grads, metrics = _loss(batch, logprobs)
    assert loss == 0.0 and grads == [0.0] * 6 and metrics == {}


def _policy_logprobs(weights: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """A tiny shared-parameter 'policy': a unigram distribution softmax(weights) over the vocab."""
    return torch.log_softmax(weights, dim=0)[input_ids]  # [B,L]


def _eight_sequences() -> TensorDict:
    """8 rows, one sequence each, 1..7 sampled tokens with every component present somewhere."""
    generator = torch.Generator().manual_seed(0)
    lengths = [2, 7, 3, 5, 8, 4, 6, 2]
    rows = []
    for i, n in enumerate(lengths):
        mask = torch.zeros(8, dtype=torch.bool)
        mask[1:n] = True
        rows.append(
            {
                "input_ids": torch.randint(0, 5, (8,), generator=generator),
                "sequence_ids": torch.where(torch.arange(8) < n, i, -1),
                "loss_mask": mask,
                "sampling_logprobs": torch.where(mask, -torch.rand(8, generator=generator) * 3, 0.0),
                "advantages": torch.full((8,), float(torch.randn((), generator=generator))),
                "rl_weights": mask.float() * (i % 4 != 3),
                "ce_weights": mask.float() * 0.5 * (i % 3 == 0),
                "ref_kl_weights": mask.float() * (i % 4 == 3),
                "ref_logprobs": -torch.rand(8, generator=generator) * 3,
                "kl_ref_logprobs": -torch.rand(8, generator=generator) * 3,
            }
        )
    batch = TensorDict({k: torch.stack([r[k] for r in rows]) for k in rows[0]}, batch_size=[8])
    batch["old_logprobs"] = batch["sampling_logprobs"]
    return batch


@pytest.mark.parametrize(
    "aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
)
@pytest.mark.parametrize("loss_type", ["ppo", "gspo", "cispo", "pg"])
def test_loss_and_gradient_do_not_depend_on_micro_batches_or_ranks(aggregation, loss_type) -> None:
    batch = _eight_sequences()
    algorithm = LossConfig(aggregation=aggregation, type=loss_type, kl_coef=0.05)
    weights = torch.randn(5, generator=torch.Generator().manual_seed(1), requires_grad=True)

    def run(ranks: list[list[TensorDict]]) -> tuple[float, torch.Tensor, dict]:
        weights.grad = None
        # each rank counts its own micro-batches; the all-reduce is the sum of the rank counts
        counts = sum(component_counts(micro_batches) for micro_batches in ranks)
        total, stats = 0.0, []
        for micro_batches in ranks:
            rank_stats = StepStats()
            for micro in micro_batches:
                loss = compute_loss(
                    _policy_logprobs(weights, micro["input_ids"]), micro, counts, algorithm, rank_stats, horizon=8
                )
                loss.backward()  # gradients of all ranks summed, as an all-reduce (sum) would
                total += loss.item()
            stats.append(rank_stats.states())
        return total, weights.grad.clone(), step_metrics(merge_all(stats), spread=("ratio",))

    whole = run([[batch]])
    four = run([list(batch.split(2))])
    two_ranks = run([list(batch[:4].split(2)), list(batch[4:].split(2))])
    assert whole[1].abs().sum() > 0
    for other in (four, two_ranks):
        assert other[0] == pytest.approx(whole[0], abs=1e-6)
        torch.testing.assert_close(other[1], whole[1], atol=1e-6, rtol=0)
        assert other[2].keys() == whole[2].keys()
        for key, value in whole[2].items():
            assert other[2][key] == pytest.approx(value, abs=1e-6), key
