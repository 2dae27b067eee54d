"""vLLM's CPU linear layers compute a one-row input as two copies of the row, so a row gets the bits it gets in a batch.

oneDNN's fp32 matmul takes another kernel for one row than for several, with other bits (SmolLM2's down projection,
1536 inputs: `tests/unit/actors/test_tenant_batch_invariance.py`), so a request decoding alone got other logprobs than
beside other requests: its numbers depended on what else the engine ran (a LoRA tenant's on the other tenants', a run's
on its requests' timing). Two rows take the batch kernel, whose rows do not depend on each other. Each vLLM worker
process applies it (`rl.weights.vllm_worker`), before it serves a request.
"""

from __future__ import annotations

from typing import Any

import torch


def single_rows_as_in_a_batch() -> None:
    """Replace vLLM's `onednn_mm` (every CPU linear layer calls it by name, `dispatch_cpu_unquantized_gemm`) in this
    process with one that computes a single row as two; idempotent."""
    from vllm import _custom_ops as ops

    onednn_mm = ops.onednn_mm
    if getattr(onednn_mm, "single_rows_as_in_a_batch", False):
        return

    def matmul(handler: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        rows = x.reshape(-1, handler.k)  # [tokens, in]
        if rows.shape[0] != 1:
            return onednn_mm(handler, x, bias)
        return onednn_mm(handler, rows.expand(2, -1).contiguous(), bias)[:1].reshape(*x.shape[:-1], handler.n)

    matmul.single_rows_as_in_a_batch = True
    ops.onednn_mm = matmul
