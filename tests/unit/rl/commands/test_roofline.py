"""The roofline arithmetic `rlmesh bench` prints, against values worked out by hand."""

import pytest

from rl.assets import resolve_model_path
from rl.commands.roofline import DecodeModel, decode_bound, decode_model, training_peak_fraction

MODEL = DecodeModel(parameters=100_000_000, weight_bytes=400_000_000, kv_bytes_per_token=1000)


def test_a_small_decode_batch_is_bound_by_reading_the_weights():
    # 2 x 1e8 x 10 = 2e9 FLOP at 100 GFLOP/s: 0.02 s; 4e8 + 1000 x 50 x 10 = 4.005e8 bytes at 10 GB/s: 0.04005 s
    bound = decode_bound(MODEL, batch=10, context=50, matmul_gflops=100, bandwidth_gbs=10)
    assert bound.flops == 2e9 and bound.bytes == 4.005e8
    assert bound.compute_s == pytest.approx(0.02) and bound.memory_s == pytest.approx(0.04005)
    assert bound.bound_by == "bandwidth" and bound.seconds == pytest.approx(0.04005)
    assert 10 / bound.seconds == pytest.approx(249.69, abs=0.01)  # tokens/s


def test_a_large_decode_batch_is_bound_by_the_matmul_peak():
    # 2e10 FLOP: 0.2 s against 4.05e8 bytes: 0.0405 s, so 100 tokens in 0.2 s = 500 tokens/s
    bound = decode_bound(MODEL, batch=100, context=50, matmul_gflops=100, bandwidth_gbs=10)
    assert bound.bound_by == "compute" and 100 / bound.seconds == pytest.approx(500)


def test_training_share_of_peak_counts_six_flops_per_parameter_per_forwarded_token():
    # 6 x 1e8 x 200 = 1.2e11 FLOP/s of a 240 GFLOP/s peak
    assert training_peak_fraction(100_000_000, 200, 240) == pytest.approx(0.5)


def test_smollm2_decode_model_counts_its_tied_embedding_once_and_its_three_kv_heads():
    # embedding 49152 x 576 = 28,311,552; a layer: q, o 576 x 576, k, v 576 x 192, gate, up, down 576 x 1536, two
    # norms 576 = 3,540,096; 30 layers + the final norm 576 = 134,515,008. KV: 2 x 30 layers x 3 heads x 64 x 4 bytes
    model = decode_model(resolve_model_path("smollm2-135m-instruct"), dtype_bytes=4)
    assert model.parameters == 134_515_008
    assert model.weight_bytes == 4 * 134_515_008
    assert model.kv_bytes_per_token == 46_080


def test_bench_holds_the_main_jobs_generation_against_a_decode_step_of_all_its_samples():
    # 4 groups x 8 = batch 32 at context 48 + 20 / 2 = 58, fp32: 2 x 134,515,008 x 32 = 8.609e9 FLOP at 200 GFLOP/s is
    # 0.0430 s; 538,060,032 + 46,080 x 58 x 32 = 623,584,512 bytes at 10 GB/s is 0.0624 s: 32 / 0.0624 = 513.2 tokens/s
    from rl.commands.bench import generation_roofline
    from rl.config import load_config
    from rl.loop.resolve import resolve_config
    from tests.support.paths import CONFIGS

    config = resolve_config(load_config(CONFIGS / "sum_digits_smollm2_cpu.toml"))  # the sampler's dtype: float32
    sync = {"prompt_tokens_mean": 48.0, "completion_tokens_mean": 20.0}
    roofline = generation_roofline(config, sync, {"generator_peak_gflops": 200.0, "bandwidth_gbs": 10.0})
    assert (roofline["batch"], roofline["context"], roofline["bound_by"]) == (32, 58.0, "bandwidth")
    assert roofline["tokens_per_s"] == pytest.approx(513.16, abs=0.01)
    assert roofline["flops_tokens_per_s"] == pytest.approx(32 / 0.04304480256)
