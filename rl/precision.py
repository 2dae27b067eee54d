"""Numeric precision of the trainer and the sampler, and a watch on how far they drift apart.

The trainer keeps fp32 master weights and optimizer state; `trainer.dtype` below fp32 only
changes the compute (autocast). Pure low-precision parameters stop learning quietly: AdamW's
updates at RL learning rates fall below bf16's rounding step. A sampler in lower precision than
the trainer's weights samples from a slightly different policy; `MismatchWatch` warns when
that gap grows during a run.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def native_bf16(device: str) -> bool:
    """Whether `device` runs bf16 matmuls natively: a CUDA GPU with bf16 support, or a CPU where oneDNN has bf16
    kernels (AVX512-BF16 or AMX: `torch.ops.mkldnn._is_mkldnn_bf16_supported()`). Elsewhere bf16 falls back to
    PyTorch's reference GEMM, measured >20x slower than fp32 on an AVX2-only CPU."""
    if device == "cuda":  # a launcher without a GPU cannot ask: the trainer's GPUs are taken to be bf16-capable
        return not torch.cuda.is_available() or torch.cuda.is_bf16_supported()
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def resolve_compute_dtype(dtype: str, param_dtype: str, native: bool) -> str:
    """`trainer.dtype`, with "auto" resolved: bf16 autocast over fp32 parameters where bf16 is `native`, else the parameters' dtype."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if native and param_dtype == "float32" else param_dtype


def compute_context(device: str, param_dtype: str, compute_dtype: str) -> contextlib.AbstractContextManager:
    """Autocast to `compute_dtype` when it is below the parameters' dtype, else a no-op."""
    if compute_dtype == param_dtype:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device, dtype=TORCH_DTYPES[compute_dtype])


@dataclass
class MismatchWatch:
    """Warns when `train/mismatch_k3` (KL between sampler and trainer) grows past `factor` x its first value.

    `floor` keeps an exactly on-policy run (mismatch ~1e-9) from warning on noise.
    """

    factor: float
    floor: float
    first: float | None = None
    warned: bool = False

    def check(self, mismatch_k3: float) -> str | None:
        """A warning the first time the mismatch exceeds max(factor x first value, floor); else None."""
        if self.first is None:
            self.first = mismatch_k3
            return None
        limit = max(self.factor * self.first, self.floor)
        if self.warned or mismatch_k3 <= limit:
            return None
        self.warned = True
        return (
            f"train/mismatch_k3 = {mismatch_k3:.3g} is above {limit:.3g} ({self.factor:g} x its first value "
            f"{self.first:.3g}): the sampler's policy is drifting from the trainer's. A lower-precision sampler "
            "than the trainer's weights (generator.dtype) is the usual cause; see docs/precision.md."
        )


@dataclass
class NonfiniteSteps:
    """Counts steps in a row whose every update was skipped for a non-finite gradient norm (the weights, optimizer
    state and policy version stay as they were); `limit` such steps in a row stop the run (`trainer.max_nonfinite_steps`)."""

    limit: int
    in_row: int = 0

    def check(self, step: int, metrics: dict[str, float], minibatches: int) -> tuple[str, bool] | None:
        """None when step `step` updated the weights; else its warning and whether the run must stop."""
        if metrics.get("train/skipped_nonfinite_steps", 0) < minibatches:
            self.in_row = 0
            return None
        self.in_row += 1
        warning = (
            f"step {step}: gradient norm {metrics.get('train/grad_norm')} is not finite; the update was skipped "
            f"({self.in_row} in a row, trainer.max_nonfinite_steps = {self.limit})"
        )
        return warning, self.in_row >= self.limit
