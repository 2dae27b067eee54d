"""The GPU suite's MFU measurement (`tests/gpu/test_mfu.py`) on the CPU at a tiny shape: the same code path (one-rank
gloo group, FSDP2, packed prefix-tree rows, AdamW), so it is known to run before a GPU is lent; and its useful FLOPs
against a count by hand."""

import os

import torch
import torch.distributed as dist

from rl.commands.peak import matmul_peak_gflops
from rl.precision import compute_context
from rl.training import distributed
from tests.support.gpu_models import free_port, random_qwen3
from tests.support.mfu import grpo_samples, measure, useful_flops


def test_useful_flops_count_every_sample_as_its_own_sequence():
    lm = random_qwen3(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, head_dim=8)
    samples = grpo_samples(groups=1, size=2, prompt=3, completion=2, vocab=100, seed=0)  # 2 samples of 5 tokens
    # linear weights per layer: q 32x64, k 32x32, v 32x32, o 64x32, MLP 3 x 32x64 = 12288; 2 layers + lm_head 100x32
    matmul = 2 * 12288 + 3200
    attention = 6 * 2 * 2 * 64 * 25 / 2  # 6 x 2 x layers x (8 heads x 8) x n^2 / 2
    assert useful_flops(lm, samples) == 2 * (6 * matmul * 5 + attention)


def test_the_mfu_measurement_runs_on_the_cpu():
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    ranks = distributed.init_process_group("cpu")
    try:
        lm = random_qwen3()
        trained = distributed.shard(lm, device="cpu", param_dtype=None)
        samples = grpo_samples(groups=2, size=4, prompt=24, completion=16, vocab=1024, seed=0)
        peak = matmul_peak_gflops(torch.float32, None, size=512, device="cpu")
        found = measure(
            lm, trained, samples, seq_len=256, rows_per_micro_batch=1, device="cpu",
            compute=lambda: compute_context("cpu", "float32", "float32"), ranks=ranks, peak_gflops=peak, steps=1,
        )  # fmt: skip
    finally:
        dist.destroy_process_group()
    assert found.useful_tokens == 8 * 40 and found.forward_tokens == 2 * 24 + 8 * 16  # each prompt forwarded once
    assert 0 < found.mfu < 1 and found.seconds > 0
