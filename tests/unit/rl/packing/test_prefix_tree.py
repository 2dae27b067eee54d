"""Prefix-shared packing: the trie layout by hand, and every trainer forward through it against independent sequences.

Reference values are the independent forwards of `pack_samples` (each sample whole, its own block of a
block-diagonal causal mask), which this project's tests already check against single-sequence forwards.
Tolerances are fp32 rounding: attention sums over differently laid-out rows (measured on the tiny Qwen3 and
a random Llama: logprobs within 1e-6, gradients within 1e-5 of values up to ~10, so rtol 1e-4 / atol 1e-5).
"""

import os
import tempfile

import pytest
import torch
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM, LlamaConfig

from rl.assets import resolve_model_path
from rl.config.loss import LossConfig
from rl.packing.prefix_tree import check_trees, pack_batch, pack_trees, packing_metrics
from rl.packing.rows import TrainSample, pack_samples, split_micro_batches
from rl.training.distributed import pad_row
from rl.training.logprobs import packed_logprobs
from rl.training.train_step import train_step
from tests.support.hardware import NATIVE_BF16
from tests.support.tree_samples import grouped_samples

pytestmark = pytest.mark.processes  # compiled FlexAttention (inductor's workers) and two gloo ranks


def _sample(ids: list[int], prompt: int, advantage: float = 1.0) -> TrainSample:
    mask = [False] * prompt + [True] * (len(ids) - prompt)
    return TrainSample(ids, mask, [-1.0 if m else 0.0 for m in mask], advantage, 0)


def _hand() -> list[TrainSample]:
    # input order D, C, A, B; trie order A, B, C, D
    return [_sample([9, 9], 1), _sample([1, 2, 7, 8], 2), _sample([1, 2, 3, 4, 5], 3), _sample([1, 2, 3, 6], 3)]


def test_pack_trees_lays_out_the_trie_depth_first() -> None:
    # A = 1 2 3 4 5, B = 1 2 3 | 6, C = 1 2 | 7 8, D = 9 9: nodes 0-4 are A, 5 is B's 6 (parent 2), 6-7 are C's 7 8
    # (parent 1), 8-9 are D. Subtrees: node 0 and 1 span [0, 8) (A, B, C), node 2 spans [2, 6), A's 4 5 end at 5.
    batch = pack_trees(_hand(), seq_len=16, pad_token_id=0)
    assert batch.batch_size == torch.Size([1])
    assert batch["fwd_input_ids"].tolist() == [[1, 2, 3, 4, 5, 6, 7, 8, 9, 9]]
    assert batch["fwd_position_ids"].tolist() == [[0, 1, 2, 3, 4, 3, 2, 3, 0, 1]]
    assert batch["fwd_parent"].tolist() == [[-1, 0, 1, 2, 3, 2, 1, 6, -1, 8]]
    assert batch["fwd_subtree_end"].tolist() == [[8, 8, 6, 5, 5, 6, 8, 8, 10, 10]]
    assert batch["sequence_ids"].tolist() == [[2] * 5 + [3] * 4 + [1] * 4 + [0] * 2]  # the logical row, in trie order
    assert batch["fwd_index"].tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 5, 0, 1, 6, 7, 8, 9]]
    assert packing_metrics(batch) == {
        "train/packing_efficiency": 1.0,
        "train/forward_tokens": 10.0,
        "train/logical_tokens": 15.0,
    }


def test_a_tree_cut_by_a_row_boundary_repeats_its_shared_prefix() -> None:
    # Rows of 8 need 2 rows; the smallest capacity giving 2 rows is 6: [A, B] (6 nodes) and [C, D] (4 + 2),
    # where C starts again from the shared 1 2.
    batch = pack_trees(_hand(), seq_len=8, pad_token_id=0)
    assert batch["fwd_input_ids"].tolist() == [[1, 2, 3, 4, 5, 6], [1, 2, 7, 8, 9, 9]]
    assert batch["fwd_parent"].tolist() == [[-1, 0, 1, 2, 3, 2], [-1, 0, 1, 2, -1, 4]]
    assert batch["fwd_subtree_end"].tolist() == [[6, 6, 6, 5, 5, 6], [4, 4, 4, 4, 6, 6]]
    assert packing_metrics(batch)["train/forward_tokens"] == 12.0


def test_check_trees_catches_a_mask_that_leaks_a_branch_to_its_sibling() -> None:
    batch = pack_trees(_hand(), seq_len=16, pad_token_id=0)
    batch["fwd_subtree_end"][0, 3] = 6  # A's token 4 would become visible to B's token 6 (node 5)
    with pytest.raises(AssertionError, match="attends to something other than its own prefix"):
        check_trees(batch)


def test_rows_are_a_multiple_of_the_ranks_and_a_padding_row_sees_only_itself() -> None:
    batch = pack_trees(_hand(), seq_len=16, pad_token_id=0, rows_multiple_of=2)
    assert batch.batch_size == torch.Size([2])
    # K minibatches need K rows
    assert pack_trees(_hand(), seq_len=16, pad_token_id=0, min_rows=3).batch_size == torch.Size([3])
    pad = pad_row(batch)
    assert pad["fwd_parent"].tolist() == [[-1] * pad["fwd_parent"].shape[1]]
    assert pad["fwd_subtree_end"].tolist() == [list(range(1, pad["fwd_parent"].shape[1] + 1))]


@pytest.fixture(scope="module", params=["tiny-qwen3", "random-llama"])
def model(request):
    torch.manual_seed(0)
    if request.param == "tiny-qwen3":
        return AutoModelForCausalLM.from_pretrained(
            resolve_model_path("tiny-qwen3"), dtype=torch.float32, attn_implementation="sdpa"
        )
    config = LlamaConfig(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_implementation="sdpa",
    )
    return AutoModelForCausalLM.from_config(config)


CASES = {
    "single_turn": dict(turns=1, seq_len=256),
    "multi_turn_divergent": dict(turns=2, seq_len=256),
    "split_across_rows": dict(turns=2, seq_len=24),
}


def _per_sample_logprobs_and_grads(model, batch, n: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    model.zero_grad()
    logprobs = packed_logprobs(model, batch, mask=batch["loss_mask"])  # [R,L]
    (logprobs * batch["advantages"]).sum().backward()
    per_sample = [logprobs.detach()[batch["sequence_ids"] == i] for i in range(n)]
    return per_sample, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("case", CASES)
def test_tree_forward_gives_the_logprobs_and_gradients_of_independent_sequences(model, case) -> None:
    spec = CASES[case]
    samples = grouped_samples(spec["turns"], seed=1)
    flat = pack_samples(samples, seq_len=spec["seq_len"], pad_token_id=0)
    tree = pack_trees(samples, seq_len=spec["seq_len"], pad_token_id=0)
    metrics = packing_metrics(tree)
    assert metrics["train/forward_tokens"] < metrics["train/logical_tokens"]  # something is shared
    if case == "split_across_rows":
        rows_of = {int(i): r for r in range(len(tree)) for i in tree["sequence_ids"][r].unique() if i >= 0}
        assert any(len({rows_of[g * 4 + k] for k in range(4)}) > 1 for g in range(3))  # some group spans rows
    expected, expected_grads = _per_sample_logprobs_and_grads(model, flat, len(samples))
    got, grads = _per_sample_logprobs_and_grads(model, tree, len(samples))
    for want, have in zip(expected, got):
        torch.testing.assert_close(have, want, atol=1e-5, rtol=0)
    assert max(float(g.abs().max()) for g in expected_grads) > 1e-2
    for want, have in zip(expected_grads, grads):
        torch.testing.assert_close(have, want, atol=1e-5, rtol=1e-4)


def test_the_flex_attention_block_mask_gives_the_logprobs_of_independent_sequences() -> None:
    """The GPU path's BlockMask, built from the same rule as the dense mask: forward only, since FlexAttention has no
    backward on CPU (torch 2.13; `trainer.attention = "flex_attention"` is refused there). Reference: SDPA over the
    independent layout, same weights; groups that share a first turn and diverge, cut across rows (one compile).
    On a CPU without native bf16 (AVX2 only) the compiled CPU kernel returns NaN for some tokens (seen 2026-11-25, AMD
    EPYC, torch 2.13): skipped there; the GPU suite runs the kernel this path exists for."""
    if not NATIVE_BF16:
        pytest.skip("FlexAttention's compiled CPU kernel gives NaN on CPUs without AVX512-BF16 (torch 2.13)")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    sdpa = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    flex = AutoModelForCausalLM.from_config(config, attn_implementation="flex_attention")
    flex.load_state_dict(sdpa.state_dict())
    samples = grouped_samples(2, seed=1)
    flat = pack_samples(samples, seq_len=24, pad_token_id=0)
    tree = pack_trees(samples, seq_len=24, pad_token_id=0)
    assert (
        len(tree) > 1 and packing_metrics(tree)["train/forward_tokens"] < packing_metrics(tree)["train/logical_tokens"]
    )
    with torch.no_grad():
        expected = packed_logprobs(sdpa, flat, mask=flat["loss_mask"])  # [R,L]
        got = packed_logprobs(flex, tree, mask=tree["loss_mask"])
    for i in range(len(samples)):
        torch.testing.assert_close(
            got[tree["sequence_ids"] == i], expected[flat["sequence_ids"] == i], atol=1e-5, rtol=0
        )


def test_every_forward_of_a_train_step_goes_through_the_tree(model) -> None:
    """π_old (decoupled correction), the reference model's logprobs, K = 2 minibatches and the update: same metrics
    and the same gradients as the same rows forwarded as independent sequences (the tree batch's own logical layout,
    so that both split into the same minibatches)."""
    samples = grouped_samples(2, seed=2)
    algorithm = LossConfig(kl_coef=0.05, rollout_correction=dict(bypass_mode=False, rollout_is="token"))

    def run(batch) -> tuple[dict, list[torch.Tensor]]:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        metrics = train_step(
            model,
            optimizer,
            scheduler,
            split_micro_batches(batch, 1),
            algorithm,
            max_grad_norm=1e9,
            horizon=256,
            n_minibatches=2,
            reference=model,
        )
        return metrics, [p.grad.clone() for p in model.parameters()]

    batch = pack_batch(samples, seq_len=32, pad_token_id=0, prefix_sharing=True, rows_multiple_of=2)
    assert len(batch) >= 2
    tree, tree_grads = run(batch)
    flat, flat_grads = run(batch.exclude(*[key for key in batch.keys() if key.startswith("fwd_")]))
    for key in (
        "loss",
        "pg_loss",
        "kl",
        "ratio_mean",
        "entropy",
        "mismatch_k3",
        "rollout_corr/kl",
        "grad_norm",
        "num_loss_tokens",
    ):
        assert tree[key] == pytest.approx(flat[key], rel=1e-4, abs=1e-6), key
    for want, have in zip(flat_grads, tree_grads):
        torch.testing.assert_close(have, want, atol=1e-5, rtol=1e-4)


def _rank(rank: int, world: int, init_file: str, out: str) -> None:
    """One rank of a 2-rank gloo group: FSDP2 over the tiny Qwen3, its share of the tree rows, one train step."""
    import torch.distributed as dist

    from rl.training.distributed import Ranks, rank_rows, shard

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.manual_seed(0)
    lm = AutoModelForCausalLM.from_pretrained(
        resolve_model_path("tiny-qwen3"), dtype=torch.float32, attn_implementation="sdpa"
    )
    model = shard(lm, device="cpu", param_dtype=None)
    ranks = Ranks(rank, world)
    batch = pack_batch(
        grouped_samples(2, seed=3), seq_len=24, pad_token_id=0, prefix_sharing=True, rows_multiple_of=world
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    metrics = train_step(
        model,
        optimizer,
        scheduler,
        rank_rows([batch], ranks, 1),
        LossConfig(),
        max_grad_norm=1e9,
        horizon=40,
        ranks=ranks,
    )
    grads = {name: p.grad.full_tensor() for name, p in lm.named_parameters()}
    if rank == 0:
        torch.save({"metrics": metrics, "grads": grads}, out)
    dist.barrier()  # neither rank tears gloo down while the other still uses it
    dist.destroy_process_group()


def test_two_ranks_of_tree_rows_give_the_gradient_of_independent_sequences() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank0.pt")
        mp.spawn(_rank, args=(2, os.path.join(tmp, "init"), out), nprocs=2, join=True)
        sharded = torch.load(out)
    torch.manual_seed(0)
    lm = AutoModelForCausalLM.from_pretrained(
        resolve_model_path("tiny-qwen3"), dtype=torch.float32, attn_implementation="sdpa"
    )
    optimizer = torch.optim.SGD(lm.parameters(), lr=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    flat = pack_samples(grouped_samples(2, seed=3), seq_len=24, pad_token_id=0)
    metrics = train_step(
        lm, optimizer, scheduler, split_micro_batches(flat, 1), LossConfig(), max_grad_norm=1e9, horizon=40
    )
    for key in ("loss", "ratio_mean", "entropy", "grad_norm", "num_loss_tokens"):
        assert sharded["metrics"][key] == pytest.approx(metrics[key], rel=1e-4, abs=1e-6), key
    for name, p in lm.named_parameters():
        torch.testing.assert_close(sharded["grads"][name], p.grad, atol=1e-5, rtol=1e-4, msg=name)
