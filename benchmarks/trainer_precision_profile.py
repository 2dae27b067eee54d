"""Where a training step's time goes in fp32, under bf16 autocast, and on the trainer's bf16 compute copy: the trainer's
model (fp32 master weights), one forward and backward of `--tokens` tokens in rows of `--row` tokens, profiled by
operator with torch.profiler.

Prints for each precision the seconds per forward+backward, its share of that dtype's matmul peak (6 FLOPs per
parameter per token, `rl.commands.roofline`), and the operators that take the time, with the casts (`aten::to`,
`aten::_to_copy`, `aten::copy_`) summed: under autocast every fp32 weight is cast to bf16 at each use, in the forward
and again in the backward. The compute copy (`rl.training.compute_copy`, what a one-process bf16 trainer runs) casts
the weights once per optimizer step instead, stochastically rounded: that draw's time is printed apart, since a
step's several forward and backward passes share it.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/trainer_precision_profile.py --tokens 512 --row 256
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch

from rl.assets import resolve_model_path
from rl.commands.peak import matmul_peak_gflops
from rl.commands.roofline import training_peak_fraction
from rl.training.compute_copy import ComputeCopy

CASTS = ("aten::to", "aten::_to_copy", "aten::copy_")
MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "mkldnn", "aten::_mkl")


def step(model: torch.nn.Module, ids: torch.Tensor, autocast: bool, copy: ComputeCopy | None) -> None:
    context = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with copy.active() if copy is not None else contextlib.nullcontext():
        with context:
            logits = model(input_ids=ids).logits
        logits.float().logsumexp(-1).mean().backward()
    model.zero_grad(set_to_none=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--row", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(args.model), dtype=torch.float32)
    parameters = sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, model.config.vocab_size, (args.tokens // args.row, args.row))
    peaks = {
        name: matmul_peak_gflops(dtype, None) for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))
    }
    print(f"matmul peak GFLOP/s: fp32 {peaks['fp32']:.0f}, bf16 {peaks['bf16']:.0f}; {torch.get_num_threads()} threads")
    copy = ComputeCopy(model, torch.optim.SGD(model.parameters()))
    for name, autocast, on_copy in (
        ("fp32", False, False),
        ("bf16 autocast", True, False),
        ("bf16 compute copy", True, True),
    ):
        used = copy if on_copy else None
        step(model, ids, autocast, used)  # warm-up: oneDNN primitives for these shapes (and the copy's first draw)
        seconds = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            step(model, ids, autocast, used)
            seconds.append(time.perf_counter() - start)
        best = min(seconds)
        fraction = training_peak_fraction(parameters, args.tokens / best, peaks["bf16" if autocast else "fp32"])
        print(f"\n{name}: {best:.3f} s per forward+backward of {args.tokens} tokens, {fraction:.2f} of its peak")
        if on_copy:
            start = time.perf_counter()
            copy.refresh()
            with copy.active():
                pass
            print(f"  + {time.perf_counter() - start:.3f} s per optimizer step to draw the copy")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
            step(model, ids, autocast, used)
        events = profile.key_averages()
        total = sum(e.self_cpu_time_total for e in events)
        casts = sum(e.self_cpu_time_total for e in events if e.key in CASTS)
        matmuls = sum(e.self_cpu_time_total for e in events if any(m in e.key for m in MATMULS))
        print(
            f"  self time: matmuls {matmuls / total:.0%}, casts {casts / total:.0%}, other {1 - (matmuls + casts) / total:.0%}"
        )
        for event in sorted(events, key=lambda e: -e.self_cpu_time_total)[:12]:
            print(f"  {event.self_cpu_time_total / total:6.1%}  {event.key} ({event.count} calls)")


if __name__ == "__main__":
    main()
