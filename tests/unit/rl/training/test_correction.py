"""Rollout correction against hand-computed numbers: IS weights, rejection, veto, diagnostics, presets."""

import math
from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict

from rl.config.loss import LossConfig, RolloutCorrectionConfig
from rl.metrics.reduce import StepStats
from rl.packing.rows import local_sequences
from rl.training import correction
from rl.training.train_step import train_step

P = "rollout_corr/"
# One row: sequence 0 = positions 0..2 (tokens 1, 2 sampled), sequence 1 = positions 3..4 (token 4), a pad.
# π_train / π_rollout on the sampled tokens: 3, 0.5 and 1e-5 (a catastrophic token).
SEQUENCE_IDS = torch.tensor([[0, 0, 0, 1, 1, -1]])
MASK = torch.tensor([[False, True, True, False, True, False]])
ROLLOUT = torch.tensor([[0.0, -1.0, -1.0, 0.0, -1.0, 0.0]], dtype=torch.float64)
TRAIN = ROLLOUT + torch.tensor([[0.0, math.log(3), math.log(0.5), 0.0, math.log(1e-5), 0.0]], dtype=torch.float64)


def _correct(**config):
    stats = StepStats()
    index, count = local_sequences(SEQUENCE_IDS)
    weights, keep = correction.correct(TRAIN, ROLLOUT, MASK, index, count, RolloutCorrectionConfig(**config), stats)
    return weights, keep, correction.correction_metrics(stats.states())


def test_token_is_weights_bounded_truncated_and_zero_off_the_mask():
    weights, keep, m = _correct(rollout_is="token", rollout_is_threshold=2.5)
    torch.testing.assert_close(weights, torch.tensor([[0.0, 2.5, 0.5, 0.0, 1e-5, 0.0]]))
    assert keep.tolist() == MASK.tolist()  # IS never rejects
    assert m[P + "rollout_is_mean"] == pytest.approx((3 + 0.5 + 1e-5) / 3)
    assert m[P + "rollout_is_max"] == pytest.approx(3.0) and m[P + "rollout_is_min"] == pytest.approx(1e-5)
    assert m[P + "rollout_is_std"] == pytest.approx(
        torch.tensor([3, 0.5, 1e-5], dtype=torch.float64).std(unbiased=False).item()
    )
    assert m[P + "rollout_is_ratio_fraction_high"] == pytest.approx(1 / 3)  # 3 > 2.5
    assert m[P + "rollout_is_ratio_fraction_low"] == pytest.approx(1 / 3)  # 1e-5 < 1/2.5
    # sequence ratios 3 * 0.5 = 1.5 and 1e-5
    assert m[P + "rollout_is_seq_mean"] == pytest.approx((1.5 + 1e-5) / 2)
    assert m[P + "rollout_is_seq_max"] == pytest.approx(1.5) and m[P + "rollout_is_seq_min"] == pytest.approx(1e-5)
    assert m[P + "rollout_is_seq_max_deviation"] == pytest.approx(1 - 1e-5)
    assert m[P + "rollout_is_seq_fraction_high"] == 0 and m[P + "rollout_is_seq_fraction_low"] == pytest.approx(0.5)


def test_sequence_is_weights_are_the_product_broadcast_to_the_sequence():
    weights, _, m = _correct(rollout_is="sequence", rollout_is_threshold=1.2)
    torch.testing.assert_close(weights, torch.tensor([[0.0, 1.2, 1.2, 0.0, 1e-5, 0.0]]))  # 1.5 truncated at 1.2
    assert m[P + "rollout_is_mean"] == pytest.approx((1.5 + 1e-5) / 2)
    assert m[P + "rollout_is_ratio_fraction_high"] == pytest.approx(0.5)


def test_sequence_safety_bound_keeps_weights_finite():
    stats = StepStats()
    index, count = local_sequences(SEQUENCE_IDS)
    train = ROLLOUT + torch.where(MASK, 30.0, 0.0)  # sequence 0: log ratio 60, unbounded e^60
    weights, _ = correction.correct(
        train,
        ROLLOUT,
        MASK,
        index,
        count,
        RolloutCorrectionConfig(rollout_is="sequence", rollout_is_threshold=1e9),
        stats,
    )
    assert weights[0, 1].item() == pytest.approx(math.exp(20), rel=1e-6)  # bounded at e^20 before truncation


@pytest.mark.parametrize(
    "config, keep, masked_fraction, seq_masked_fraction",
    [
        # token, [0.4, 2.5]: 3 and 1e-5 are out
        (dict(rollout_rs="token", rollout_rs_threshold=2.5), [2], 2 / 3, 1.0),
        # sequence, [0.5, 2]: 1.5 kept, 1e-5 out
        (dict(rollout_rs="sequence", rollout_rs_threshold=2.0), [1, 2], 1 / 3, 0.5),
        # geometric, [0.5, 1.3]: sqrt(1.5) = 1.2247 kept, 1e-5 out
        (dict(rollout_rs="geometric", rollout_rs_threshold=1.3, rollout_rs_threshold_lower=0.5), [1, 2], 1 / 3, 0.5),
        # geometric, [0.999, 1.001] (lower = the explicit value): both out
        (dict(rollout_rs="geometric", rollout_rs_threshold=1.001, rollout_rs_threshold_lower=0.999), [], 1.0, 1.0),
    ],
)
def test_rejection_modes(config, keep, masked_fraction, seq_masked_fraction):
    weights, kept, m = _correct(**config)
    assert weights is None
    assert [i for i in range(6) if kept[0, i]] == keep
    assert m[P + "rollout_rs_masked_fraction"] == pytest.approx(masked_fraction)
    assert m[P + "rollout_rs_seq_masked_fraction"] == pytest.approx(seq_masked_fraction)


def test_veto_rejects_the_whole_sequence_of_a_catastrophic_token_and_leaves_weights_alone():
    weights, kept, m = _correct(rollout_is="token", rollout_token_veto_threshold=1e-4)
    assert [i for i in range(6) if kept[0, i]] == [1, 2]
    assert m[P + "rollout_is_catastrophic_token_fraction"] == pytest.approx(1 / 3)
    assert m[P + "rollout_is_veto_fraction"] == pytest.approx(0.5)
    assert weights[0, 4].item() == pytest.approx(1e-5)


def test_offpolicy_diagnostics_hand_computed():
    stats = StepStats()
    index, count = local_sequences(SEQUENCE_IDS)
    correction.offpolicy_metrics(TRAIN, ROLLOUT, MASK, index, count, stats)
    m = correction.correction_metrics(stats.states())
    logs = [math.log(3), math.log(0.5), math.log(1e-5)]
    assert m[P + "kl"] == pytest.approx(-sum(logs) / 3)
    assert m[P + "k3_kl"] == pytest.approx(sum(math.exp(x) - x - 1 for x in logs) / 3)
    assert m[P + "chi2_token"] == pytest.approx((9 + 0.25 + 1e-10) / 3 - 1)
    assert m[P + "chi2_seq"] == pytest.approx((1.5**2 + 1e-10) / 2 - 1)
    # per-sequence mean log-probs: training -0.79726745 and -12.51292546, rollout -1 and -1
    train_means = [(-2 + math.log(1.5)) / 2, -1 + math.log(1e-5)]
    diffs = [t + 1 for t in train_means]
    assert m[P + "training_log_ppl"] == pytest.approx(-sum(train_means) / 2)
    assert m[P + "rollout_log_ppl"] == pytest.approx(1.0)
    assert m[P + "training_ppl"] == pytest.approx(sum(math.exp(-t) for t in train_means) / 2)
    assert m[P + "rollout_ppl"] == pytest.approx(math.e)
    assert m[P + "log_ppl_diff"] == pytest.approx(sum(diffs) / 2)
    assert m[P + "log_ppl_abs_diff"] == pytest.approx(sum(abs(d) for d in diffs) / 2)
    assert m[P + "log_ppl_diff_max"] == pytest.approx(max(diffs)) and m[P + "log_ppl_diff_min"] == pytest.approx(
        min(diffs)
    )
    assert m[P + "ppl_ratio"] == pytest.approx(math.exp(-sum(diffs) / 2))


class UnigramLM(torch.nn.Module):
    """A real (tiny) causal LM: next-token logits = one learned vector, whatever the prefix."""

    def __init__(self, vocab: int = 3):
        super().__init__()
        self.logits = torch.nn.Parameter(torch.zeros(vocab))
        self.forwards = 0
        """Forward passes of the decoder (the no-grad pass and the update's)."""

    def forward(self, input_ids, position_ids=None, use_cache=False):
        return SimpleNamespace(logits=self.logits.expand(*input_ids.shape, -1))

    def get_decoder(self):
        """Hidden state 1 at every position (the output layer reads only trained positions, `rl.training.logprobs`)."""

        def decoder(input_ids, position_ids=None, use_cache=False):
            self.forwards += 1
            return SimpleNamespace(last_hidden_state=torch.ones(*input_ids.shape, 1))

        return decoder

    def get_output_embeddings(self):
        return lambda hidden: hidden * self.logits  # [N,1] -> [N,V]


def _batch() -> TensorDict:
    """The hand row with π_train = uniform over 3 tokens; sampler logprobs set for ratios 3, 0.5, 1e-5."""
    log_third = math.log(1 / 3)
    ratios = torch.tensor([[1.0, 3.0, 0.5, 1.0, 1e-5, 1.0]])
    sampling = torch.where(MASK, log_third - ratios.log(), 0.0)
    return TensorDict(
        {
            "input_ids": torch.tensor([[0, 1, 2, 0, 1, 0]]),
            "position_ids": torch.tensor([[0, 1, 2, 0, 1, 0]]),
            "sequence_ids": SEQUENCE_IDS.clone(),
            "loss_mask": MASK.clone(),
            "sampling_logprobs": sampling.float(),
            "advantages": torch.tensor([[1.0, 1.0, 1.0, -1.0, -1.0, 0.0]]),
            "rl_weights": MASK.float(),
            "ce_weights": torch.zeros(1, 6),
            "ref_kl_weights": torch.zeros(1, 6),
            "ref_logprobs": torch.zeros(1, 6),
            "policy_version": torch.zeros(1, 6, dtype=torch.long),
        },
        batch_size=[1],
    )


def _step(model=None, **rollout_correction):
    model = model or UnigramLM()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    algorithm = LossConfig(rollout_correction=rollout_correction)
    metrics = train_step(model, optimizer, scheduler, [_batch()], algorithm, max_grad_norm=1e9, horizon=6)
    return metrics, model.logits.grad


def test_rejected_tokens_leave_the_loss_and_its_normalizer():
    metrics, grad = _step(rollout_rs="token", rollout_rs_threshold=2.5, bypass_mode=False)
    # only position 2 (ratio 0.5, A = +1) is left: num_loss_tokens 1; decoupled, so the PPO ratio is 1 and
    # the loss is -A = -1 with gradient d(-logp_2)/d logits = softmax - onehot(2) = [1/3, 1/3, -2/3].
    assert metrics["num_loss_tokens"] == 1 and metrics["loss"] == pytest.approx(-1.0)
    torch.testing.assert_close(grad, torch.tensor([1 / 3, 1 / 3, -2 / 3]))


def test_pg_is_preset_weights_the_policy_gradient_and_batch_normalization_and_ess():
    metrics, _grad = _step(preset="pg_is", rollout_is_threshold=2.0)
    # sequence weights min(1.5, 2) = 1.5 on tokens 1, 2 (A +1) and 1e-5 on token 4 (A -1); loss -w*A / 3
    assert metrics["loss"] == pytest.approx((-1.5 - 1.5 + 1e-5) / 3)
    # ESS over sequences of the final weights [1.5, 1e-5]: mean^2 / mean of squares
    ess = ((1.5 + 1e-5) / 2) ** 2 / ((1.5**2 + 1e-10) / 2)
    assert metrics[P + "rollout_is_eff_sample_size"] == pytest.approx(ess)
    normalized, _ = _step(preset="pg_is", rollout_is_threshold=2.0, rollout_is_batch_normalize=True)
    scale = 2 / (1.5 + 1e-5)  # per-sequence mean of the weights becomes 1
    assert normalized["loss"] == pytest.approx((-1.5 - 1.5 + 1e-5) * scale / 3, rel=1e-5)


def test_ppo_is_bypass_logs_the_effective_sample_size_of_its_measured_weights():
    # verl's rollout correction: ESS whenever IS is computed. Token weights min(r, 2) for r = 3, 0.5, 1e-5: [2, 0.5, 1e-5];
    # ESS = mean^2 / mean of squares
    metrics, _ = _step(preset="ppo_is_bypass")
    weights = [2.0, 0.5, 1e-5]
    ess = (sum(weights) / 3) ** 2 / (sum(w * w for w in weights) / 3)
    assert metrics[P + "rollout_is_eff_sample_size"] == pytest.approx(ess)


@pytest.mark.parametrize(
    "rollout_correction, forwards",
    [
        ({"preset": "ppo_is_bypass"}, 1),  # bypass skips the no-grad pass
        ({"preset": "pg_is"}, 1),
        ({"bypass_mode": True}, 1),
        ({"preset": "pg_rs"}, 2),  # rejection changes the loss's normalizer: decided before the update
        ({"preset": "pg_is", "rollout_is_batch_normalize": True}, 2),  # needs every weight of the step first
        ({"preset": "decoupled_token_is"}, 2),  # π_old from the no-grad pass
    ],
)
def test_bypass_presets_pay_no_extra_forward(rollout_correction, forwards):
    model = UnigramLM()
    _step(model, **rollout_correction)
    assert model.forwards == forwards


def test_ppo_is_bypass_only_measures():
    metrics, _ = _step(preset="ppo_is_bypass")
    plain, _ = _step()
    assert metrics["loss"] == pytest.approx(plain["loss"])  # weights are not applied: the ratio already has them
    assert metrics[P + "rollout_is_mean"] == pytest.approx((3 + 0.5 + 1e-5) / 3)
    assert P + "rollout_is_mean" not in plain and plain[P + "kl"] == pytest.approx(metrics[P + "kl"], rel=1e-5)


def test_presets_fill_unset_keys_and_yield_to_explicit_ones():
    config = RolloutCorrectionConfig(preset="decoupled_geo_rs", rollout_rs_threshold=1.01)
    assert (config.rollout_rs, config.rollout_rs_threshold) == ("geometric", 1.01)
    assert config.rs_lower == pytest.approx(1 / 1.01)  # the overridden upper bound's reciprocal, not the preset's 0.999
    assert config.rollout_token_veto_threshold == 1e-4 and config.bypass_mode is False
    pg_rs = RolloutCorrectionConfig(preset="pg_rs")
    assert pg_rs.use_policy_gradient and pg_rs.bypass_mode and pg_rs.rollout_is is None
    assert RolloutCorrectionConfig(rollout_rs="token", rollout_rs_threshold=4.0).rs_lower == 0.25
    assert not RolloutCorrectionConfig(preset="disabled").corrects


@pytest.mark.parametrize(
    "config, message",
    [
        (dict(rollout_is_threshold=True), "rollout_is_threshold must be a positive number"),
        (dict(rollout_rs_threshold=0.0, rollout_rs="token"), "rollout_rs_threshold must be positive"),
        (dict(rollout_token_veto_threshold=-1e-4), "rollout_token_veto_threshold must be positive"),
        (dict(rollout_rs="token"), "rollout_rs is set but rollout_rs_threshold is not"),
        (
            dict(rollout_rs="token", rollout_rs_threshold=2.0, rollout_rs_threshold_lower=3.0),
            "rollout_rs_threshold_lower .* is above",
        ),
        (dict(use_policy_gradient=True, bypass_mode=False), "use_policy_gradient needs bypass_mode"),
        (dict(preset="nope"), "preset"),
    ],
)
def test_bad_correction_configs_name_the_key(config, message):
    with pytest.raises(ValueError, match=message):
        RolloutCorrectionConfig(**config)


def test_kl_in_reward_moves_the_sequence_kl_into_the_advantages():
    # reference p = [0.5, 0.25, 0.25]: the sampled tokens (ids 1, 2, 1) have ref logprob ln 0.25. k1 of the
    # sampler vs the reference, per token: ln(1/3) - ln r - ln(1/4) = ln(4/3) - ln r, r = 3, 0.5, 1e-5.
    # Sequence sums times 0.1 come off the advantages: A = 1 - 0.1 * ln(32/27), -1 - 0.1 * (ln(4/3) - ln 1e-5).
    # PPO vs the sampler (bypass): r = 3 (A > 0) clipped at 1.28, r = 0.5 -> r*A, r = 1e-5 (A < 0) clipped at 0.8.
    reference = UnigramLM()
    with torch.no_grad():
        reference.logits.copy_(torch.tensor([math.log(2.0), 0.0, 0.0]))
    model = UnigramLM()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    algorithm = LossConfig(kl_coef=0.1, kl_estimator="k1", kl_in_reward=True)
    metrics = train_step(
        model, optimizer, scheduler, [_batch()], algorithm, max_grad_norm=1e9, horizon=6, reference=reference
    )
    a0 = 1 - 0.1 * math.log(32 / 27)
    a1 = -1 - 0.1 * (math.log(4 / 3) - math.log(1e-5))
    assert metrics["loss"] == pytest.approx((-1.28 * a0 - 0.5 * a0 - 0.8 * a1) / 3, abs=1e-6)  # float32 cancellation
    assert metrics["kl"] == pytest.approx(math.log(4 / 3), rel=1e-5)  # the policy's own KL, logged not added


def test_overriding_a_presets_upper_bound_takes_its_reciprocal_as_the_lower():
    # seed: rollout_rs_threshold_lower unset = 1 / rollout_rs_threshold; the preset's literal 0.5 belongs to its 2.0
    assert RolloutCorrectionConfig(preset="decoupled_seq_is_rs").rs_lower == 0.5
    assert RolloutCorrectionConfig(preset="decoupled_seq_is_rs", rollout_rs_threshold=4.0).rs_lower == 0.25
    assert RolloutCorrectionConfig(preset="decoupled_geo_rs", rollout_rs_threshold=1.01).rs_lower == pytest.approx(
        1 / 1.01
    )
    both = RolloutCorrectionConfig(
        preset="decoupled_seq_is_rs", rollout_rs_threshold=4.0, rollout_rs_threshold_lower=0.1
    )
    assert both.rs_lower == 0.1


def _sequence_metrics(log_ratio: float) -> dict[str, float]:
    """Sequence IS diagnostics with sequence 0's summed log ratio `log_ratio` (two tokens, half each), sequence
    1's 0."""
    train = ROLLOUT + torch.tensor([[0.0, log_ratio / 2, log_ratio / 2, 0.0, 0.0, 0.0]], dtype=torch.float64)
    stats = StepStats()
    index, count = local_sequences(SEQUENCE_IDS)
    correction.correct(train, ROLLOUT, MASK, index, count, RolloutCorrectionConfig(rollout_is="sequence"), stats)
    return correction.correction_metrics(stats.states())


def test_sequence_is_min_max_are_the_unbounded_ratios():
    # verl's diagnostics: sequence-level min/max from the unbounded log ratios. A true e^38 = 3.1855931757113756e16 reads as
    # such (before: e^20 = 485165195.40979, the safety bound), its log 38 beside it; the other sequence's is e^0 = 1.
    m = _sequence_metrics(38.0)
    for key in ("rollout_is", "rollout_is_seq"):
        assert m[P + key + "_max"] == pytest.approx(3.1855931757113756e16, rel=1e-12)
        assert m[P + key + "_log_max"] == pytest.approx(38.0) and m[P + key + "_min"] == pytest.approx(1.0)
    assert m[P + "rollout_is_seq_max_deviation"] == pytest.approx(3.1855931757113756e16 - 1, rel=1e-12)
    m = _sequence_metrics(-38.0)
    assert m[P + "rollout_is_min"] == pytest.approx(math.exp(-38.0), rel=1e-12) and m[P + "rollout_is_max"] == 1.0


def test_sequence_is_diagnostics_stay_finite_past_exp_overflow():
    # sequence 0's summed log ratio is 800 > 709 (float64 exp overflows): its max reads e^709, the largest float64
    # power of e, its log 800; the mean is of ratios bounded at ±20 like verl's: (e^20 + 1) / 2.
    m = _sequence_metrics(800.0)
    assert m[P + "rollout_is_seq_max"] == pytest.approx(math.exp(709.0), rel=1e-12)
    assert m[P + "rollout_is_seq_log_max"] == pytest.approx(800.0)
    assert m[P + "rollout_is_seq_mean"] == pytest.approx((485165195.40979 + 1) / 2, rel=1e-9)
    assert all(
        math.isfinite(m[P + key])
        for key in ("rollout_is_seq_mean", "rollout_is_seq_std", "rollout_is_seq_max_deviation")
    )
