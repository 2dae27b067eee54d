"""`rlmesh bench` measures the device the trainer runs on: on a GPU its matmul peak is the GPU's, not the CPU's."""

import torch

from rl.commands.peak import matmul_peak_gflops


def test_the_matmul_peak_is_the_gpus(record):
    gpu = matmul_peak_gflops(torch.bfloat16, None, size=8192, device="cuda")
    cpu = matmul_peak_gflops(torch.float32, None, size=1024, device="cpu")
    record(gpu_bf16_gflops=gpu, cpu_fp32_gflops=cpu)
    assert gpu > 10 * cpu and gpu > 50_000, (gpu, cpu)  # any bf16 GPU (Ampere on) does >50 TFLOP/s; a CPU, ~1
