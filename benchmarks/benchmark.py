"""Component throughput on this machine: vLLM generation, trainer steps, torchstore weight sync.

    .venv/bin/python benchmarks/benchmark.py [--model smollm2-135m-instruct] [--only generator,trainer,weight_sync]

Prints one JSON object per measurement. Numbers, not pass/fail: write them down where they are used.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

import torch

from rl.assets import resolve_model_path
from rl.precision import TORCH_DTYPES


def report(**fields) -> None:
    print(json.dumps(fields), flush=True)


def bench_generator(model_path: str, dtype: str, num_prompts: int, new_tokens: int) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    start = time.perf_counter()
    llm = LLM(model=model_path, skip_tokenizer_init=True, dtype=dtype, enforce_eager=True, max_model_len=512, seed=0)
    startup = time.perf_counter() - start
    prompts = [TokensPrompt(prompt_token_ids=list(range(100 + i, 140 + i))) for i in range(num_prompts)]
    params = SamplingParams(max_tokens=new_tokens, min_tokens=new_tokens, temperature=1.0, logprobs=0, detokenize=False)
    llm.generate(prompts[:2], params, use_tqdm=False)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    tokens = sum(len(output.outputs[0].token_ids) for output in outputs)
    report(
        component="generator",
        dtype=dtype,
        sequences=num_prompts,
        new_tokens=new_tokens,
        startup_s=round(startup, 1),
        tokens_per_s=round(tokens / seconds, 1),
    )


def bench_trainer(model_path: str, dtype: str, rows: int, seq_len: int, steps: int) -> None:
    from transformers import AutoModelForCausalLM

    from rl.training.logprobs import token_logprobs

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=TORCH_DTYPES[dtype], attn_implementation="sdpa")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, model.config.vocab_size, (rows, seq_len), generator=generator)  # [B,L]
    position_ids = torch.arange(seq_len // 4).repeat(rows, 4)  # [B,L]: four packed samples per row
    timings = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        token_logprobs(model, input_ids, position_ids).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        timings.append(time.perf_counter() - start)
    best = min(timings[1:])
    report(component="trainer", dtype=dtype, rows=rows, seq_len=seq_len, tokens_per_s=round(rows * seq_len / best, 1))


async def bench_weight_sync(model_path: str, dtype: str) -> None:
    from transformers import AutoModelForCausalLM

    from rl import weight_sync

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=TORCH_DTYPES[dtype])
    state_dict = {name: tensor.detach() for name, tensor in model.state_dict().items()}
    megabytes = sum(t.numel() * t.element_size() for t in state_dict.values()) / 2**20
    await weight_sync.initialize_store()
    try:
        start = time.perf_counter()
        await weight_sync.push_state_dict(state_dict, 1)
        push = time.perf_counter() - start
        start = time.perf_counter()
        await weight_sync.pull_state_dict(1)
        pull = time.perf_counter() - start
    finally:
        await weight_sync.shutdown_store()
    report(
        component="weight_sync", dtype=dtype, megabytes=round(megabytes), push_s=round(push, 2), pull_s=round(pull, 2)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--only", default="generator,trainer,weight_sync")
    args = parser.parse_args()
    model_path = resolve_model_path(args.model)
    parts = args.only.split(",")
    torch.manual_seed(0)
    if "trainer" in parts:
        for dtype in ("float32", "bfloat16"):
            bench_trainer(model_path, dtype, rows=8, seq_len=256, steps=2)
    if "weight_sync" in parts:
        asyncio.run(bench_weight_sync(model_path, "bfloat16"))
    if "generator" in parts:
        bench_generator(model_path, "bfloat16", num_prompts=64, new_tokens=64)


if __name__ == "__main__":
    main()
