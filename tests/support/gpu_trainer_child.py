"""A sharded trainer rank as a process of its own, for the GPU suite's kill test (tests/gpu/test_trainer_kill.py).

    python -m tests.support.gpu_trainer_child --device cuda --run-dir DIR --steps 3 [--checkpoint-after 2]
        [--stall-in-step 3 --signal FILE] [--resume] [--out FILE]

It runs the project's trainer-side code as a rank of `PolicyTrainer` does, without Monarch: the trainer's group
(`distributed.init_process_group`, from RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT as `rl.processes.trainer_mesh`
sets them), FSDP2 over it (`distributed.shard`; `--dtype bfloat16`: the bf16 mixed precision of a sharded GPU trainer),
AdamW with a warm-up LR schedule, `train_step` on prefix-tree packed batches (`pack_for_trainer`), and checkpoints
through the trainer's own writer and loader (`checkpoint.save_trainer_rank` / `load_trainer_rank`), committed as the
controller commits them (`checkpoint.begin` / `commit`). The model (a random Qwen3) has attention dropout, so every
step draws from the device's RNG: a resume reproduces a step only if the checkpoint restored that RNG too.

`--stall-in-step S` stops step S in the middle of its backward (some layers' gradients reduced, the rest not), writes
what this rank holds to `--signal` and waits there to be killed. `--out` gets, after the last step, each step's
metrics, the full parameters after each step (and as loaded) and a draw from each RNG (torch.save).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import psutil
import torch
import torch.distributed as dist

from rl.checkpoint import store as checkpoint
from rl.config.loss import LossConfig
from rl.config.roles import TrainerConfig
from rl.packing.prefix_tree import pack_for_trainer
from rl.packing.rows import split_micro_batches
from rl.training import distributed
from rl.training.schedule import lr_lambda
from rl.training.train_step import train_step
from tests.support.gpu_models import random_qwen3
from tests.support.tree_samples import grouped_samples

LOSS = LossConfig(rollout_correction={"preset": "decoupled_token_is", "rollout_is_batch_normalize": True})
"""The GPU recipe's loss (bf16 sampler + correction preset): a no-grad pass for π_old, then the trained pass."""
STALL_LIMIT_S = 300.0
"""A stalled rank that nobody kills exits by itself after this long (its parent died, or forgot it)."""


def trainer_config(device: str) -> TrainerConfig:
    """The trainer's settings here: a large LR so each step moves the weights well past bf16's rounding, and a warm-up
    so the LR schedule's state matters at every step."""
    return TrainerConfig(device=device, lr=1e-3, weight_decay=0.01, warmup_steps=3, seq_len=64, micro_batch_size=2)


def step_batch(step: int, trainer: TrainerConfig) -> list:
    """Step `step`'s micro-batches: GRPO-like groups of two-turn samples (shared prefixes), packed as the trainer packs."""
    samples = grouped_samples(2, seed=100 + step, groups=4, vocab=1024)
    return split_micro_batches(pack_for_trainer(samples, trainer, pad_token_id=0), trainer.micro_batch_size)


def full_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter, gathered whole (DTensor shards) and on the CPU."""
    return {
        name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().float().cpu().clone()
        for name, p in model.named_parameters()
    }


def held_memory(device: str) -> dict[str, int]:
    if device != "cuda":
        return {"allocated_bytes": 0, "reserved_bytes": 0}
    return {"allocated_bytes": torch.cuda.memory_allocated(), "reserved_bytes": torch.cuda.memory_reserved()}


def stall_in_backward(model: torch.nn.Module, signal: Path, report: dict) -> None:
    """Make the next trained pass stop in its backward at the middle decoder layer's output gradient (the later layers'
    gradients already reduce-scattered), write `report` and this rank's memory to `signal`, and wait to be killed."""
    layers = model.get_decoder().layers
    layer = layers[len(layers) // 2]

    def on_gradient(grad: torch.Tensor) -> None:
        if grad.is_cuda:
            torch.cuda.synchronize()  # the step's kernels so far have run: the kill lands between two of them
        partial = signal.with_suffix(".partial")
        partial.write_text(json.dumps({**report, **held_memory(report["device"]), "pid": os.getpid()}))
        partial.rename(signal)  # whole or absent: the test polls for it
        deadline = time.monotonic() + STALL_LIMIT_S
        while time.monotonic() < deadline:
            time.sleep(0.05)
        raise SystemExit(f"stalled in step {report['step']} for {STALL_LIMIT_S} s and was not killed")

    def after_forward(module, args, output) -> None:
        hidden = output[0] if isinstance(output, tuple) else output
        if hidden.requires_grad:  # the trained pass, not the no-grad π_old pass
            hidden.register_hook(on_gradient)

    layer.register_forward_hook(after_forward)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], required=True)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="FSDP2's gather dtype")
    parser.add_argument("--run-dir", type=Path, required=True, help="the run directory its checkpoints go into")
    parser.add_argument("--steps", type=int, required=True, help="train through this step")
    parser.add_argument("--checkpoint-after", type=int, help="commit a checkpoint after this step")
    parser.add_argument("--resume", action="store_true", help="load the run's newest committed checkpoint first")
    parser.add_argument("--stall-in-step", type=int, help="stop this step mid-backward and wait to be killed")
    parser.add_argument("--signal", type=Path, help="written when stalled")
    parser.add_argument("--out", type=Path, help="the results, after the last step")
    args = parser.parse_args(argv)
    started = psutil.Process().create_time()
    trainer = trainer_config(args.device)
    torch.manual_seed(trainer.seed)
    ranks = distributed.init_process_group(args.device)
    model = random_qwen3(seed=0, attention_dropout=0.1).to(args.device)
    model.train()
    root = distributed.shard(
        model, device=args.device, param_dtype=torch.bfloat16 if args.dtype == "bfloat16" else None
    )
    optimizer = torch.optim.AdamW(
        root.parameters(), lr=trainer.lr, betas=trainer.betas, weight_decay=trainer.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(trainer, total_steps=args.steps))
    results: dict = {"steps": {}, "timings": {}}
    done = 0
    if args.resume:
        path = checkpoint.newest_checkpoint(args.run_dir)
        start = time.perf_counter()
        checkpoint.load_trainer_rank(path, model, optimizer, scheduler)
        results["timings"]["load_s"] = time.perf_counter() - start
        done = int(path.name.removeprefix("step_"))
        results["loaded_step"] = done
        results["parameters"] = {done: full_parameters(model)}
    results["timings"]["ready_s"] = time.time() - started  # process start to first step: a replacement's start-up
    for step in range(done + 1, args.steps + 1):
        if step == args.stall_in_step:
            report = {"device": args.device, "step": step, "steps": results["steps"]}
            stall_in_backward(model, args.signal, report)
        metrics = train_step(
            root, optimizer, scheduler, step_batch(step, trainer), LOSS, max_grad_norm=trainer.max_grad_norm,
            horizon=trainer.seq_len, device=args.device, ranks=ranks,
        )  # fmt: skip
        results["steps"][step] = metrics
        if args.out is not None:
            results.setdefault("parameters", {})[step] = full_parameters(model)
        if step == args.checkpoint_after:
            start = time.perf_counter()
            tmp = checkpoint.begin(args.run_dir, step)
            checkpoint.save_trainer_rank(tmp, model, optimizer, scheduler, ranks.rank)
            checkpoint.commit(args.run_dir, tmp, step, keep=2)
            results["timings"]["checkpoint_s"] = time.perf_counter() - start
    if args.out is not None:
        results["rng"] = {"cpu": torch.rand(4)}
        if args.device == "cuda":
            results["rng"]["cuda"] = torch.rand(4, device="cuda").cpu()
        torch.save(results, args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
