"""The launcher asks about GPUs in a child process: validating a GPU config creates no CUDA context in it."""

import pytest
import torch

from rl import gpus
from rl.config import load_config
from rl.loop.resolve import resolve_config
from tests.support.paths import CONFIGS

pytestmark = pytest.mark.processes  # the GPU probe is a child process


def test_the_probe_counts_this_hosts_devices_in_a_child_process():
    gpus.local_gpus.cache_clear()
    found = gpus.local_gpus()
    assert found.count == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    assert found.bf16 is (found.count > 0 and torch.cuda.is_bf16_supported())


def test_validating_a_gpu_config_on_a_gpu_host_creates_no_cuda_context(monkeypatch):
    """A host whose CUDA reports available: every torch entry point that creates a context fails the test."""

    def creates_a_context(*args, **kwargs):
        raise AssertionError("the launcher created a CUDA context while validating")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for name in ("_lazy_init", "current_device", "is_bf16_supported", "get_device_capability", "init"):
        monkeypatch.setattr(torch.cuda, name, creates_a_context)
    gpus.local_gpus.cache_clear()
    try:
        config = resolve_config(load_config(CONFIGS / "sum_digits_smollm2_gpu.toml", {"trainer.dtype": "auto"}))
    finally:
        gpus.local_gpus.cache_clear()
    assert config.trainer.dtype == "bfloat16"


@pytest.mark.parametrize("count, bf16, expected", [(0, False, True), (1, True, True), (1, False, False)])
def test_auto_resolves_from_what_the_probe_found(monkeypatch, count, bf16, expected):
    from rl.precision import native_bf16

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpus, "local_gpus", lambda: gpus.Gpus(count=count, bf16=bf16))
    assert native_bf16("cuda") is expected  # no device here (a login node): the trainer's GPUs are taken as bf16
