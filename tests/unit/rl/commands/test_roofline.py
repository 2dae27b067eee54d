"""The roofline arithmetic `rlmesh bench` prints, against values worked out by hand."""

import pytest

from rl.assets import resolve_model_path
from rl.commands.roofline import (
    Completion,
    DecodeModel,
    decode_bound,
    decode_model,
    phase_bound,
    training_peak_fraction,
)

MODEL = DecodeModel(
    parameters=100_000_000, head_parameters=20_000_000, weight_bytes=400_000_000, kv_bytes_per_token=1000
)


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
    assert model.head_parameters == 28_311_552


def test_a_phase_prefills_each_prompt_once_then_decodes_at_the_batch_still_running():
    # two samples of prompt g (10 tokens; completions of 3 and 1) and one of prompt h (20 tokens; completion of 2).
    # prefill: 2 x (8e7 x 30 distinct prompt tokens + 2e7 x 3 first tokens) = 4.92e9 FLOP: 0.0492 s (> 0.04 s to read
    # the weights); step 1: the 3- and 2-token completions, contexts 11 and 21: 4e8 + 1000 x 32 bytes = 0.0400032 s;
    # step 2: the 3-token one at context 12: 0.0400012 s; no step 3
    completions = [Completion("g", 10, 3), Completion("g", 10, 1), Completion("h", 20, 2)]
    assert phase_bound(MODEL, completions, matmul_gflops=100, bandwidth_gbs=10) == pytest.approx(0.1292044)


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


def test_bench_holds_each_phase_against_its_slowest_replicas_share_of_groups():
    from rl.commands.bench import phases_fraction
    from rl.config import load_config
    from rl.loop.resolve import resolve_config
    from tests.support.paths import CONFIGS

    config = resolve_config(load_config(CONFIGS / "sum_digits_smollm2_cpu.toml"))
    smollm2 = decode_model(resolve_model_path(config.model.path), dtype_bytes=4)
    long, short = [Completion("a", 48, 24)] * 8, [Completion("b", 48, 2)] * 8
    phases = [{"a": long, "b": short}, {"c": short}]
    sync = {"generation_phases": phases, "generation_phase_s": [3.0, 1.0]}
    peaks = {"generator_peak_gflops": 200.0, "bandwidth_gbs": 10.0}
    one = phase_bound(smollm2, long + short, 200, 10) + phase_bound(smollm2, short, 200, 10)
    assert phases_fraction(config, sync, peaks) == pytest.approx(one / 4.0)
    two = config.model_copy(update={"generator": config.generator.model_copy(update={"num_replicas": 2})})
    slowest = phase_bound(smollm2, long, 200, 10) + phase_bound(smollm2, short, 200, 10)
    assert phases_fraction(two, sync, peaks) == pytest.approx(slowest / 4.0)
