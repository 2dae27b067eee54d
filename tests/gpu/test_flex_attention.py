"""FlexAttention over prefix trees on CUDA, forward AND backward, against independent sequences (SDPA, same weights).

`trainer.attention = "flex_attention"` is the GPU path for long rows: a block-sparse BlockMask instead of a dense
[L, L] mask per row. On CPU FlexAttention has no backward (torch 2.13), so only this suite runs its gradient.
"""

import time

import pytest
import torch

from rl.packing.prefix_tree import pack_trees, packing_metrics
from rl.packing.rows import pack_samples
from rl.training.logprobs import packed_logprobs
from tests.support.gpu_models import random_qwen3
from tests.support.tree_samples import grouped_samples


def _logprobs_and_grads(model, batch, n, compute):
    model.zero_grad()
    with compute():
        logprobs = packed_logprobs(model, batch, mask=batch["loss_mask"])  # [R,L]
    (logprobs.float() * batch["advantages"]).sum().backward()
    per_sample = [logprobs.detach().float()[batch["sequence_ids"] == i] for i in range(n)]
    return per_sample, {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16_autocast"])
@pytest.mark.parametrize("seq_len", [24, 256], ids=["cut_across_rows", "one_row_per_tree"])
def test_flex_tree_rows_give_the_logprobs_and_gradients_of_independent_sequences(dtype, seq_len, record):
    sdpa = random_qwen3("sdpa").cuda()
    flex = random_qwen3("flex_attention").cuda()
    flex.load_state_dict(sdpa.state_dict())
    samples = grouped_samples(2, seed=1, vocab=1024)
    flat = pack_samples(samples, seq_len=seq_len, pad_token_id=0).to("cuda")
    tree = pack_trees(samples, seq_len=seq_len, pad_token_id=0).to("cuda")
    assert packing_metrics(tree)["train/forward_tokens"] < packing_metrics(tree)["train/logical_tokens"]

    def compute():
        return torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32)

    expected, expected_grads = _logprobs_and_grads(sdpa, flat, len(samples), compute)
    start = time.perf_counter()
    got, grads = _logprobs_and_grads(flex, tree, len(samples), compute)  # the first call compiles
    torch.cuda.synchronize()
    first_s = time.perf_counter() - start
    start = time.perf_counter()
    got, grads = _logprobs_and_grads(flex, tree, len(samples), compute)
    torch.cuda.synchronize()
    logprob_gap = max(float((have - want).abs().max()) for have, want in zip(got, expected))
    grad_gap = max(
        float((grads[name] - expected_grads[name]).norm() / expected_grads[name].norm().clamp_min(1e-30))
        for name in expected_grads
    )
    record(
        max_logprob_gap=logprob_gap,
        worst_grad_relative_gap=grad_gap,
        first_call_s=first_s,
        warm_call_s=time.perf_counter() - start,
    )
    fp32 = dtype == torch.float32
    assert logprob_gap < (1e-4 if fp32 else 5e-2), logprob_gap
    assert max(float(g.abs().max()) for g in expected_grads.values()) > 1e-3
    assert grad_gap < (1e-3 if fp32 else 5e-2), grad_gap


def test_a_trainer_meets_many_widths_and_compiles_each_width_multiple_once(record):
    """A run's micro-batches differ in rows and width at almost every step. Transformers compiles FlexAttention with
    automatic dynamic shapes, and from the second width on torch 2.11's inductor found no kernel for its backward
    (NoValidChoicesError on an H200); rows are padded to a multiple of 128 and compiled static instead."""
    model = random_qwen3("flex_attention", seed=3).cuda()
    seconds = []
    for seq_len, groups in [(40, 2), (200, 5), (300, 8), (500, 12), (130, 4), (200, 5)]:  # widths 31..426
        tree = pack_trees(grouped_samples(2, seed=seq_len, groups=groups, vocab=1024), seq_len=seq_len, pad_token_id=0)
        start = time.perf_counter()
        logprobs = packed_logprobs(model, tree.to("cuda"), mask=tree["loss_mask"].to("cuda"))  # [R,L]
        logprobs.sum().backward()
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
        assert torch.isfinite(logprobs).all()
    record(step_s=seconds)
    assert seconds[-1] < seconds[0], seconds  # the last width (padded to 128) was compiled before
