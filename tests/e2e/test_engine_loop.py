"""The generator's engine loop on a real in-process vLLM (tiny Qwen3, fp32): concurrent requests share
the engine, and a weight update while requests are in flight either lets them finish on the old
weights or restarts them on the new ones, tagging each output with the version that sampled it."""

import asyncio
import os

import pytest
import pytest_asyncio
import torch
from transformers import AutoModelForCausalLM

from actors.engine_loop import EngineLoop
from actors.generator import engine_args
from rl.assets import resolve_model_path
from rl.config import load_config
from rl.loop.resolve import resolve_config
from tests.support.inprocess_engine import werkzeug_proxies_hidden
from tests.support.paths import E2E_CONFIGS

pytestmark = [pytest.mark.asyncio(loop_scope="module")]

PROMPTS = [[151644, 872, 198, 40 + i, 151645, 198, 151644, 77091, 198] for i in range(6)]


@pytest.fixture(scope="module")
def weights():
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-qwen3"), dtype=torch.float32)
    original = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    changed = {
        name: tensor * 1.5 if name.endswith("mlp.down_proj.weight") else tensor for name, tensor in original.items()
    }
    return original, changed


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine():
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM

    generator_config = resolve_config(
        load_config(E2E_CONFIGS / "tiny_qwen3_e2e.toml", {"generator.max_model_len": "128"})
    ).generator
    with werkzeug_proxies_hidden():
        llm = LLM(model=resolve_model_path("tiny-qwen3"), **engine_args(generator_config))  # the actor's engine
    loop = EngineLoop(llm.llm_engine)
    yield llm, loop
    await loop.close()
    llm.llm_engine.engine_core.shutdown()


def greedy(max_tokens=24):
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=0, detokenize=False)


async def run(loop, prompts, max_tokens=24):
    from vllm.inputs import TokensPrompt

    results = await asyncio.gather(
        *(loop.generate(TokensPrompt(prompt_token_ids=p), greedy(max_tokens)) for p in prompts)
    )
    return [(list(output.outputs[0].token_ids), version) for output, version in results]


async def load(llm, loop, state_dict, mode, version):
    async with loop.pause(mode, version):
        await loop.call(llm.collective_rpc, "reload_weights", kwargs={"weights_iterator": list(state_dict.items())})
        await loop.call(llm.reset_prefix_cache)


async def test_concurrent_callers_share_engine_steps(engine):
    llm, loop = engine
    batch_sizes = []
    step = llm.llm_engine.step

    def counting_step():
        batch_sizes.append(llm.llm_engine.get_num_unfinished_requests())
        return step()

    llm.llm_engine.step = counting_step
    try:
        outputs = await run(loop, PROMPTS)
    finally:
        llm.llm_engine.step = step
    assert [len(tokens) for tokens, _ in outputs] == [24] * len(PROMPTS)
    assert max(batch_sizes) == len(PROMPTS)  # all six decoded together, not one after another
    assert len(batch_sizes) < 2 * 24


@pytest.mark.parametrize("mode", ["finish", "resubmit"])
async def test_weight_update_in_flight(engine, weights, mode):
    llm, loop = engine
    original, changed = weights
    await load(llm, loop, original, "finish", 0)
    old = await run(loop, PROMPTS)
    await load(llm, loop, changed, "finish", 1)
    new = await run(loop, PROMPTS)
    assert [tokens for tokens, _ in old] != [tokens for tokens, _ in new]  # the change is visible in greedy output
    await load(llm, loop, original, "finish", 0)

    in_flight = asyncio.ensure_future(run(loop, PROMPTS))
    while llm.llm_engine.get_num_unfinished_requests() < len(PROMPTS):
        await asyncio.sleep(0.001)
    await load(llm, loop, changed, mode, 1)
    late = await run(loop, PROMPTS[:2])  # submitted after the update: always the new weights
    outputs = await in_flight
    if mode == "finish":
        assert outputs == [(tokens, 0) for tokens, _ in old]
    else:
        assert outputs == [(tokens, 1) for tokens, _ in new]
    assert late == [(tokens, 1) for tokens, _ in new[:2]]


async def test_seeded_requests_whose_prompts_exceed_one_steps_token_budget(engine):
    """60 seeded requests of 100 prompt tokens (6000 > vLLM's 4096-token step budget) all complete.

    With chunked prefill (vLLM's default) a partial prefill rewinds the request's seeded generator with
    `set_offset`, which a CPU torch.Generator refuses: every request of the step failed.
    """
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    _llm, loop = engine
    prompts = [list(range(100 + i, 200 + i)) for i in range(60)]
    results = await asyncio.gather(
        *(
            loop.generate(
                TokensPrompt(prompt_token_ids=p),
                SamplingParams(temperature=1.0, max_tokens=4, seed=i, detokenize=False),
            )
            for i, p in enumerate(prompts)
        )
    )
    assert [len(output.outputs[0].token_ids) for output, _ in results] == [4] * 60
