"""Where a generator's decode step goes: the main job's generation phase replayed on one vLLM engine, timed by part.

Builds the engine exactly as a generator does (`actors.generator.engine_args` / `engine_environment` of the config),
then runs `--batches` generation phases of `groups x group_size` requests (the task's rendered prompts, one seed per
request, the config's sampling and `max_new_tokens`), each added at once as the loop's rows arrive. Wall-clock timers
wrapped around vLLM's own functions split every engine step into: scheduling, input preparation, the model forward,
the logits (lm_head), sampling, the sampled tokens' logprobs (log-softmax over the vocabulary, gather and rank),
the scheduler's update, output processing; the rest of a step is Python between them. Prints a table and writes it
as JSON (`--out`), with the engine's start-up and its first (warm-up) phase; `--samples FILE` writes every measured
request's tokens and logprobs, to compare two settings (e.g. `--generator.enforce_eager false`) on the same requests.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/generation_profile.py --config configs/sum_digits_smollm2_cpu.toml

`--gemms ROWS` instead times one decode step's decoder GEMMs (every layer's weights, fp32) at ROWS sequences in this
process, through vLLM's CPU linear (`onednn_mm`) and the other fp32 GEMM paths torch offers, against their bandwidth.

`--pyspy FILE` instead splits a py-spy recording of a running generator (`py-spy record --pid PID --idle --format
raw -o FILE`, the generator process of a training run) into the same parts, counting the samples of its engine
thread (every engine call runs there).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from rl.assets import resolve_model_path
from rl.config import Config
from rl.config.root import load_config
from rl.loop.resolve import resolve_config

SECONDS: dict[str, float] = defaultdict(float)
"""Seconds spent inside each timed part, over the measured batches."""
CALLS: dict[str, int] = defaultdict(int)


def timed_method(owner: Any, name: str, label: str) -> None:
    """Replace `owner.name` with a wrapper that adds its wall time to `SECONDS[label]` (owner: object or class)."""
    original: Callable[..., Any] = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            SECONDS[label] += time.perf_counter() - start
            CALLS[label] += 1

    if isinstance(owner, type) and isinstance(owner.__dict__.get(name), staticmethod):
        setattr(owner, name, staticmethod(wrapper))
    else:
        setattr(owner, name, wrapper)


def instrument(llm: Any) -> None:
    """Timers around the parts of one in-process engine step (vLLM v1, one CPU or GPU worker)."""
    from vllm.v1.sample.sampler import Sampler

    engine_core = llm.llm_engine.engine_core.engine_core
    runner = engine_core.model_executor.driver_worker.worker.model_runner
    timed_method(engine_core, "step_fn", "engine step")  # what the in-process client calls each step
    timed_method(engine_core.scheduler, "schedule", "scheduling")
    timed_method(engine_core.scheduler, "update_from_output", "scheduler update")
    timed_method(runner, "_update_states", "input preparation")
    timed_method(runner, "_prepare_inputs", "input preparation")
    timed_method(runner.model, "forward", "model forward")
    timed_method(runner.model, "compute_logits", "logits (lm_head)")
    timed_method(runner.sampler, "forward", "sampler (all)")
    timed_method(Sampler, "compute_logprobs", "logprobs: log-softmax")
    timed_method(Sampler, "gather_logprobs", "logprobs: gather and rank")
    timed_method(llm.llm_engine.output_processor, "process_outputs", "output processing")


def prompts(config: Config, count: int) -> tuple[list[list[int]], list[int]]:
    """The first `count` training rows' prompts of the config's first task (its chat template, no system prompt
    of the task's own) and the stop tokens the loop gives its generators."""
    from env_types.renderer import load_tokenizer
    from rl.loop.scored_groups import built_tasks

    tasks, _, stop_tokens = built_tasks(config)
    task = next(iter(tasks.values())).task
    tokenizer = load_tokenizer(resolve_model_path(config.model.path))
    rows = task.load_dataset("train")[:count]
    rendered = [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": row["prompt"]}], add_generation_prompt=True, return_dict=True
            )["input_ids"]
        )
        for row in rows
    ]
    return rendered, stop_tokens


PARTS = (
    ("weight reload and attestation", ("vllm_worker", "vllm_attest", "reset_prefix_cache", "load_weights")),
    ("logprobs", ("compute_logprobs", "gather_logprobs", "batched_count_greater_than")),
    ("sampling", ("v1/sample/",)),
    ("logits (lm_head)", ("compute_logits",)),
    ("model forward", ("model_executor/models/", "model_executor/layers/", "attention/")),
    ("input preparation", ("_update_states", "_prepare_inputs", "input_batch.py", "block_table.py")),
    ("scheduling", ("core/sched/",)),
    ("scheduler update", ("update_from_output",)),
    ("output processing", ("output_processor", "detokenizer")),
    ("adding requests", ("add_request",)),
)
"""A sampled stack's part: the first whose markers (file or function names) appear in it."""


def classify(raw: str) -> dict[str, float]:
    """Share of each part among the engine thread's samples in py-spy's raw (collapsed) output, idle included."""
    counts: dict[str, int] = defaultdict(int)
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if "engine_loop.py" not in stack and "vllm-engine" not in stack:
            continue  # another thread: the actor's event loop, Monarch's runtime
        part = next((name for name, markers in PARTS if any(m in stack for m in markers)), None)
        if part is None:
            part = "engine thread idle" if "engine_loop.py" not in stack else "engine step: other Python"
        counts[part] += int(count)
    total = sum(counts.values())
    return {name: n / total for name, n in sorted(counts.items(), key=lambda kv: -kv[1])}


async def paused_phases(llm: Any, requests: list[tuple[Any, Any]], after_steps: int) -> dict[str, str]:
    """One phase through an `EngineLoop` per weight-update mode, paused once after `after_steps` engine steps (the
    prefix cache dropped inside the pause, as a weight reload does): its wall time and the tokens it returned."""
    from actors.engine_loop import EngineLoop

    measured = {}
    for mode in ("finish", "resubmit", "continue"):
        loop = EngineLoop(llm.llm_engine)
        steps_before = CALLS["engine step"]
        start = time.perf_counter()
        pending = [asyncio.ensure_future(loop.generate(prompt, params)) for prompt, params in requests]
        while CALLS["engine step"] - steps_before < after_steps:
            await asyncio.sleep(0.001)
        async with loop.pause(mode, 1):
            await loop.call(llm.reset_prefix_cache)
        results = await asyncio.gather(*pending)
        wall = time.perf_counter() - start
        tokens = sum(len(result.output.outputs[0].token_ids) for result in results)
        kept = sum(result.token_versions.count(0) for result in results)
        measured[mode] = f"{wall:.2f} s, {tokens} tokens ({kept} sampled before the pause and kept)"
        await loop.close()
    return measured


def decoder_gemm_shapes(model_path: str) -> list[tuple[str, int, int]]:
    """(name, K, N) of one decoder layer's weight matrices as vLLM runs them: q/k/v fused into one GEMM, gate/up into
    one (`QKVParallelLinear`, `MergedColumnParallelLinear`), then the attention output and the MLP's down projection."""
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(model_path)
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    kv_heads = getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads
    qkv = (hf.num_attention_heads + 2 * kv_heads) * head_dim
    return [
        ("qkv", hf.hidden_size, qkv),
        ("o", hf.num_attention_heads * head_dim, hf.hidden_size),
        ("gate_up", hf.hidden_size, 2 * hf.intermediate_size),
        ("down", hf.intermediate_size, hf.hidden_size),
    ]


def gemm_paths(weights: list[Any]) -> dict[str, Callable[[Any, int], Any]]:
    """Ways to multiply a decode step's activations [M, K] by each weight [N, K] of `weights` (fp32): each entry
    prepares its own copy of every weight once and returns `gemm(x, i)` = x @ weights[i].T."""
    import torch
    from vllm import _custom_ops as ops

    paths: dict[str, Callable[[Any, int], Any]] = {}
    handlers = [ops.create_onednn_mm(w.t(), 32) for w in weights]  # vLLM's CPU linear (dispatch_cpu_unquantized_gemm)
    paths["vLLM onednn_mm (the engine's)"] = lambda x, i: ops.onednn_mm(handlers[i], x, None)
    paths["torch linear (MKL sgemm)"] = lambda x, i: torch.nn.functional.linear(x, weights[i])
    transposed = [w.t().contiguous() for w in weights]  # [K, N]
    paths["torch mm, weight stored [K, N]"] = lambda x, i: torch.mm(x, transposed[i])
    mkl_packed = [torch.ops.mkl._mkl_reorder_linear_weight(w, 32) for w in weights]  # inductor's fp32 freezing path
    paths["MKL packed sgemm (mkl._mkl_linear)"] = lambda x, i: torch.ops.mkl._mkl_linear(
        x, mkl_packed[i], weights[i], None, 32
    )
    dnnl_packed = [torch.ops.mkldnn._reorder_linear_weight(w, 32) for w in weights]
    paths["oneDNN packed (mkldnn._linear_pointwise)"] = lambda x, i: torch.ops.mkldnn._linear_pointwise(
        x, dnnl_packed[i], None, "none", [], ""
    )
    return paths


def time_decoder_gemms(model_path: str, rows: int, repeats: int) -> dict[str, float]:
    """Median seconds of one decode step's decoder GEMMs (every layer's, each layer with weights of its own so that
    they stream from memory as the engine's do) at `rows` sequences, by each of `gemm_paths`."""
    import torch
    from transformers import AutoConfig

    layers = AutoConfig.from_pretrained(model_path).num_hidden_layers
    shapes = decoder_gemm_shapes(model_path)
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, k, generator=generator) / k**0.5 for _ in range(layers) for _, k, n in shapes]
    inputs = {k: torch.randn(rows, k, generator=generator) for _, k, _ in shapes}
    paths = gemm_paths(weights)
    reference = [torch.nn.functional.linear(inputs[w.shape[1]], w) for w in weights]
    seconds: dict[str, float] = {}
    for name, gemm in paths.items():
        for i, w in enumerate(weights):  # each path computes the same products
            torch.testing.assert_close(gemm(inputs[w.shape[1]], i), reference[i], rtol=1e-4, atol=1e-4)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            for i, w in enumerate(weights):
                gemm(inputs[w.shape[1]], i)
            times.append(time.perf_counter() - start)
        seconds[name] = statistics.median(times)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/sum_digits_smollm2_cpu.toml")
    parser.add_argument("--batches", type=int, default=6, help="generation phases measured (after one warm-up)")
    parser.add_argument("--out", default=None, help="write the result as JSON here")
    parser.add_argument(
        "--pause-after-steps",
        type=int,
        default=0,
        help="also time one phase through the generator's EngineLoop with a weight-update pause after this many engine "
        "steps (prefix cache dropped, as a reload does), for each of finish, resubmit and continue",
    )
    parser.add_argument("--pyspy", default=None, help="split this py-spy raw recording instead of running")
    parser.add_argument(
        "--samples",
        default=None,
        help="write every measured request's token ids and logprobs here (JSON), to compare two settings' samples",
    )
    parser.add_argument(
        "--gemms",
        type=int,
        default=0,
        help="instead: time one decode step's decoder GEMMs at this many rows by each fp32 GEMM path, in this process",
    )
    args, rest = parser.parse_known_args()
    if args.gemms:
        config = load_config(args.config)
        model_path = resolve_model_path(config.model.path)
        import torch
        from transformers import AutoConfig

        layers = AutoConfig.from_pretrained(model_path).num_hidden_layers
        weight_bytes = 4 * layers * sum(k * n for _, k, n in decoder_gemm_shapes(model_path))
        flops = 2 * args.gemms * weight_bytes / 4
        print(
            f"decoder GEMMs of one decode step: {args.gemms} rows, {layers} layers, {weight_bytes / 1e6:.0f} MB of fp32 "
            f"weights, {flops / 1e9:.2f} GFLOP, {torch.get_num_threads()} threads (median of 20)"
        )
        for name, seconds in time_decoder_gemms(model_path, args.gemms, repeats=20).items():
            print(
                f"  {1000 * seconds:7.1f} ms  {weight_bytes / seconds / 1e9:5.1f} GB/s  {flops / seconds / 1e9:6.1f} GFLOP/s  {name}"
            )
        return
    if args.pyspy:
        with open(args.pyspy) as f:
            shares = classify(f.read())
        stepping = 1 - shares.get("engine thread idle", 0) - shares.get("weight reload and attestation", 0)
        print("  share of the engine thread, share of its generation steps (idle and weight reloads left out)")
        for name, share in shares.items():
            of_steps = "" if name in ("engine thread idle", "weight reload and attestation") else share / stepping
            print(f"  {share:6.1%}  {of_steps:>6.1%}  {name}" if of_steps != "" else f"  {share:6.1%}          {name}")
        return
    overrides = dict(zip((key.removeprefix("--") for key in rest[::2]), rest[1::2]))  # --section.key value
    config = resolve_config(load_config(args.config, overrides))  # the generator's dtype as the loop resolves it

    from actors.generator import engine_args, engine_environment, sampling_params

    os.environ.update(engine_environment(config.generator, []))
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    import torch

    if os.environ.get("TORCHDYNAMO_DISABLE") == "1":
        torch._dynamo.config.disable = True  # as the generator does: dynamo was imported before the variable was set
    from vllm import LLM
    from vllm.inputs import TokensPrompt

    from rollouts.types import GenerationRequest

    groups, group_size = config.run.groups_per_step, config.algorithm.group_size
    max_new_tokens = config.tasks[0].env.max_new_tokens
    start = time.perf_counter()
    llm = LLM(model=resolve_model_path(config.model.path), **engine_args(config.generator))
    engine_start_s = time.perf_counter() - start
    rows, stop_tokens = prompts(config, groups * (args.batches + 1))

    def requests_of(batch: int) -> list[tuple[Any, Any]]:
        """(prompt, sampling parameters) of phase `batch`'s requests."""
        requests = [
            GenerationRequest(rows[batch * groups + g], max_new_tokens, seed=1000 * batch + g * group_size + s)
            for g in range(groups)
            for s in range(group_size)
        ]
        return [
            (
                TokensPrompt(prompt_token_ids=r.prompt_token_ids),
                sampling_params(config.generator.sampling, r, stop_tokens),
            )
            for r in requests
        ]

    samples: list[dict[str, list]] = []
    """Each measured request's sampled token ids and their logprobs, in request order."""

    def phase(batch: int) -> tuple[float, int]:
        prompts_and_params = requests_of(batch)
        start = time.perf_counter()
        outputs = llm.generate(
            [prompt for prompt, _ in prompts_and_params], [params for _, params in prompts_and_params], use_tqdm=False
        )
        wall = time.perf_counter() - start
        for output in outputs:
            sample = output.outputs[0]
            logprobs = [position[token].logprob for position, token in zip(sample.logprobs, sample.token_ids)]
            samples.append({"token_ids": list(sample.token_ids), "logprobs": logprobs})
        return wall, sum(len(o.outputs[0].token_ids) for o in outputs)

    start = time.perf_counter()
    phase(0)  # warm-up: first shapes, oneDNN primitives (and a compiled engine's remaining compilation)
    first_phase_s = time.perf_counter() - start
    del samples[:]
    instrument(llm)
    walls, tokens = [], []
    for batch in range(1, args.batches + 1):
        wall, count = phase(batch)
        walls.append(wall)
        tokens.append(count)
    total = sum(walls)
    step = SECONDS["engine step"]
    parts = {k: v for k, v in SECONDS.items() if k not in ("engine step", "sampler (all)")}
    sampler_other = SECONDS["sampler (all)"] - SECONDS["logprobs: log-softmax"] - SECONDS["logprobs: gather and rank"]
    parts["sampling (sampler less logprobs)"] = sampler_other
    inside_step = sum(v for k, v in parts.items() if k != "output processing")
    parts["engine step: Python between parts"] = step - inside_step
    parts["outside the engine step (LLM.generate, request handling)"] = total - step - SECONDS["output processing"]
    result = {
        "config": args.config,
        "dtype": config.generator.dtype,
        "overrides": overrides,
        "torch_threads": torch.get_num_threads(),
        "enforce_eager": config.generator.enforce_eager,
        "engine_start_s": engine_start_s,
        "first_phase_s": first_phase_s,
        "batches": args.batches,
        "requests_per_batch": groups * group_size,
        "completion_tokens_per_batch": statistics.fmean(tokens),
        "seconds_per_batch": statistics.fmean(walls),
        "seconds_per_batch_each": walls,
        "tokens_per_s": sum(tokens) / total,
        "engine_steps_per_batch": CALLS["engine step"] / args.batches,
        "ms_per_engine_step": 1000 * step / CALLS["engine step"],
        "share": {k: v / total for k, v in sorted(parts.items(), key=lambda kv: -kv[1])},
    }
    print(
        f"{config.generator.dtype}: {result['tokens_per_s']:.0f} tokens/s, {result['seconds_per_batch']:.2f} s per phase of "
        f"{result['requests_per_batch']} requests ({result['completion_tokens_per_batch']:.0f} tokens, "
        f"{result['engine_steps_per_batch']:.0f} engine steps of {result['ms_per_engine_step']:.1f} ms)"
    )
    print(f"  engine start {engine_start_s:.1f} s, first (warm-up) phase {first_phase_s:.2f} s")
    for name, share in result["share"].items():
        print(f"  {share:6.1%}  {name}")
    if args.pause_after_steps:
        result["pause"] = asyncio.run(paused_phases(llm, requests_of(1), args.pause_after_steps))
        for mode, measured in result["pause"].items():
            print(f"  a pause after {args.pause_after_steps} engine steps, {mode}: {measured}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    if args.samples:
        with open(args.samples, "w") as f:
            json.dump(samples, f)
    llm.llm_engine.engine_core.shutdown()


if __name__ == "__main__":
    main()
