"""Trainer precision: autocast over fp32 master weights, and the sampler-mismatch warning."""

import pytest
import torch

from rl.config import Config, ConfigError
from rl.loop import resolve
from rl.loop.resolve import resolve_config
from rl.precision import (
    MismatchWatch,
    compute_context,
    computes_on_a_copy,
    known_not_to_learn,
    precision_warnings,
    resolve_precision,
)


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


def test_mismatch_watch_names_the_rows_staleness_when_the_step_trained_older_versions_rows():
    watch = MismatchWatch(factor=5.0, floor=1e-3)
    assert watch.check(0.001, staleness=1) is None
    warning = watch.check(0.03, staleness=2)
    assert warning is not None and "up to 2 version(s) before the trainer's" in warning
    assert "max_policy_staleness" in warning and "is drifting" not in warning


def test_mismatch_watch_floor_ignores_noise_of_an_exact_sampler():
    watch = MismatchWatch(factor=5.0, floor=1e-3)
    assert watch.check(1e-9) is None
    assert watch.check(1e-6) is None  # 1000x the first value, far below the floor
    assert watch.check(2e-3) is not None


DTYPES = ["auto", "float32", "bfloat16"]


@pytest.mark.parametrize("native", [True, False])
def test_auto_resolves_trainer_and_sampler_together_and_never_to_a_silent_disagreement(native):
    """Every trainer.dtype x generator.dtype with "auto" on a side: the resolved pair agrees, or (a bf16 sampler the
    trainer cannot follow without native bf16) `known_not_to_learn` names it. The native flag is injected: this
    project's CPU has none, the issue's had it (bf16 autocast against an fp32 sampler, at lr 1e-6: did not learn)."""
    for trainer, sampler in [(t, s) for t in DTYPES for s in DTYPES if "auto" in (t, s)]:
        resolved = resolve_precision(trainer, sampler, "float32", native)
        assert "auto" not in resolved
        assert resolved[0] == resolved[1] or known_not_to_learn(*resolved, corrected=False), (trainer, sampler)
    assert resolve_precision("auto", "auto", "float32", native) == ("float32", "float32")  # the measured learning pair
    assert resolve_precision("bfloat16", "auto", "float32", native) == ("bfloat16", "bfloat16")  # sampler follows
    assert resolve_precision("auto", "bfloat16", "float32", native) == ("bfloat16" if native else "float32", "bfloat16")
    assert resolve_precision("auto", "auto", "bfloat16", native) == ("bfloat16", "bfloat16")  # pure low precision
    assert resolve_precision("float32", "bfloat16", "float32", native) == ("float32", "bfloat16")  # explicit: kept


def test_pairs_known_not_to_learn_are_named():
    [bf16_trainer] = known_not_to_learn("bfloat16", "float32", corrected=True)
    assert "did not learn" in bf16_trainer and "autocast" in bf16_trainer
    assert known_not_to_learn("bfloat16", "float32", corrected=True, copy=True) == []  # the compute copy's pair
    [bf16_sampler] = known_not_to_learn("float32", "bfloat16", corrected=False)
    assert "decoupled_token_is" in bf16_sampler
    assert known_not_to_learn("float32", "bfloat16", corrected=True) == []  # the GPU configs' pair
    assert known_not_to_learn("float32", "float32", corrected=False) == []
    assert known_not_to_learn("bfloat16", "bfloat16", corrected=False) == []


@pytest.mark.parametrize("native", [True, False])
def test_resolution_decides_auto_and_refuses_bf16_on_a_cpu_without_it(monkeypatch, native):
    monkeypatch.setattr(resolve, "native_bf16", lambda device: native)
    assert Config().trainer.dtype == "auto"  # the config alone decides nothing that needs the hardware
    resolved = resolve_config(Config())  # without a [trainer] section
    assert (resolved.trainer.dtype, resolved.generator.dtype) == ("float32", "float32")
    assert precision_warnings(resolved) == []
    if native:
        config = resolve_config(Config(trainer={"dtype": "bfloat16"}))
        assert (config.trainer.dtype, config.generator.dtype) == ("bfloat16", "bfloat16")
        on_copy = resolve_config(Config(trainer={"dtype": "bfloat16"}, generator={"dtype": "float32"}))
        assert precision_warnings(on_copy) == []
        autocast = Config(trainer={"dtype": "bfloat16", "num_procs": 2}, generator={"dtype": "float32"})
        assert precision_warnings(resolve_config(autocast))
    else:
        with pytest.raises(ConfigError, match="_is_mkldnn_bf16_supported"):
            resolve_config(Config(trainer={"dtype": "bfloat16"}))


def test_flex_attention_is_refused_on_a_cpu_trainer_and_accepted_on_cuda():
    with pytest.raises(ValueError, match="no backward on CPU"):
        Config(trainer={"attention": "flex_attention", "device": "cpu"})
    assert (
        Config(
            trainer={"attention": "flex_attention", "device": "cuda"}, generator={"device": "cuda"}
        ).trainer.attention
        == "flex_attention"
    )


def test_only_a_one_process_full_bf16_trainer_over_fp32_weights_with_an_fp32_sampler_computes_on_the_copy():
    trainer = Config(trainer={"dtype": "bfloat16"}).trainer
    assert computes_on_a_copy(trainer, 1, "float32")
    assert not computes_on_a_copy(trainer, 2, "float32")  # FSDP2 / autocast
    assert not computes_on_a_copy(trainer, 1, "bfloat16")  # bf16 everywhere: autocast, as the sampler's weights
    assert not computes_on_a_copy(
        Config(trainer={"dtype": "bfloat16", "lora": {"enabled": True}}).trainer, 1, "float32"
    )
    assert not computes_on_a_copy(Config(trainer={"dtype": "float32"}).trainer, 1, "float32")
