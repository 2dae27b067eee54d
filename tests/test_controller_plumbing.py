import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from rl.config import load_config
from rl.controller import Controller, gpu_placement

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def test_cpu_processes_get_no_placement():
    assert gpu_placement("cpu", first_gpu=0, gpus_per_proc=1) is None


def test_each_generator_replica_owns_its_tensor_parallel_gpus():
    command = gpu_placement("cuda", first_gpu=1, gpus_per_proc=2)
    assert [command(SimpleNamespace(rank=rank)).env["CUDA_VISIBLE_DEVICES"] for rank in range(3)] == ["1,2", "3,4", "5,6"]


async def test_weight_sync_that_hangs_fails_loudly():
    controller = Controller(load_config(CONFIGS / "tiny_qwen3_e2e.toml", {"run.weight_sync_timeout_s": "0.05"}))
    with pytest.raises(RuntimeError, match="generator weight reload took longer than run.weight_sync_timeout_s=0.05 s"):
        await controller._within(asyncio.sleep(10), "generator weight reload")
