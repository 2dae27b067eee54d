"""The trainer's update function on the real tiny Qwen3 model (fp32): split invariance, clipping, LR, K steps."""

import copy
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from rl.assets import resolve_model_path
from rl.config.loss import LossConfig
from rl.config.roles import TrainerConfig
from rl.packing.rows import TrainSample, pack_samples, split_micro_batches
from rl.training.logprobs import token_logprobs
from rl.training.losses import ppo_clip_token_loss
from rl.training.schedule import lr_lambda
from rl.training.train_step import train_step

SEQ_LEN = 24


@pytest.fixture(scope="module")
def base_model():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-qwen3"), dtype=torch.float32).train()


def _samples(model, n=8, seed=0, **streams) -> list[TrainSample]:
    """n samples of 5..12 tokens; sampling logprobs = the model's own plus noise, so ratios are not 1."""
    generator = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(n):
        length = 5 + (i * 3) % 8
        ids = torch.randint(0, 1000, (length,), generator=generator).tolist()
        prompt = 2 + i % 2
        mask = [False] * prompt + [True] * (length - prompt)
        with torch.no_grad():
            own = token_logprobs(model, torch.tensor([ids]), torch.arange(length)[None])[0]
        noise = torch.randn(length, generator=generator) * 0.3
        sampling = [float(own[t] + noise[t]) if mask[t] else 0.0 for t in range(length)]
        advantage = float(torch.randn((), generator=generator))
        samples.append(
            TrainSample(ids, mask, sampling, advantage, 0, **{k: v(length, mask) for k, v in streams.items()})
        )
    return samples


def _sgd(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def _grads(model, samples, micro_batch_size, algorithm=LossConfig(), max_grad_norm=1e9):
    """Gradients left by one train_step (no zero_grad here: train_step must clear the previous call's)."""
    optimizer, scheduler = _sgd(model)
    batch = pack_samples(samples, seq_len=SEQ_LEN, pad_token_id=0)
    metrics = train_step(
        model,
        optimizer,
        scheduler,
        split_micro_batches(batch, micro_batch_size),
        algorithm,
        max_grad_norm=max_grad_norm,
        horizon=SEQ_LEN,
    )
    return [p.grad.clone() for p in model.parameters()], metrics


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_gradients_do_not_depend_on_the_micro_batch_size(base_model, aggregation):
    samples = _samples(base_model)
    algorithm = LossConfig(aggregation=aggregation)
    grads_1, metrics_1 = _grads(base_model, samples, 1, algorithm)
    grads_4, metrics_4 = _grads(base_model, samples, 4, algorithm)
    assert sum(float(g.abs().sum()) for g in grads_1) > 0
    for g1, g4 in zip(grads_1, grads_4):
        torch.testing.assert_close(g1, g4, atol=1e-6, rtol=0)
    for key in ("loss", "pg_loss", "clip_frac_low", "clip_frac_high", "ratio_mean", "ratio_max", "ratio_std"):
        assert metrics_1[key] == pytest.approx(metrics_4[key], abs=1e-6), key


def test_grad_norm_is_the_norm_before_clipping(base_model):
    samples = _samples(base_model)
    grads, metrics = _grads(base_model, samples, 4)
    manual = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads))
    clipped_grads, clipped_metrics = _grads(base_model, samples, 4, max_grad_norm=1e-3)
    assert metrics["grad_norm"] == pytest.approx(manual, rel=1e-5)
    assert clipped_metrics["grad_norm"] == pytest.approx(manual, rel=1e-5)
    after = math.sqrt(sum(float((g.double() ** 2).sum()) for g in clipped_grads))
    assert after == pytest.approx(1e-3, rel=1e-4)


def _old_update(model, micro_batches, lr, max_grad_norm):
    """The update before this change: PPO vs sampler logprobs, token mean over the step's loss tokens, AdamW."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    num_loss_tokens = sum(int(mb["loss_mask"].sum()) for mb in micro_batches)
    optimizer.zero_grad()
    for mb in micro_batches:
        logprobs = token_logprobs(model, mb["input_ids"], mb["position_ids"])
        mask = mb["loss_mask"]
        sampling = torch.where(mask, mb["sampling_logprobs"], logprobs.detach())
        loss, _ = ppo_clip_token_loss(logprobs, sampling, mb["advantages"], clip_eps_low=0.2, clip_eps_high=0.28)
        (torch.where(mask, loss, 0.0).sum() / num_loss_tokens).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()


def test_one_minibatch_reproduces_the_previous_update_exactly(base_model):
    samples = _samples(base_model)
    micro_batches = split_micro_batches(pack_samples(samples, seq_len=SEQ_LEN, pad_token_id=0), 2)
    old, new = copy.deepcopy(base_model), copy.deepcopy(base_model)
    _old_update(old, micro_batches, lr=1e-3, max_grad_norm=1.0)
    optimizer = torch.optim.AdamW(new.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    train_step(new, optimizer, scheduler, micro_batches, LossConfig(), max_grad_norm=1.0, horizon=SEQ_LEN)
    changed = 0
    for p_old, p_new, p_base in zip(old.parameters(), new.parameters(), base_model.parameters()):
        assert torch.equal(p_old, p_new)
        changed += not torch.equal(p_new, p_base)
    assert changed > 0


def test_k_minibatches_are_k_optimizer_steps_and_the_lr_schedule_counts_them(base_model):
    samples = _samples(base_model)
    micro_batches = split_micro_batches(pack_samples(samples, seq_len=SEQ_LEN, pad_token_id=0), 2)
    trainer_config = TrainerConfig(lr=1e-3, lr_schedule="linear", warmup_steps=1)
    # bypass mode: each minibatch's update is the plain step on its own micro-batches, so K = 2 over the
    # batch equals two K = 1 calls on its halves, schedule included.
    k2, halves = copy.deepcopy(base_model), copy.deepcopy(base_model)
    results = []
    for model, calls in (
        (k2, [(micro_batches, 2)]),
        (halves, [(micro_batches[: len(micro_batches) // 2], 1), (micro_batches[len(micro_batches) // 2 :], 1)]),
    ):
        optimizer = torch.optim.AdamW(model.parameters(), lr=trainer_config.lr)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(trainer_config, total_steps=4))
        for mbs, k in calls:
            metrics = train_step(
                model, optimizer, scheduler, mbs, LossConfig(), max_grad_norm=1.0, horizon=SEQ_LEN, n_minibatches=k
            )
        results.append(metrics["lr"])
    for p_k2, p_halves in zip(k2.parameters(), halves.parameters()):
        torch.testing.assert_close(p_k2, p_halves, atol=1e-7, rtol=0)
    # after 2 optimizer steps of a 4-step linear schedule with 1 warmup step: 1e-3 * (1 - 1/3)
    assert results == [pytest.approx(1e-3 * (2 / 3))] * 2


def test_optimizer_steps_count_the_updates_of_a_step_and_of_the_run(base_model):
    # AReaL's ppo_n_minibatches: optimizer steps = K x accepted batches. K = 2, then K = 1: 2 and 1 this step, 2 and 3 in the run;
    # then a NaN weight makes the gradient non-finite: the update is skipped, 0 this step, still 3 in the run.
    model = copy.deepcopy(base_model)
    micro_batches = split_micro_batches(pack_samples(_samples(model), seq_len=SEQ_LEN, pad_token_id=0), 2)
    optimizer, scheduler = _sgd(model)
    counts = []
    for k in (2, 1, 1):
        if len(counts) == 2:
            with torch.no_grad():
                next(model.parameters()).view(-1)[0] = math.nan
        metrics = train_step(
            model,
            optimizer,
            scheduler,
            micro_batches,
            LossConfig(),
            max_grad_norm=1.0,
            horizon=SEQ_LEN,
            n_minibatches=k,
        )
        counts.append(
            (metrics["optimizer_steps"], metrics["optimizer_steps_total"], metrics["skipped_nonfinite_steps"])
        )
    assert counts == [(2.0, 2.0, 0.0), (1.0, 3.0, 0.0), (0.0, 3.0, 1.0)]


def test_decoupled_mode_anchors_on_old_policy_computed_once(base_model):
    samples = _samples(base_model)
    micro_batches = split_micro_batches(pack_samples(samples, seq_len=SEQ_LEN, pad_token_id=0), 2)
    algorithm = LossConfig(rollout_correction={"bypass_mode": False})
    model = copy.deepcopy(base_model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # weights stay π_old: every ratio is exactly 1
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    metrics = train_step(
        model, optimizer, scheduler, micro_batches, algorithm, max_grad_norm=1.0, horizon=SEQ_LEN, n_minibatches=2
    )
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-6) and metrics["ratio_max"] == pytest.approx(
        1.0, abs=1e-6
    )
    assert metrics["clip_frac_low"] == 0 and metrics["clip_frac_high"] == 0
    assert metrics["rollout_corr/k3_kl"] > 0  # the sampler's noise is still measured


def test_all_empty_batch_runs_a_zero_gradient_backward(base_model):
    zero = lambda n, mask: [0.0] * n
    samples = _samples(base_model, n=3, rl_weights=zero)
    grads, metrics = _grads(base_model, samples, 2)
    assert all(g is not None and float(g.abs().sum()) == 0 for g in grads)
    assert metrics["loss"] == 0 and metrics["num_loss_tokens"] == 0 and "pg_loss" not in metrics


def test_nonfinite_sampler_logprobs_are_masked_and_counted(base_model):
    samples = _samples(base_model, n=4)
    clean_grads, _ = _grads(base_model, samples, 2)
    poisoned = copy.deepcopy(samples)
    extra = copy.deepcopy(samples[0])
    extra.sampling_logprobs = [float("nan") if m else 0.0 for m in extra.loss_mask]
    extra.sampling_logprobs[-1] = float("-inf")
    # the poisoned sample's tokens are all dropped: the other samples' gradient is unchanged
    grads, metrics = _grads(base_model, [*poisoned, extra], 2)
    assert metrics["nonfinite_logprob_tokens"] == sum(extra.loss_mask)
    for g_clean, g in zip(clean_grads, grads):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, g_clean, atol=1e-6, rtol=0)


def test_minibatches_are_disjoint_and_fall_back_to_rows():
    from tensordict import TensorDict

    from rl.training.train_step import split_minibatches

    rows = TensorDict({"x": torch.arange(5)[:, None]}, batch_size=[5])
    groups = split_minibatches(list(rows.split(2)), 2)  # micro-batches of 2, 2, 1 rows
    assert [[mb["x"][:, 0].tolist() for mb in group] for group in groups] == [[[0, 1], [2, 3]], [[4]]]
    groups = split_minibatches(list(rows.split(4)), 3)  # 2 micro-batches < 3: single rows
    assert [[mb["x"][0, 0].item() for mb in group] for group in groups] == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="ppo_n_minibatches = 6 but the batch has only 5 packed rows"):
        split_minibatches(list(rows.split(4)), 6)


def test_ppo_kl_is_zero_with_one_minibatch_and_positive_once_the_inner_loop_drifts(base_model):
    # train/ppo_kl is the k3 drift of the policy from the step-start snapshot. With K = 1 every token is
    # scored by the snapshot's own weights (exactly 0, whatever the sampler did); with K = 2 and a real learning
    # rate the second minibatch meets a moved policy, and k3 >= 0 with equality only where nothing moved.
    samples = _samples(base_model)
    micro_batches = split_micro_batches(pack_samples(samples, seq_len=SEQ_LEN, pad_token_id=0), 2)
    kl = {}
    for k in (1, 2):
        model = copy.deepcopy(base_model)
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        kl[k] = train_step(
            model,
            optimizer,
            scheduler,
            micro_batches,
            LossConfig(),
            max_grad_norm=1e9,
            horizon=SEQ_LEN,
            n_minibatches=k,
        )["ppo_kl"]
    assert kl[1] == 0.0 and kl[2] > 1e-6


def advantage_weighted_logprob(inputs, config):
    """A user's policy loss by import path: -A·log π_θ per token (REINFORCE without a ratio), nothing clipped."""
    return -inputs.advantages * inputs.logprobs, torch.zeros_like(inputs.mask), inputs.ratio


def test_a_custom_policy_loss_by_import_path_trains_its_own_value(base_model):
    """`loss.type = "package.module:function"`: the step's loss and gradients are that function's, checked against
    -Σ A·log π_θ / N computed here sample by sample on the unpacked sequences."""
    samples = _samples(base_model)
    config = LossConfig(type=f"{__name__}:advantage_weighted_logprob")
    grads, metrics = _grads(base_model, samples, 3, config)
    model = copy.deepcopy(base_model)
    model.zero_grad(set_to_none=True)
    tokens = sum(sum(sample.loss_mask) for sample in samples)
    total = 0.0
    for sample in samples:
        length = len(sample.input_ids)
        logprobs = token_logprobs(model, torch.tensor([sample.input_ids]), torch.arange(length)[None])[0]
        advantages = torch.as_tensor(sample.advantages, dtype=torch.float32)
        total = total - (advantages * logprobs)[torch.tensor(sample.loss_mask)].sum() / tokens
    total.backward()
    assert metrics["loss"] == pytest.approx(float(total.detach()), rel=1e-5, abs=1e-7)
    assert metrics["clip_frac_low"] == metrics["clip_frac_high"] == 0.0
    for mine, hand in zip(grads, (p.grad for p in model.parameters()), strict=True):
        torch.testing.assert_close(mine, hand, atol=1e-6, rtol=1e-4)
