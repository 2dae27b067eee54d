"""A request without an adapter gets the base model's logprobs however the tenants' adapters fill vLLM's slots, also in
a step beside a request through an adapter: a real in-process vLLM (tiny Qwen3, fp32) with the LoRA settings of a
two-tenant generator (`lora_engine_args(lora, 2)`).

vLLM's CPU LoRA ops give a row without an adapter the slot index -1, which selects the last slot of the stacked adapter
weights (a step with no adapter row skips the LoRA ops); a removed adapter's slot keeps its weights. The tenants' syncs
(load the new version, then drop the old) fill vLLM's first free slots, so the engine keeps one slot more than the
adapters ever loaded at once: the last is never filled, and a request still on the base model (a tenant before its
first sync) is never served another tenant's adapter, whatever it shares a step with."""

import pytest
import torch
from peft import LoraConfig as PeftLoraConfig
from peft import get_peft_model
from transformers import AutoModelForCausalLM

from rl.assets import resolve_model_path
from rl.config.lora import LoraConfig
from tests.support.inprocess_engine import tiny_lora_llm

RANK, ALPHA = 8, 16
TENANTS = 2
PROMPT = [151644, 872, 198, 40, 151645, 198, 151644, 77091, 198]
OTHER = [151644, 872, 198, 41, 151645, 198, 151644, 77091, 198]
TOKENS = 8


def random_adapter(folder, seed: int) -> str:
    """A random adapter on every linear layer (B nonzero: it changes every logprob), saved as peft writes it."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-qwen3"), dtype=torch.float32)
    config = PeftLoraConfig(
        r=RANK, lora_alpha=ALPHA, target_modules=LoraConfig(enabled=True).target_modules, init_lora_weights=False
    )
    get_peft_model(model, config).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def llm():
    llm = tiny_lora_llm(RANK, ALPHA, TENANTS)
    yield llm
    llm.llm_engine.engine_core.shutdown()


def first_logprobs(llm, adapters: list) -> list[float]:
    """`PROMPT`'s greedy completion's logprobs, `PROMPT` through `adapters[0]` and `OTHER` through `adapters[1]` (None:
    without an adapter) decoded in the same steps (a step with no adapter row skips the LoRA ops)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True, logprobs=0, detokenize=False)
    prompts = [TokensPrompt(prompt_token_ids=PROMPT), TokensPrompt(prompt_token_ids=OTHER)]
    outputs = llm.generate(prompts, params, lora_request=adapters, use_tqdm=False)
    sample = outputs[0].outputs[0]
    return [position[token].logprob for position, token in zip(sample.logprobs, sample.token_ids)]


def test_a_request_without_an_adapter_is_served_the_base_model_while_the_tenants_sync(llm, tmp_path):
    from vllm.lora.request import LoRARequest

    engine = llm.llm_engine
    base = first_logprobs(llm, [None, None])
    served = {}  # tenant -> its adapter on the engine
    # two syncs of each tenant, as `TenantGenerator.update_weights` loads them: the new version, then the old one out
    for version in (1, 2):
        for index in range(TENANTS):
            tenant = f"tenant{index}"
            folder = random_adapter(tmp_path / f"{tenant}-v{version}", seed=10 * version + index)
            adapter = LoRARequest(f"{tenant}-v{version}", 100 * index + version, folder)
            engine.add_lora(adapter)
            if tenant in served:
                engine.remove_lora(served[tenant].lora_int_id)
            served[tenant] = adapter
            llm.reset_prefix_cache()
            for other in served.values():
                assert first_logprobs(llm, [None, other]) == base, f"beside {other.lora_name}, {adapter.lora_name} in"
    assert set(engine.list_loras()) == {adapter.lora_int_id for adapter in served.values()}
    through_adapter = first_logprobs(llm, [served["tenant0"], served["tenant0"]])
    assert max(abs(a - b) for a, b in zip(through_adapter, base)) > 1e-3  # an adapter served would show
