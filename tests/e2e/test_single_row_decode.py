"""A request's logprobs do not depend on what else the engine decodes: SmolLM2 (fp32, LoRA served, as the main job's
LoRA runs) on a real in-process vLLM, one greedy request decoded alone and beside another.

oneDNN's fp32 matmul computes one row with other bits than the same row in a batch, so without the generators'
`rl.processes.single_rows` a request that decodes alone (the last of a batch, a LoRA tenant's request whose turn holds
it alone) gets other logprobs from its second token on than beside others; a tenant's run then differs from its solo
run wherever their batches differ. So did a request whose context passes 64 tokens beside others: vLLM's CPU attention
split such a context across its threads at points set by the whole batch (the generators' environment turns that off,
`actors.generator.engine_environment`)."""

import os

import pytest

from actors.generator import engine_args, engine_environment, lora_engine_args
from rl.assets import resolve_model_path
from rl.config import load_config
from rl.config.lora import LoraConfig
from rl.loop.resolve import resolve_config
from tests.support.inprocess_engine import werkzeug_proxies_hidden
from tests.support.paths import CONFIGS

PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712, 8182, 2]
OTHER = [*PROMPT[:12], 282, 216, 41, 42, *PROMPT[12:]]
TOKENS = 12
LONG = [*PROMPT, *OTHER[1:]]  # 43 tokens: decoding 30 more takes its context past 64 tokens (two 32-token blocks)


@pytest.fixture(scope="module")
def llm():
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, envs
    from vllm import _custom_ops as ops

    generator_config = resolve_config(load_config(CONFIGS / "sum_digits_smollm2_cpu.toml")).generator
    split = engine_environment(generator_config, cpus=[]).get("VLLM_CPU_ATTN_SPLIT_KV")  # the generators' attention
    onednn_mm = ops.onednn_mm
    with pytest.MonkeyPatch.context() as environment:
        if split is not None:
            environment.setenv("VLLM_CPU_ATTN_SPLIT_KV", split)
        envs.disable_envs_cache()  # an engine started before in this process froze vLLM's environment
        with werkzeug_proxies_hidden():
            llm = LLM(
                model=resolve_model_path("smollm2-135m-instruct"),
                **engine_args(generator_config),
                **lora_engine_args(LoraConfig(enabled=True, rank=16, alpha=32)),
            )
        yield llm
    envs.disable_envs_cache()
    ops.onednn_mm = onednn_mm
    llm.llm_engine.engine_core.shutdown()


def logprobs(llm, prompts: list[list[int]], of: int = 0, tokens: int = TOKENS) -> list[float]:
    """Prompt `of`'s greedy completion's logprobs (`tokens` of them), decoded beside the others."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True, logprobs=0, detokenize=False)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    sample = outputs[of].outputs[0]
    return [position[token].logprob for position, token in zip(sample.logprobs, sample.token_ids)]


def test_a_request_decoding_alone_gets_the_logprobs_it_gets_beside_another(llm):
    alone, beside = logprobs(llm, [PROMPT]), logprobs(llm, [PROMPT, OTHER])
    assert alone[0] == beside[0] and alone != beside  # oneDNN: the prompt's step agrees, the one-row decode steps not

    llm.collective_rpc("single_rows_as_in_a_batch")  # as a CPU generator does at its start
    assert logprobs(llm, [PROMPT]) == logprobs(llm, [PROMPT, OTHER]) == beside  # a batch's bits, alone too


def test_a_request_past_64_tokens_of_context_gets_the_logprobs_alone_it_gets_after_another(llm):
    llm.collective_rpc("single_rows_as_in_a_batch")  # as a CPU generator does at its start
    alone = logprobs(llm, [LONG], tokens=30)
    # split across threads (vLLM's default), LONG after each of these differed from its 23rd token on (65 tokens of context)
    for other in (PROMPT[:1], PROMPT[:6], PROMPT, OTHER):
        assert logprobs(llm, [other, LONG], of=1, tokens=30) == alone, len(other)
