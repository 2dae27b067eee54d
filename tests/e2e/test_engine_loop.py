"""The generator's engine loop on a real in-process vLLM (tiny Qwen3, fp32): concurrent requests share
the engine, and a weight update while requests are in flight either lets them finish on the old
weights, restarts them on the new ones, or continues them on the new ones from the tokens they sampled,
tagging each token with the version that sampled it."""

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
from tests.support.inprocess_engine import step_sizes, werkzeug_proxies_hidden
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
    return [(list(result.output.outputs[0].token_ids), result.version) for result in results]


async def load(llm, loop, state_dict, mode, version):
    async with loop.pause(mode, version):
        await loop.call(llm.collective_rpc, "reload_weights", kwargs={"weights_iterator": list(state_dict.items())})
        await loop.call(llm.reset_prefix_cache)


async def test_a_pinned_generators_engine_thread_steps_at_its_thread_count(engine):
    """A generator pinned to one core sets torch's thread count to 1 (`rl.processes.affinity`); its engine thread must
    plan and run vLLM's CPU attention at that count from its first step (else: "Check failed: ... (2 vs. 1)")."""
    llm, _ = engine
    threads = torch.get_num_threads()
    torch._C.set_num_threads(1)  # what pinning does (the engine's worker made `torch.set_num_threads` a no-op since)
    pinned = EngineLoop(llm.llm_engine)
    try:
        outputs = await run(pinned, PROMPTS[:2])  # its thread's first steps: nothing of torch's ran there before
        assert await pinned.call(torch.get_num_threads) == 1
    finally:
        await pinned.close()
        torch._C.set_num_threads(threads)
    assert [len(tokens) for tokens, _ in outputs] == [24, 24]


async def test_concurrent_callers_share_engine_steps(engine):
    llm, loop = engine
    with step_sizes(llm) as batch_sizes:
        outputs = await run(loop, PROMPTS)
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
    assert [len(result.output.outputs[0].token_ids) for result in results] == [4] * 60


async def greedy_after(loop, prefixes, max_tokens):
    """Greedy continuations of each prompt + kept tokens, `max_tokens` each: what a continued request must sample."""
    from vllm.inputs import TokensPrompt

    results = await asyncio.gather(
        *(
            loop.generate(TokensPrompt(prompt_token_ids=prefix), greedy(budget))
            for prefix, budget in zip(prefixes, max_tokens)
        )
    )
    return [list(result.output.outputs[0].token_ids) for result in results]


async def test_continue_keeps_the_sampled_tokens_across_two_updates_and_labels_each_with_its_version(engine, weights):
    """Requests in flight across two weight updates (staleness 2: versions 0, 1 and 2 sample one completion) keep every
    token they sampled: each completion is the old weights' greedy tokens up to the first pause, then the new
    weights' greedy continuation of the prompt plus those tokens, and so on; no token is sampled twice, the
    completions are exactly `max_tokens` long and the version of every token is the one whose weights chose it."""
    from vllm.inputs import TokensPrompt

    llm, loop = engine
    original, changed = weights
    third = {name: tensor * 0.5 if name.endswith("mlp.up_proj.weight") else tensor for name, tensor in changed.items()}
    await load(llm, loop, original, "finish", 0)

    def sampled() -> list[int]:
        return [
            len(request.latest.outputs[0].token_ids) if request.latest else 0 for request in loop._requests.values()
        ]

    in_flight = asyncio.ensure_future(
        asyncio.gather(*(loop.generate(TokensPrompt(prompt_token_ids=p), greedy(40)) for p in PROMPTS))
    )
    while min(sampled(), default=0) < 3:  # every request has sampled a few tokens under version 0
        await asyncio.sleep(0.001)
    await load(llm, loop, changed, "continue", 1)
    while min(sampled(), default=0) < 3:  # and a few more under version 1
        await asyncio.sleep(0.001)
    await load(llm, loop, third, "continue", 2)
    results = await in_flight

    switches = []
    for prompt, result in zip(PROMPTS, results):
        tokens, versions = list(result.output.outputs[0].token_ids), result.token_versions
        assert len(tokens) == len(versions) == 40 and result.version == 2
        assert versions == sorted(versions) and set(versions) == {0, 1, 2}  # each version sampled a contiguous run
        assert len(result.output.outputs[0].logprobs) == 40
        assert result.output.prompt_token_ids == prompt
        switches.append((versions.index(1), versions.index(2)))
    # replay each segment from scratch under its own weights: the same tokens, so none was resampled or lost
    await load(llm, loop, original, "finish", 0)
    completions = [list(result.output.outputs[0].token_ids) for result in results]
    first = await greedy_after(loop, PROMPTS, [one for one, _ in switches])
    await load(llm, loop, changed, "finish", 1)
    second = await greedy_after(
        loop, [p + c[:one] for p, c, (one, _) in zip(PROMPTS, completions, switches)], [b - a for a, b in switches]
    )
    await load(llm, loop, third, "finish", 2)
    last = await greedy_after(
        loop, [p + c[:two] for p, c, (_, two) in zip(PROMPTS, completions, switches)], [40 - b for _, b in switches]
    )
    assert completions == [a + b + c for a, b, c in zip(first, second, last)]
    await load(llm, loop, original, "finish", 0)
