"""What lets LoRA tenants share a vLLM batch and still sample their solo runs' tokens on a CPU: vLLM's CPU kernels for
a linear layer (oneDNN, fp32), for the LoRA adapters (`bgmv`: one einsum over the batch) and for attention give each
row the same bits whatever other rows share its batch, once a single row is computed as in a batch (oneDNN gives one
row other bits: `rl.processes.single_rows`) and each request's attention whole on one thread (split across threads, a
long context gets other bits beside other requests: `actors.generator.engine_environment`). Were a kernel's reduction
order to depend on the batch, a tenant's logprobs would depend on the other tenants' requests
(`tests/e2e/test_tenants.py` would fail), and this test names which."""

import random

import pytest
import torch

from actors.generator import engine_environment
from rl.config import load_config
from tests.support.paths import CONFIGS

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


SMOLLM2_HEADS = (9, 3, 64)
"""SmolLM2-135M's query heads, key/value heads and head size."""
BLOCK = 32
"""Tokens per KV-cache block (the generators' default on CPU)."""


@pytest.fixture
def two_threads():
    """Two OpenMP threads, as a generator's engine has on this project's 2-core machines (one thread never splits)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


def decode_attention(context_lens: list[int], target: int, split: bool) -> torch.Tensor:
    """vLLM's CPU attention (fp32, SmolLM2's heads) for one decoding token of each request with `context_lens` tokens of
    context, computed in one call as a step computes it; request `target`'s output [heads, head size]. The target's query
    and context are the same in every call, the others' are random; `split`: vLLM's `VLLM_CPU_ATTN_SPLIT_KV`."""
    heads, kv_heads, head_size = SMOLLM2_HEADS
    cache = torch.randn(64, kv_heads, 2 * BLOCK, head_size, generator=torch.Generator().manual_seed(0))
    key_cache, value_cache = cache.chunk(2, dim=2)  # as vLLM's CPU backend views its cache
    query = torch.randn(len(context_lens), heads, head_size)
    query[target] = torch.randn(heads, head_size, generator=torch.Generator().manual_seed(1))
    blocks = torch.zeros(len(context_lens), 8, dtype=torch.int32)  # [requests, blocks]: its blocks 40.. for the target
    for request, length in enumerate(context_lens):
        count = -(-length // BLOCK)
        blocks[request, :count] = torch.arange(count) + (40 if request == target else 7 * request % 33)
    starts = torch.arange(len(context_lens) + 1, dtype=torch.int32)
    lens = torch.tensor(context_lens, dtype=torch.int32)
    metadata = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=len(context_lens), num_heads=heads, num_kv_heads=kv_heads, head_dim=head_size, seq_lens=lens,
        dtype=torch.float32, query_start_loc=starts, causal=True, sliding_window_size=-1, isa="vec",
        enable_kv_split=split,
    )  # fmt: skip
    output = torch.empty_like(query)
    ops.cpu_attention_with_kv_cache(
        query=query, key_cache=key_cache, value_cache=value_cache, output=output, query_start_loc=starts,
        seq_lens=lens, scale=head_size**-0.5, causal=True, alibi_slopes=None, sliding_window=-1, block_table=blocks,
        softcap=0.0, scheduler_metadata=metadata, s_aux=None,
    )  # fmt: skip
    return output[target]


def test_vllms_cpu_attention_gives_each_decoding_request_the_same_bits_in_any_batch(two_threads):
    generator = load_config(CONFIGS / "sum_digits_smollm2_cpu.toml").generator
    split = engine_environment(generator, cpus=[]).get("VLLM_CPU_ATTN_SPLIT_KV", "1") != "0"  # as the generators run
    rng = random.Random(0)
    for context in (33, 64, 65, 80, 96, 97, 200):
        alone = decode_attention([context], 0, split)
        for _ in range(60):
            others = [rng.randint(1, 200) for _ in range(rng.randint(1, 6))]
            at = rng.randint(0, len(others))
            beside = decode_attention([*others[:at], context, *others[at:]], at, split)
            assert torch.equal(beside, alone), (context, others, at)


def test_vllms_cpu_attention_split_across_threads_gives_a_long_context_other_bits_beside_another_request(two_threads):
    """The defect the generators' unsplit attention avoids (should vLLM split a request's context at points of its own,
    `VLLM_CPU_ATTN_SPLIT_KV=0` can go): a context that takes a third 32-token block, after a request of 13 tokens."""
    assert torch.equal(decode_attention([13, 64], 1, split=True), decode_attention([64], 0, split=True))
    assert not torch.equal(decode_attention([13, 65], 1, split=True), decode_attention([65], 0, split=True))
