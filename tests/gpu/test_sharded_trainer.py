"""One-rank NCCL group, FSDP2 (fp32 and bf16 mixed precision) and a DCP round trip, against the unsharded step.

A one-rank group runs every collective the sharded trainer runs (the step's CPU float64 counts through gloo, FSDP2's
gathers and reduce-scatters through NCCL) on one GPU, which cannot host two NCCL ranks. The reference is the
trainer's own one-process path: an unsharded model, fp32 or under bf16 autocast.
"""

import contextlib
import copy
import os

import pytest
import torch
import torch.distributed as dist

from rl.checkpoint import store as checkpoint
from rl.config.loss import LossConfig
from rl.packing.prefix_tree import pack_trees
from rl.packing.rows import split_micro_batches
from rl.training import distributed
from rl.training.logprobs import packed_logprobs
from rl.training.train_step import train_step
from tests.support.gpu_models import free_port, random_qwen3
from tests.support.tree_samples import grouped_samples

ALGORITHM = LossConfig(rollout_correction={"preset": "decoupled_token_is", "rollout_is_batch_normalize": True})


@pytest.fixture(scope="module")
def group():
    """The trainer's own group set-up (`distributed.init_process_group`), with one rank."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    ranks = distributed.init_process_group("cuda")
    yield ranks
    dist.destroy_process_group()


def _batch():
    samples = grouped_samples(2, seed=1, groups=4, vocab=1024)
    return split_micro_batches(pack_trees(samples, seq_len=64, pad_token_id=0), 2)


def _step(model, trained, ranks, compute):
    """One train step with SGD at lr 0 (weights stay): the step's metrics and the whole gradient of every parameter."""
    optimizer = torch.optim.SGD(trained.parameters(), lr=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    metrics = train_step(
        trained, optimizer, scheduler, _batch(), ALGORITHM, max_grad_norm=1e9, horizon=64, device="cuda",
        compute=compute, ranks=ranks,
    )  # fmt: skip
    grads = {
        name: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).float().clone()
        for name, p in model.named_parameters()
    }
    return metrics, grads


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.mark.parametrize("mixed", [False, True], ids=["fp32", "bf16_mixed_precision"])
def test_a_sharded_step_gives_the_loss_and_gradients_of_the_unsharded_step(group, mixed, record):
    base = random_qwen3().cuda()
    reference = copy.deepcopy(base)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if mixed else contextlib.nullcontext
    want, want_grads = _step(reference, reference, distributed.Ranks.single(), autocast)
    sharded = copy.deepcopy(base)
    root = distributed.shard(sharded, device="cuda", param_dtype=torch.bfloat16 if mixed else None)
    got, grads = _step(sharded, root, group, contextlib.nullcontext)  # mixed: FSDP2 gathers bf16 weights, no autocast
    loss_gap = abs(got["loss"] - want["loss"]) / abs(want["loss"])
    worst = max(_relative(grads[name], want_grads[name]) for name in want_grads)
    record(loss=got["loss"], reference_loss=want["loss"], loss_relative_gap=loss_gap, worst_grad_relative_gap=worst)
    assert got["num_loss_tokens"] == want["num_loss_tokens"] > 0
    assert loss_gap < (3e-2 if mixed else 1e-5), loss_gap  # bf16 weights (FSDP2) vs bf16 autocast: ~8 bits
    assert worst < (1e-1 if mixed else 1e-4), worst


def test_a_sharded_checkpoint_round_trips_through_dcp(group, tmp_path, record):
    model = random_qwen3(seed=1).cuda()
    root = distributed.shard(model, device="cuda", param_dtype=torch.bfloat16)
    optimizer = torch.optim.AdamW(root.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    train_step(
        root, optimizer, scheduler, _batch(), ALGORITHM, max_grad_norm=1.0, horizon=64, device="cuda", ranks=group
    )
    checkpoint.write(tmp_path, checkpoint.TRAINER, model, optimizer, scheduler)
    fresh = random_qwen3(seed=2).cuda()
    fresh_root = distributed.shard(fresh, device="cuda", param_dtype=torch.bfloat16)
    fresh_optimizer = torch.optim.AdamW(fresh_root.parameters(), lr=1e-3)
    fresh_scheduler = torch.optim.lr_scheduler.LambdaLR(fresh_optimizer, lambda step: 1.0)
    fresh_optimizer.step()  # AdamW state exists before loading, as in a resumed trainer
    checkpoint.load_trainer(tmp_path, fresh, fresh_optimizer, fresh_scheduler)
    batch = _batch()[0].to("cuda")
    with torch.no_grad():
        want = packed_logprobs(root, batch, mask=batch["loss_mask"])
        got = packed_logprobs(fresh_root, batch, mask=batch["loss_mask"])
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    saved = optimizer.state_dict()["state"]
    loaded = fresh_optimizer.state_dict()["state"]
    for key in saved:
        for name in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(loaded[key][name].full_tensor(), saved[key][name].full_tensor(), atol=0, rtol=0)
    record(checkpoint_megabytes=sum(f.stat().st_size for f in tmp_path.rglob("*") if f.is_file()) / 2**20)


def test_the_cuda_rng_state_is_saved_and_restored():
    torch.cuda.manual_seed(3)
    torch.randn(4, device="cuda")
    state = checkpoint.rng_state()
    first = torch.randn(4, device="cuda")
    torch.randn(100, device="cuda")
    checkpoint.set_rng_state(state)
    assert torch.equal(torch.randn(4, device="cuda"), first)
