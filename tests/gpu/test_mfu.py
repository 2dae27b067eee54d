"""The trainer's MFU on a GPU: one FSDP2 rank (bf16 gathers, fp32 master weights and reductions) of a Qwen3-1.7B-shaped
model (random weights) training GRPO-like packed prefix-tree rows, counting useful tokens (`tests/support/mfu.py`).

torchtitan reports 33-39% for Llama-3.1-8B FSDP on H100s; the bound here only catches a pathological step (a host
sync per micro-batch, fp32 matmuls), the number is what the suite records."""

import os

import pytest
import torch
import torch.distributed as dist

from rl.commands.peak import matmul_peak_gflops
from rl.training import distributed
from tests.support.gpu_models import free_port, random_qwen3
from tests.support.mfu import grpo_samples, measure

SHAPE = {  # Qwen3-1.7B's shape: 28 layers, hidden 2048, 16 query and 8 KV heads of 128, FFN 6144, tied
    "vocab_size": 151936,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 8192,
}


@pytest.fixture(scope="module")
def group():
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    ranks = distributed.init_process_group("cuda")
    yield ranks
    dist.destroy_process_group()


def test_the_trainer_s_mfu_on_packed_prefix_tree_rows(group, record):
    lm = random_qwen3(**SHAPE).cuda()
    trained = distributed.shard(lm, device="cuda", param_dtype=torch.bfloat16)
    samples = grpo_samples(groups=4, size=8, prompt=512, completion=512, vocab=SHAPE["vocab_size"], seed=0)
    peak = matmul_peak_gflops(torch.bfloat16, None, size=8192, device="cuda")
    found = measure(
        lm, trained, samples, seq_len=4096, rows_per_micro_batch=1, device="cuda",
        compute=lambda: torch.autocast("cuda", enabled=False), ranks=group, peak_gflops=peak,
    )  # fmt: skip
    record(
        step_s=found.seconds,
        useful_tflops=found.useful_tflops,
        mfu=found.mfu,
        useful_tokens=found.useful_tokens,
        forward_tokens=found.forward_tokens,
        matmul_peak_bf16_gflops=peak,
    )
    assert found.mfu > 0.05, found
