"""LoRA on a GPU: the trainer's step under bf16 autocast trains the adapters alone, and the merged model (what
`rlmesh export` writes) computes the adapter model's logprobs. peft's CUDA path, not reachable on a CPU run."""

import copy

import torch

from rl.config.lora import LoraConfig
from rl.config.loss import LossConfig
from rl.packing.prefix_tree import pack_trees
from rl.packing.rows import split_micro_batches
from rl.training.logprobs import packed_logprobs
from rl.training.lora import adapter_state_dict, with_adapters
from rl.training.train_step import train_step
from tests.support.gpu_models import random_qwen3
from tests.support.tree_samples import grouped_samples


def test_a_lora_step_on_the_gpu_trains_only_the_adapters_and_merges_to_the_same_policy(record):
    model = with_adapters(random_qwen3().cuda(), LoraConfig(enabled=True, rank=8, alpha=16.0))
    base_before = {name: p.detach().clone() for name, p in model.named_parameters() if not p.requires_grad}
    adapters_before = {name: t.clone() for name, t in adapter_state_dict(model).items()}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    batches = split_micro_batches(pack_trees(grouped_samples(2, seed=1, vocab=1024), seq_len=64, pad_token_id=0), 2)
    for _ in range(2):
        metrics = train_step(
            model, optimizer, scheduler, batches, LossConfig(), max_grad_norm=1.0, horizon=64, device="cuda",
            compute=lambda: torch.autocast("cuda", dtype=torch.bfloat16),
        )  # fmt: skip
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    for name, tensor in model.named_parameters():
        if not tensor.requires_grad:
            assert torch.equal(tensor, base_before[name]), f"frozen {name} changed"
    moved = [name for name, t in adapter_state_dict(model).items() if not torch.equal(t, adapters_before[name])]
    assert len(moved) == len(adapters_before) > 0  # every A and B moved (B starts at 0)
    batch = batches[0].to("cuda")
    with torch.no_grad():
        adapted = packed_logprobs(model, batch, mask=batch["loss_mask"])
        merged = copy.deepcopy(model).merge_and_unload()
        exported = packed_logprobs(merged, batch, mask=batch["loss_mask"])
    gap = float((adapted - exported).abs().max())
    record(loss=metrics["loss"], merged_logprob_gap=gap, adapter_tensors=len(moved))
    assert gap < 1e-4, gap
