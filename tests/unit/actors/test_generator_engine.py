"""How the generator starts vLLM: worker processes spawned (never forked from Monarch's runtime), tensor-parallel CPU
workers each bound to its own cores, every worker able to load weights by handle; and how it asks the engine for a
prompt's logprobs."""

import os
from types import SimpleNamespace

import pytest

from actors.generator import engine_args, engine_environment
from rl.config import load_config
from rl.weights import vllm_worker
from tests.support.paths import TINY


def test_one_worker_runs_in_process_and_any_worker_process_is_spawned():
    generator = load_config(TINY).generator
    env = engine_environment(generator, cpus=[])
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in env
    assert engine_environment(generator, cpus=[1])["VLLM_CPU_OMP_THREADS_BIND"] == "1"


def test_tensor_parallel_cpu_workers_run_in_engine_processes_each_on_its_own_cores():
    generator = load_config(TINY, {"generator.tensor_parallel_size": "2"}).generator
    assert engine_environment(generator, cpus=[4, 5, 6, 7]) == {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_ATTN_SPLIT_KV": "0",
        "TORCHDYNAMO_DISABLE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "4,5|6,7",
    }
    cores = sorted(os.sched_getaffinity(0))
    half = len(cores) // 2
    assert engine_environment(generator, cpus=[])["VLLM_CPU_OMP_THREADS_BIND"] == "|".join(
        ",".join(map(str, part)) for part in (cores[:half], cores[half : 2 * half])
    )


def test_an_eager_cpu_engine_and_its_workers_run_without_dynamo_and_a_compiled_one_keeps_it():
    assert engine_environment(load_config(TINY).generator, cpus=[])["TORCHDYNAMO_DISABLE"] == "1"
    compiled = load_config(TINY, {"generator.enforce_eager": "false"}).generator
    assert "TORCHDYNAMO_DISABLE" not in engine_environment(compiled, cpus=[])


def test_a_compiled_cpu_engine_compiles_without_vllms_aot_cache_which_cannot_load_on_cpu():
    # vLLM saves the compiled model but its CPU load fails, so every start compiled again; inductor's cache serves it
    compiled = load_config(TINY, {"generator.enforce_eager": "false"}).generator
    assert engine_environment(compiled, cpus=[])["VLLM_USE_AOT_COMPILE"] == "0"
    assert "VLLM_USE_AOT_COMPILE" not in engine_environment(load_config(TINY).generator, cpus=[])  # eager: no compile
    gpu = load_config(
        TINY, {"generator.device": "cuda", "trainer.device": "cuda", "generator.enforce_eager": "false"}
    ).generator
    assert "VLLM_USE_AOT_COMPILE" not in engine_environment(gpu, cpus=[])  # GPU: vLLM compiles with its own backend


def test_every_worker_gets_the_weight_loader():
    from vllm.utils.import_utils import resolve_obj_by_qualname

    args = engine_args(load_config(TINY).generator)
    assert args["worker_extension_cls"] == vllm_worker.QUALNAME
    assert resolve_obj_by_qualname(args["worker_extension_cls"]) is vllm_worker.WeightLoader


def test_cpu_engines_share_a_groups_prompt_in_blocks_that_short_prompts_fill():
    # vLLM's CPU default block (128 tokens) is longer than the main job's ~48-token prompts: no prefix-cache hit ever
    assert engine_args(load_config(TINY).generator)["block_size"] == 32
    assert engine_args(load_config(TINY, {"generator.block_size": "64"}).generator)["block_size"] == 64
    gpu = load_config(TINY, {"generator.device": "cuda", "trainer.device": "cuda"}).generator
    assert engine_args(gpu)["block_size"] is None  # vLLM's choice


def test_user_stop_tokens_join_the_renderers_end_of_turn_tokens():
    from actors.generator import sampling_params
    from rollouts.types import GenerationRequest

    config = load_config(TINY, {"generator.sampling.stop_token_ids": "[42, 151645]"})
    request = GenerationRequest(prompt_token_ids=[1, 2], max_new_tokens=5, seed=3)
    params = sampling_params(config.generator.sampling, request, [151643, 151645])
    assert params.stop_token_ids == [42, 151643, 151645]
    assert sampling_params(load_config(TINY).generator.sampling, request, [151645]).stop_token_ids == [151645]


@pytest.mark.asyncio
@pytest.mark.parametrize("lora_config", [None, object()])
async def test_the_generator_scores_a_prompt_in_a_step_of_its_own_only_through_adapters(lora_config):
    """vLLM maps adapters to logits one row per request: prompt logprobs through one need a step to themselves."""
    from actors.generator import Generator

    calls = []

    async def generate(prompt, params, lane=None, alone=False):
        calls.append(alone)
        logprobs = [None] + [{token: SimpleNamespace(logprob=-1.0)} for token in prompt["prompt_token_ids"][1:]]
        return SimpleNamespace(output=SimpleNamespace(prompt_logprobs=logprobs))

    llm = SimpleNamespace(llm_engine=SimpleNamespace(vllm_config=SimpleNamespace(lora_config=lora_config)))
    generator = SimpleNamespace(llm=llm, engine=SimpleNamespace(generate=generate))
    assert await Generator._prompt_logprobs(generator, [5, 6, 7]) == [0.0, -1.0, -1.0]
    assert calls == [lora_config is not None]
