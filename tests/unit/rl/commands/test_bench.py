"""`rlmesh bench`'s table: both token counts, their ratio, the matmul peak of each dtype and each phase's roofline
fraction are shown."""

from rl.commands.bench import table


def test_bench_table_shows_both_token_counts_the_gain_and_each_dtype_peak():
    loop = {
        "s_per_step": 8.0,
        "trained_tokens_per_s": 40.0,
        "generation_tokens_per_s": 150.0,
        "train_tokens_per_s": 300.0,
        "train_forward_tokens_per_s": 120.0,
        "train_logical_tokens_per_s": 324.0,
        "prefix_sharing_gain": 2.7,
        "overlap_ratio": 0.5,
        "version_offset_mean": 1.0,
        "weight_sync_s": 0.5,
        "packing_efficiency": 0.97,
    }
    results = {
        "model": "m",
        "machine": "2 CPUs",
        "trainer_dtype": "float32",
        "generator_dtype": "float32",
        "generator_peak_gflops": 32.0,
        "bandwidth_gbs": 8.04,
        "generation_roofline": {
            "batch": 32,
            "context": 60.0,
            "tokens_per_s": 400.0,
            "flops_tokens_per_s": 750.0,
            "bandwidth_tokens_per_s": 400.0,
            "bound_by": "bandwidth",
        },
        "generation_roofline_fraction": 0.375,
        "generation_work_fraction": 0.5,
        "native_bf16": "native bf16: no",
        "matmul_peak_gflops": {"float32": 32.0, "bfloat16": 1.5},
        "trainer_peak_fraction": 0.4,
        "loops": {"sync": loop, "async_1": loop, "async_2": loop},
        "weight_sync_floor": {"total_s": 0.3},
        "ratios": {"async_1_vs_sync": 1.0, "async_2_vs_sync": 1.0, "sync_vs_phases": 1.05},
    }
    text = table(results)
    assert "| training alone: forwarded, logical tokens/s | 120, 324 |" in text
    assert "| prefix-sharing gain (logical / forwarded tokens) | 2.70 |" in text
    assert "| matmul peak, GFLOP/s (native bf16: no) | float32 32, bfloat16 2 |" in text
    assert "| memory bandwidth, GB/s (generator's cores); generator's float32 matmul peak, GFLOP/s | 8.0; 32 |" in text
    assert "| generation roofline at batch 32: tokens/s (bound by) | 400 (bandwidth) |" in text
    # generation at 150 tokens/s: 150 / 400 and 150 / 750
    assert (
        "| generation, share of its roofline (of the FLOP bound, of the bandwidth bound) | 0.38 (0.20, 0.38) |" in text
    )
    assert "| training, share of the float32 matmul peak (forwarded tokens) | 0.40 |" in text
    assert "| packing efficiency (real / all forwarded positions) | 0.97 |" in text
    assert "each decode step at the batch still running) | 0.50 |" in text
