"""`rlmesh bench --config FILE`: how close the loop runs to what this machine allows.

One invocation, one config (same model, prompts and sampling throughout):
  1. the synchronous loop (`run.max_policy_staleness = 0`): its phases do not overlap, so its
     per-step generation and training times are "generation alone" and "training alone";
  2. the async loop with staleness budgets 1 and 2;
  3. the in-process floor of a weight sync of the same state dict (cast, copy into shared
     memory, vLLM reload of an engine built with the generator's own engine arguments) and the
     machine's matmul peak in each dtype (fp32, bf16: a CPU without native bf16 shows it here);
  4. each phase against its roofline (`rl.commands.roofline`): generation against the decode step's bound at the
     loop's batch from the generator dtype's matmul peak and the memory bandwidth of the generator's cores,
     training against the matmul peak of its dtype.
Trained tokens per second are counted both ways: tokens forwarded (a prefix shared by a group's
samples once per row) and the samples' logical tokens; their ratio is the prefix-sharing gain.
Writes `bench.json` and `bench.md` (a markdown table) into `<run.output_dir>/<run.name>-bench/`.
The first step of every loop is left out of the averages (start-up, nothing to overlap yet).
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any

import torch

from rl.assets import resolve_model_path
from rl.commands.peak import matmul_peak_gflops, memory_bandwidth_gbs, timed
from rl.commands.roofline import Completion, decode_bound, decode_model, phase_bound, training_peak_fraction
from rl.config import Config
from rl.loop.resolve import resolve_config
from rl.precision import TORCH_DTYPES, native_bf16
from rl.weights.shared_file import SharedWeights, file_path, map_file, plan_layout, write


def weight_sync_floor(config: Config) -> dict[str, float]:
    """Seconds of the sync's unavoidable work in one process, on the roles' devices: cast the trainer's weights to the
    generator dtype (on its device), copy them into a shared-memory file (device-to-host on GPU), and every vLLM
    worker's load of that file by handle, as the generators do it (each the best of 3, warm)."""
    from actors.generator import engine_args, engine_environment, load_weights

    os.environ.update(engine_environment(config.generator, []))
    from transformers import AutoModelForCausalLM
    from vllm import LLM

    device = config.trainer.device
    path = resolve_model_path(config.model.path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=TORCH_DTYPES[config.trainer.param_dtype]).to(device)
    state_dict = model.state_dict()
    dtype = TORCH_DTYPES[config.generator.dtype]
    cast_s = min(
        timed(lambda: {name: tensor.to(dtype) for name, tensor in state_dict.items()}, device) for _ in range(3)
    )
    cast = {name: tensor.to(dtype) for name, tensor in state_dict.items()}
    layout, nbytes = plan_layout(cast, None)
    handle = SharedWeights(file_path("bench"), nbytes, layout)
    buffer = map_file(handle.path, nbytes, create=True)
    firsts = {layout[name][0]: name for name in reversed(list(layout))}  # a tied weight is copied once

    def copy() -> None:
        for name in firsts.values():
            write(buffer, layout[name], cast[name])

    try:
        copy_s = min(timed(copy, device) for _ in range(3))  # the first copy also faults the pages in
        llm = LLM(model=path, **engine_args(config.generator))  # the engine the loop's generators run
        try:
            # the first sets vLLM's reload up
            reload_s = min(timed(lambda: load_weights(llm, handle)) for _ in range(3))
        finally:
            llm.llm_engine.engine_core.shutdown()
    finally:
        Path(handle.path).unlink(missing_ok=True)
    return {
        "cast_s": cast_s,
        "copy_s": copy_s,
        "reload_s": reload_s,
        "total_s": cast_s + copy_s + reload_s,
        "megabytes": nbytes / 2**20,
    }


def parameter_count(config: Config) -> int:
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(resolve_model_path(config.model.path)))
    return sum(p.numel() for p in model.parameters())


def generation_roofline(config: Config, sync: dict[str, float], results: dict[str, Any]) -> dict[str, Any]:
    """The decode bound of the loop's generation (`rl.commands.roofline`), in the generator's dtype: each replica
    decodes its share of a step's samples at once (at most `max_num_seqs`) at their mean context (prompt plus half
    the completion); the replicas' bounds add up."""
    model = decode_model(resolve_model_path(config.model.path), TORCH_DTYPES[config.generator.dtype].itemsize)
    replicas = config.generator.num_replicas
    samples = config.run.groups_per_step * config.algorithm.group_size
    batch = min(-(-samples // replicas), config.generator.max_num_seqs)
    context = sync["prompt_tokens_mean"] + sync["completion_tokens_mean"] / 2
    peak, bandwidth = results["generator_peak_gflops"], results["bandwidth_gbs"]
    bound = decode_bound(model, batch, context, peak, bandwidth)
    return {
        "batch": batch,
        "context": context,
        "tokens_per_s": replicas * batch / bound.seconds,
        "flops_tokens_per_s": replicas * batch / bound.compute_s,
        "bandwidth_tokens_per_s": replicas * batch / bound.memory_s,
        "bound_by": bound.bound_by,
    }


def phases_fraction(config: Config, sync: dict[str, Any], results: dict[str, Any]) -> float:
    """The loop's generation against the least time of the work it did (`rl.commands.roofline.phase_bound`), summed
    over its phases. A replica serves whole groups (a step's groups dealt round-robin here), and a phase lasts as long
    as its slowest replica's share."""
    model = decode_model(resolve_model_path(config.model.path), TORCH_DTYPES[config.generator.dtype].itemsize)
    peak, bandwidth = results["generator_peak_gflops"], results["bandwidth_gbs"]
    replicas = config.generator.num_replicas
    bound = 0.0
    for phase in sync["generation_phases"]:
        groups = sorted(phase)
        shares = [groups[index::replicas] for index in range(replicas)]
        bound += max(
            phase_bound(model, [c for group in share for c in phase[group]], peak, bandwidth)
            for share in shares
            if share
        )
    return bound / sum(sync["generation_phase_s"])


async def run_loop(config: Config, staleness: int, name: str) -> dict[str, float]:
    """One training run at budget `staleness`; per-step averages from its metrics.jsonl."""
    from rl.loop.controller import Controller

    run = config.run.model_copy(update={"max_policy_staleness": staleness, "name": name, "eval_every": 0})
    loop_config = config.model_copy(update={"run": run})
    summary = await Controller(loop_config).run()
    steps = [json.loads(line) for line in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()][1:]

    def mean(key: str) -> float:
        return statistics.fmean(step[key] for step in steps)

    seconds = sum(step["time/step_s"] for step in steps)
    trained = [json.loads(line) for line in (Path(summary["run_dir"]) / "rollouts.jsonl").read_text().splitlines()]
    turns = [turn for record in trained if record["kind"] == "train" for turn in record["rollout"]["turns"]]
    phases: dict[int, dict[str, list[Completion]]] = {step["step"]: {} for step in steps}  # step -> group -> requests
    for record in trained:
        if record["kind"] == "train" and record["step"] in phases:
            rollout = record["rollout"]
            for index, turn in enumerate(rollout["turns"]):  # a later turn's prompt holds its own sample's replies
                prompt = rollout["group_id"] if index == 0 else f"{rollout['rollout_id']}/{index}"
                phases[record["step"]].setdefault(rollout["group_id"], []).append(
                    Completion(prompt, len(turn["prompt_token_ids"]), len(turn["completion_token_ids"]))
                )
    train_seconds = sum(step["time/train_s"] for step in steps)
    return {
        "s_per_step": seconds / len(steps),
        "trained_tokens_per_s": sum(step["train/num_loss_tokens"] for step in steps) / seconds,
        "train_forward_tokens_per_s": sum(step["train/forward_tokens"] for step in steps) / train_seconds,
        "train_logical_tokens_per_s": sum(step["train/logical_tokens"] for step in steps) / train_seconds,
        "prefix_sharing_gain": sum(step["train/logical_tokens"] for step in steps)
        / sum(step["train/forward_tokens"] for step in steps),
        "generation_s": mean("time/generation_s"),
        "train_s": mean("time/train_s"),
        "weight_sync_s": mean("time/weight_sync_s"),
        "generation_tokens_per_s": mean("perf/generation_tokens_per_s"),
        "train_tokens_per_s": mean("train/train_tokens_per_s"),
        "overlap_ratio": mean("perf/overlap_ratio"),
        "version_offset_mean": mean("async/version_offset_mean"),
        "packing_efficiency": mean("train/packing_efficiency"),
        "evicted_stale_groups": sum(step["rollouts/evicted_stale_groups"] for step in steps),
        "prompt_tokens_mean": statistics.fmean(len(turn["prompt_token_ids"]) for turn in turns),
        "completion_tokens_mean": statistics.fmean(len(turn["completion_token_ids"]) for turn in turns),
        "generation_phases": list(phases.values()),
        "generation_phase_s": [step["time/generation_s"] for step in steps],
    }


def table(results: dict[str, Any]) -> str:
    sync, loops = results["loops"]["sync"], results["loops"]
    peaks = ", ".join(f"{dtype} {gflops:.0f}" for dtype, gflops in results["matmul_peak_gflops"].items())
    rows = [
        ("generation alone (tokens/s)", f"{sync['generation_tokens_per_s']:.0f}"),
        (
            "training alone: forwarded, logical tokens/s",
            f"{sync['train_forward_tokens_per_s']:.0f}, {sync['train_logical_tokens_per_s']:.0f}",
        ),
        ("prefix-sharing gain (logical / forwarded tokens)", f"{sync['prefix_sharing_gain']:.2f}"),
        (f"matmul peak, GFLOP/s ({results['native_bf16']})", peaks),
        (
            f"training, share of the {results['trainer_dtype']} matmul peak (forwarded tokens)",
            f"{results['trainer_peak_fraction']:.2f}",
        ),
        (
            f"memory bandwidth, GB/s (generator's cores); generator's {results['generator_dtype']} matmul peak, "
            "GFLOP/s",
            f"{results['bandwidth_gbs']:.1f}; {results['generator_peak_gflops']:.0f}",
        ),
        (
            f"generation roofline at batch {results['generation_roofline']['batch']}: tokens/s (bound by)",
            f"{results['generation_roofline']['tokens_per_s']:.0f} ({results['generation_roofline']['bound_by']})",
        ),
        (
            "generation, share of its roofline (of the FLOP bound, of the bandwidth bound)",
            f"{results['generation_roofline_fraction']:.2f} ("
            f"{sync['generation_tokens_per_s'] / results['generation_roofline']['flops_tokens_per_s']:.2f}, "
            f"{sync['generation_tokens_per_s'] / results['generation_roofline']['bandwidth_tokens_per_s']:.2f})",
        ),
        (
            "generation, share of the least time of its work (each prompt prefilled once, each decode step at the "
            "batch still running)",
            f"{results['generation_work_fraction']:.2f}",
        ),
    ]
    for name, loop in loops.items():
        rows.append(
            (f"{name} loop: s/step, trained tokens/s", f"{loop['s_per_step']:.2f}, {loop['trained_tokens_per_s']:.1f}")
        )
    for name in ("async_1", "async_2"):
        rows.append((f"{name} / sync throughput", f"{results['ratios'][name + '_vs_sync']:.2f}"))
        rows.append(
            (
                f"{name} overlap ratio, mean version offset",
                f"{loops[name]['overlap_ratio']:.2f}, {loops[name]['version_offset_mean']:.2f}",
            )
        )
    rows += [
        ("sync s/step vs generation + training + sync alone", f"{results['ratios']['sync_vs_phases']:.2f}"),
        (
            "weight sync s (loop) vs in-process floor",
            f"{sync['weight_sync_s']:.2f} vs {results['weight_sync_floor']['total_s']:.2f}",
        ),
        ("packing efficiency (real / all forwarded positions)", f"{sync['packing_efficiency']:.2f}"),
    ]
    lines = [f"`rlmesh bench` on {results['model']} ({results['machine']})", "", "| measure | value |", "|---|---|"]
    return "\n".join(lines + [f"| {name} | {value} |" for name, value in rows]) + "\n"


async def bench(config: Config) -> dict[str, Any]:
    config = resolve_config(config)
    out = Path(config.run.output_dir) / f"{config.run.name}-bench"
    out.mkdir(parents=True, exist_ok=True)
    device = config.trainer.device
    native = native_bf16(device)
    results: dict[str, Any] = {
        "model": config.model.path,
        "machine": f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start",
        "trainer_dtype": config.trainer.dtype,
        "generator_dtype": config.generator.dtype,
        "native_bf16": f"native bf16 on {device}: {'yes' if native else 'no'}",
        "loops": {},
    }
    for staleness, name in ((0, "sync"), (1, "async_1"), (2, "async_2")):
        results["loops"][name] = await run_loop(config, staleness, f"{config.run.name}-bench-{name}")
    # measured after the loops: on GPU the launcher takes a CUDA context only once the roles are gone
    results[
        "matmul_peak_gflops"
    ] = {  # bf16 without native support runs PyTorch's reference GEMM: a smaller one suffices
        name: matmul_peak_gflops(
            TORCH_DTYPES[name],
            config.trainer.cpus,
            size=(8192 if device == "cuda" else 2048) if native or name == "float32" else 512,
            device=device,
        )
        for name in dict.fromkeys(("float32", "bfloat16", config.trainer.dtype))
    }
    generator_device, generator_cpus = config.generator.device, config.generator.cpus
    results["generator_peak_gflops"] = (
        results["matmul_peak_gflops"][config.generator.dtype]
        if config.generator.dtype in results["matmul_peak_gflops"] and generator_cpus == config.trainer.cpus
        else matmul_peak_gflops(TORCH_DTYPES[config.generator.dtype], generator_cpus, device=generator_device)
    )
    results["bandwidth_gbs"] = memory_bandwidth_gbs(generator_cpus, device=generator_device)
    results["weight_sync_floor"] = weight_sync_floor(config)  # last: its in-process engine holds memory until exit
    sync = results["loops"]["sync"]
    peak = results["matmul_peak_gflops"][config.trainer.dtype]
    results["trainer_peak_fraction"] = training_peak_fraction(
        parameter_count(config), sync["train_forward_tokens_per_s"], peak
    )
    results["generation_roofline"] = generation_roofline(config, sync, results)
    results["generation_roofline_fraction"] = (
        sync["generation_tokens_per_s"] / results["generation_roofline"]["tokens_per_s"]
    )
    results["generation_work_fraction"] = phases_fraction(config, sync, results)
    for loop in results["loops"].values():  # the requests' shapes stay out of bench.json
        del loop["generation_phases"]
    results["ratios"] = {
        "async_1_vs_sync": results["loops"]["async_1"]["trained_tokens_per_s"] / sync["trained_tokens_per_s"],
        "async_2_vs_sync": results["loops"]["async_2"]["trained_tokens_per_s"] / sync["trained_tokens_per_s"],
        "sync_vs_phases": sync["s_per_step"] / (sync["generation_s"] + sync["train_s"] + sync["weight_sync_s"]),
        "weight_sync_vs_floor": sync["weight_sync_s"] / results["weight_sync_floor"]["total_s"],
    }
    results["machine"] += f", {os.getloadavg()[0]:.1f} at end"
    (out / "bench.json").write_text(json.dumps(results, indent=2))
    (out / "bench.md").write_text(table(results))
    results["out_dir"] = str(out)
    return results
