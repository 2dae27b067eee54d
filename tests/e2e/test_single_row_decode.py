"""A request's logprobs do not depend on what else the engine decodes: SmolLM2 (fp32, LoRA served, as the main job's
LoRA runs) on a real in-process vLLM, one greedy request decoded alone and beside another.

oneDNN's fp32 matmul computes one row with other bits than the same row in a batch, so without the generators'
`rl.processes.single_rows` a request that decodes alone (the last of a batch, a LoRA tenant's request whose turn holds
it alone) gets other logprobs from its second token on than beside others; a tenant's run then differs from its solo
run wherever their batches differ."""

import os

import pytest

from actors.generator import engine_args, lora_engine_args
from rl.assets import resolve_model_path
from rl.config import load_config
from rl.config.lora import LoraConfig
from rl.loop.resolve import resolve_config
from tests.support.inprocess_engine import werkzeug_proxies_hidden
from tests.support.paths import CONFIGS

PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712, 8182, 2]
OTHER = [*PROMPT[:12], 282, 216, 41, 42, *PROMPT[12:]]
TOKENS = 12


@pytest.fixture(scope="module")
def llm():
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM
    from vllm import _custom_ops as ops

    generator_config = resolve_config(load_config(CONFIGS / "sum_digits_smollm2_cpu.toml")).generator
    onednn_mm = ops.onednn_mm
    with werkzeug_proxies_hidden():
        llm = LLM(
            model=resolve_model_path("smollm2-135m-instruct"),
            **engine_args(generator_config),
            **lora_engine_args(LoraConfig(enabled=True, rank=16, alpha=32)),
        )
    yield llm
    ops.onednn_mm = onednn_mm
    llm.llm_engine.engine_core.shutdown()


def logprobs(llm, prompts: list[list[int]]) -> list[float]:
    """The first prompt's greedy completion's logprobs, decoded beside the others."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True, logprobs=0, detokenize=False)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    sample = outputs[0].outputs[0]
    return [position[token].logprob for position, token in zip(sample.logprobs, sample.token_ids)]


def test_a_request_decoding_alone_gets_the_logprobs_it_gets_beside_another(llm):
    alone, beside = logprobs(llm, [PROMPT]), logprobs(llm, [PROMPT, OTHER])
    assert alone[0] == beside[0] and alone != beside  # oneDNN: the prompt's step agrees, the one-row decode steps not

    llm.collective_rpc("single_rows_as_in_a_batch")  # as a CPU generator does at its start
    assert logprobs(llm, [PROMPT]) == logprobs(llm, [PROMPT, OTHER]) == beside  # a batch's bits, alone too
