"""What lets LoRA tenants share a vLLM batch and still sample their solo runs' tokens on a CPU: vLLM's CPU kernels for
a linear layer (oneDNN, fp32) and for the LoRA adapters (`bgmv`: one einsum over the batch) give each row the same bits
whatever other rows share its batch, once a single row is computed as in a batch (oneDNN gives one row other bits:
`rl.processes.single_rows`). Were a kernel's reduction order to depend on the batch size, a tenant's
logprobs would depend on the other tenants' requests (`tests/e2e/test_tenants.py` would fail), and this test names
which."""

import pytest
import torch

ops = pytest.importorskip("vllm._custom_ops")

TINY_QWEN3 = [(64, 64), (128, 64), (64, 128), (151669, 64)]
"""(out, in) of the tiny Qwen3's projections and its LM head."""

SMOLLM2 = [(576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576)]
"""(out, in) of SmolLM2-135M's projections (query/output, key/value, gate/up, down) and its LM head."""


@pytest.fixture
def single_rows_as_in_a_batch():
    """vLLM's oneDNN matmul as the generators run it (`rl.processes.single_rows`), for one test."""
    from rl.processes.single_rows import single_rows_as_in_a_batch

    onednn_mm = ops.onednn_mm
    single_rows_as_in_a_batch()
    yield
    ops.onednn_mm = onednn_mm


@pytest.mark.parametrize(("out_features", "in_features"), TINY_QWEN3 + SMOLLM2)
def test_vllms_cpu_linear_gives_each_row_the_same_bits_in_any_batch(
    single_rows_as_in_a_batch, out_features, in_features
):
    torch.manual_seed(0)
    handler = ops.create_onednn_mm(torch.randn(out_features, in_features).t(), 32)
    rows = torch.randn(67, in_features)
    whole = ops.onednn_mm(handler, rows, None)
    for start, stop in [(0, 1), (3, 4), (66, 67), (0, 2), (0, 8), (5, 22), (40, 67)]:
        assert torch.equal(ops.onednn_mm(handler, rows[start:stop].contiguous(), None), whole[start:stop])


def test_onednn_gives_a_single_row_other_bits_than_the_same_row_in_a_batch():
    """The defect the generators' single-row matmul avoids, on SmolLM2's down projection (should oneDNN compute one row
    as it does in a batch, `single_rows_as_in_a_batch` can go)."""
    torch.manual_seed(0)
    handler = ops.create_onednn_mm(torch.randn(576, 1536).t(), 32)
    rows = torch.randn(8, 1536)
    whole = ops.onednn_mm(handler, rows, None)
    assert not torch.equal(ops.onednn_mm(handler, rows[:1].contiguous(), None), whole[:1])
    assert torch.equal(ops.onednn_mm(handler, rows[:2].contiguous(), None), whole[:2])


def test_the_lora_kernel_gives_each_row_the_same_bits_in_any_batch_of_mixed_adapters():
    from vllm.lora.ops.torch_ops.lora_ops import bgmv_shrink

    torch.manual_seed(0)
    adapters = torch.randn(3, 8, 64)  # [slots, rank, in]: three tenants' A
    rows, slots = torch.randn(67, 64), torch.randint(0, 3, (67,))
    whole = torch.zeros(67, 8)
    bgmv_shrink(rows, adapters, whole, slots)
    for start, stop in [(0, 1), (3, 4), (5, 22), (40, 67)]:
        part = torch.zeros(stop - start, 8)
        bgmv_shrink(rows[start:stop], adapters, part, slots[start:stop])
        assert torch.equal(part, whole[start:stop])
