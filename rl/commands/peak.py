"""What this machine's devices can do, measured: the matmul peak and memory bandwidth `rlmesh bench` holds the loop
against (`rl.commands.roofline`), and a timer
that counts a GPU's asynchronous work. Imports only torch, so the GPU suite runs it on a machine without the loop's
dependencies (tests/gpu/test_bench.py)."""

from __future__ import annotations

import os
import time
from typing import Any

import torch


def matmul_peak_gflops(
    dtype: torch.dtype, cpus: list[int] | None, size: int = 2048, repeats: int = 5, device: str = "cpu"
) -> float:
    """Best GFLOP/s of a square matmul on the trainer's device: its cores (all when unpinned), or its GPU."""
    saved_affinity, saved_threads = os.sched_getaffinity(0), torch.get_num_threads()
    if cpus and device == "cpu":
        os.sched_setaffinity(0, cpus)
        torch.set_num_threads(len(cpus))
    try:
        a, b = (torch.randn(size, size, dtype=dtype, device=device) for _ in range(2))
        a @ b
        best = min(timed(lambda: a @ b, device) for _ in range(repeats))
    finally:
        os.sched_setaffinity(0, saved_affinity)
        torch.set_num_threads(saved_threads)
    return 2 * size**3 / best / 1e9


def memory_bandwidth_gbs(cpus: list[int] | None, megabytes: int = 512, repeats: int = 5, device: str = "cpu") -> float:
    """Best GB/s of reading a buffer far larger than the caches (a sum over it: one read of every byte, as a decode
    step reads every weight) on the given cores (all when unpinned), or on the GPU."""
    saved_affinity, saved_threads = os.sched_getaffinity(0), torch.get_num_threads()
    if cpus and device == "cpu":
        os.sched_setaffinity(0, cpus)
        torch.set_num_threads(len(cpus))
    try:
        buffer = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32, device=device)
        buffer.sum()
        best = min(timed(buffer.sum, device) for _ in range(repeats))
    finally:
        os.sched_setaffinity(0, saved_affinity)
        torch.set_num_threads(saved_threads)
    return buffer.numel() * 4 / best / 1e9


def timed(fn: Any, device: str = "cpu") -> float:
    """Seconds `fn` takes, its GPU work included (CUDA runs asynchronously: synchronized before and after)."""
    synchronize = torch.cuda.synchronize if device == "cuda" else lambda: None
    synchronize()
    start = time.perf_counter()
    fn()
    synchronize()
    return time.perf_counter() - start
