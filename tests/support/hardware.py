"""What this machine's CPU can do, for tests whose expected outcome depends on it."""

import tomllib
from pathlib import Path

import torch

NATIVE_BF16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()  # AVX512-BF16 or AMX: bf16 matmuls at native speed
NO_NATIVE_BF16 = "this CPU has no native bf16 matmuls (no AVX512-BF16/AMX): bf16 compute on CPU is refused here"


def refuses_bf16_compute(config_file: Path) -> bool:
    """Whether validating `config_file` here must fail with the no-native-bf16 refusal (bf16 autocast on this CPU)."""
    trainer = tomllib.loads(config_file.read_text()).get("trainer", {})
    return trainer.get("dtype") == "bfloat16" and trainer.get("device", "cpu") == "cpu" and not NATIVE_BF16


def refuses_cuda(config_file: Path) -> bool:
    """Whether validating `config_file` here must fail for want of a CUDA device (a role on this host asks for one)."""
    data = tomllib.loads(config_file.read_text())
    hosts = data.get("cluster", {}).get("hosts", {})
    local_cuda = any(
        data.get(role, {}).get("device", "cpu") == "cuda" and not hosts.get(role, 0)
        for role in ("trainer", "generator")
    )
    return local_cuda and not torch.cuda.is_available()
