"""The trainer's model FLOPs utilization on one FSDP2 step over packed prefix-tree rows, counting useful tokens.

Useful FLOPs are those of training every sample as its own sequence (what prefix sharing saves is not counted as
work): per sample of n tokens, 6 x (matmul parameters: every linear layer, the output layer included, the
embedding lookup not) x n, plus causal attention 6 x 2 x layers x (heads x head_dim) x n^2 / 2 (QK^T and AV,
forward and backward). MFU is that over the step's seconds, over the device's measured bf16 (GPU) or fp32 (CPU)
matmul peak (`rl.commands.peak`), as torchtitan and PaLM count it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from rl.config.loss import LossConfig
from rl.packing.prefix_tree import pack_trees, packing_metrics
from rl.packing.rows import TrainSample, split_micro_batches
from rl.training.train_step import train_step


def grpo_samples(groups: int, size: int, prompt: int, completion: int, vocab: int, seed: int) -> list[TrainSample]:
    """`groups` GRPO groups of `size` samples: one prompt of `prompt` tokens each, completions of `completion`."""
    generator = torch.Generator().manual_seed(seed)
    samples = []
    for _ in range(groups):
        shared = torch.randint(3, vocab, (prompt,), generator=generator).tolist()
        for _ in range(size):
            ids = shared + torch.randint(3, vocab, (completion,), generator=generator).tolist()
            mask = [False] * prompt + [True] * completion
            sampling = [-1.0 - float(torch.rand((), generator=generator)) if m else 0.0 for m in mask]
            samples.append(TrainSample(ids, mask, sampling, float(torch.randn((), generator=generator)), 0))
    return samples


def useful_flops(model: torch.nn.Module, samples: list[TrainSample]) -> float:
    """FLOPs of a training step over `samples` as separate sequences (module docstring)."""
    config = model.config
    matmul = sum(module.weight.numel() for module in model.modules() if isinstance(module, torch.nn.Linear))
    attention_width = config.num_attention_heads * config.head_dim
    flops = 0.0
    for sample in samples:
        n = len(sample.input_ids)
        flops += 6 * matmul * n + 6 * 2 * config.num_hidden_layers * attention_width * n * n / 2
    return flops


@dataclass(frozen=True)
class Utilization:
    seconds: float
    useful_tflops: float
    mfu: float
    useful_tokens: int
    forward_tokens: int


def measure(
    lm: torch.nn.Module,
    trained: torch.nn.Module,
    samples: list[TrainSample],
    *,
    seq_len: int,
    rows_per_micro_batch: int,
    device: str,
    compute,
    ranks,
    peak_gflops: float,
    steps: int = 2,
) -> Utilization:
    """The best of `steps` timed AdamW steps (after one warm-up) of `trained` (FSDP2 over `lm`) on `samples` packed as
    prefix trees."""
    batch = pack_trees(samples, seq_len=seq_len, pad_token_id=0)
    micro_batches = split_micro_batches(batch, rows_per_micro_batch)
    optimizer = torch.optim.AdamW(trained.parameters(), lr=1e-6)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    synchronize = torch.cuda.synchronize if device == "cuda" else lambda: None
    best = float("inf")
    for step in range(steps + 1):
        synchronize()
        start = time.perf_counter()
        train_step(
            trained, optimizer, scheduler, micro_batches, LossConfig(), max_grad_norm=1e9, horizon=seq_len,
            device=device, compute=compute, ranks=ranks,
        )  # fmt: skip
        synchronize()
        if step:  # the first step warms the kernels and allocator up
            best = min(best, time.perf_counter() - start)
    flops, packed = useful_flops(lm, samples), packing_metrics(batch)
    return Utilization(
        seconds=best,
        useful_tflops=flops / best / 1e12,
        mfu=flops / best / (peak_gflops * 1e9),
        useful_tokens=int(packed["train/logical_tokens"]),
        forward_tokens=int(packed["train/forward_tokens"]),
    )
