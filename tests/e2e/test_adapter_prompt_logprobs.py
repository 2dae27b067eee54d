"""Prompt logprobs through a LoRA adapter on a real in-process vLLM (tiny Qwen3, fp32) while other requests decode.

vLLM maps adapters to logits one row per request in the step, so a request scoring its prompt tokens through an adapter
in a step that holds other requests fails the step (an `einsum` size mismatch in the CPU `bgmv` ops), and every
request in it with it. The generator's adapter sync check and distillation's teacher scores ask for such logprobs while
rollouts decode; the engine loop gives them a step of their own (`alone`). The logprobs are checked against the adapter
applied by peft to the Hugging Face model."""

import asyncio

import pytest
import pytest_asyncio
import torch
from peft import LoraConfig as PeftLoraConfig
from peft import get_peft_model
from transformers import AutoModelForCausalLM

from actors.engine_loop import EngineLoop
from rl.assets import resolve_model_path
from rl.config.lora import LoraConfig
from rl.loop.roles import SYNC_PROBE
from tests.support.inprocess_engine import step_sizes, tiny_lora_llm

pytestmark = [pytest.mark.asyncio(loop_scope="module")]

RANK, ALPHA = 8, 16
PROMPTS = [[151644, 872, 198, 40 + i, 151645, 198, 151644, 77091, 198] for i in range(8)]


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    """A random adapter on every linear layer (B nonzero, so it changes every logprob), saved as peft writes it, and
    the probe's logprobs under it computed by peft on the Hugging Face model."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-qwen3"), dtype=torch.float32)
    config = PeftLoraConfig(
        r=RANK, lora_alpha=ALPHA, target_modules=LoraConfig(enabled=True).target_modules, init_lora_weights=False
    )
    peft_model = get_peft_model(model, config)
    folder = tmp_path_factory.mktemp("adapter")
    peft_model.save_pretrained(folder)
    with torch.no_grad():
        logits = peft_model(torch.tensor([SYNC_PROBE])).logits[0, :-1]  # [63, vocab]
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(SYNC_PROBE[1:])[:, None])[:, 0]
    return str(folder), [0.0, *expected.tolist()]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine():
    llm = tiny_lora_llm(RANK, ALPHA)
    loop = EngineLoop(llm.llm_engine)
    yield llm, loop
    await loop.close()
    llm.llm_engine.engine_core.shutdown()


async def prompt_logprobs(loop: EngineLoop, alone: bool) -> list[float]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
    output = (await loop.generate(TokensPrompt(prompt_token_ids=SYNC_PROBE), params, alone=alone)).output
    return [0.0] + [position[token].logprob for position, token in zip(output.prompt_logprobs[1:], SYNC_PROBE[1:])]


async def decoding(loop: EngineLoop, batch_sizes: list[int]) -> asyncio.Future:
    """Eight requests through the adapter, on the engine and decoding when this returns."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True, detokenize=False)
    requests = asyncio.gather(*(loop.generate(TokensPrompt(prompt_token_ids=p), params) for p in PROMPTS))
    while not batch_sizes:
        await asyncio.sleep(0.01)
    return requests


async def serve(llm, loop, folder):
    from vllm.lora.request import LoRARequest

    adapter = LoRARequest("policy-v1", 1, folder)
    async with loop.pause("finish", 1, adapter):
        await loop.call(llm.llm_engine.add_lora, adapter)
    return adapter


async def test_prompt_logprobs_through_an_adapter_get_a_step_of_their_own_while_other_requests_decode(engine, adapter):
    llm, loop = engine
    folder, expected = adapter
    await serve(llm, loop, folder)
    alone = await prompt_logprobs(loop, alone=True)

    with step_sizes(llm) as batch_sizes:
        others = await decoding(loop, batch_sizes)
        beside_others = await asyncio.wait_for(prompt_logprobs(loop, alone=True), 120)
        finished = await asyncio.wait_for(others, 120)

    assert max(abs(a - b) for a, b in zip(alone, expected)) < 1e-4  # the adapter is applied, as peft applies it
    assert beside_others == alone
    assert [len(result.output.outputs[0].token_ids) for result in finished] == [48] * len(PROMPTS)
    assert batch_sizes[-1] == 1  # the probe waited for the decoding requests, then had its step to itself
    assert max(batch_sizes) == len(PROMPTS)  # while they shared their steps among themselves


async def test_without_a_step_of_their_own_vllm_fails_the_whole_step(engine, adapter):
    """The defect the step of their own avoids (should vLLM fix it, `alone` can go)."""
    llm, loop = engine
    with step_sizes(llm) as batch_sizes:
        others = await decoding(loop, batch_sizes)
        with pytest.raises(RuntimeError, match="einsum"):
            await asyncio.wait_for(prompt_logprobs(loop, alone=False), 120)
        with pytest.raises(RuntimeError, match="einsum"):  # the decoding requests fail with the probe's step
            await asyncio.wait_for(others, 120)
