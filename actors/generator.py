"""Generator: a vLLM engine inside a Monarch actor, token-in/token-out, reloading weights in place.

The engine runs in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) so the actor's process owns
it. Completions carry the policy version of the weights that produced them; after
`update_weights(v)` every later completion says `v`.
"""

from __future__ import annotations

import gc
import os
import time
from typing import Any

import torch
from monarch.actor import Actor, endpoint

from env_types.renderer_env import Completion, GenerationRequest
from rl import weight_sync
from rl.assets import resolve_model_path
from rl.config import Config, SamplingConfig


class Generator(Actor):
    """One vLLM engine serving one copy of the policy."""

    def __init__(self, config: Config, stop_token_ids: list[int]):
        if config.generator.tensor_parallel_size == 1:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        if config.generator.device == "cpu":
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(config.generator.cpu_kv_cache_gib))
        from vllm import LLM

        generator_config = config.generator
        self.stop_token_ids = stop_token_ids
        self.policy_version = 0
        self.llm = LLM(
            model=resolve_model_path(config.model.path),
            skip_tokenizer_init=True,
            dtype=generator_config.dtype,
            enforce_eager=generator_config.enforce_eager,
            max_model_len=generator_config.max_model_len,
            max_num_seqs=generator_config.max_num_seqs,
            tensor_parallel_size=generator_config.tensor_parallel_size,
            gpu_memory_utilization=generator_config.gpu_memory_utilization,
            seed=generator_config.seed,
        )

    def _sampling_params(self, sampling: SamplingConfig, request: GenerationRequest) -> Any:
        from vllm import SamplingParams

        return SamplingParams(
            n=1,
            seed=request.seed,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            max_tokens=request.max_new_tokens,
            stop_token_ids=self.stop_token_ids,
            logprobs=0,
            detokenize=False,
        )

    def _generate(self, requests: list[GenerationRequest], sampling: SamplingConfig) -> list[Completion]:
        from vllm.inputs import TokensPrompt

        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=request.prompt_token_ids) for request in requests],
            sampling_params=[self._sampling_params(sampling, request) for request in requests],
            use_tqdm=False,
        )
        completions = []
        for output in outputs:
            sample = output.outputs[0]
            token_ids = list(sample.token_ids)
            logprobs = [position[token_id].logprob for position, token_id in zip(sample.logprobs, token_ids)]
            completions.append(
                Completion(
                    token_ids=token_ids,
                    logprobs=logprobs,
                    finish_reason=sample.finish_reason or "abort",
                    policy_version=self.policy_version,
                )
            )
        return completions

    @endpoint
    async def generate(self, requests: list[GenerationRequest], sampling: SamplingConfig) -> list[Completion | str]:
        """One completion per request; a request the engine rejects yields its error text instead.

        The batch goes to vLLM in one call; if that call fails, requests are retried one by one
        so a single bad request cannot fail the others.
        """
        try:
            return list(self._generate(requests, sampling))
        except Exception:
            results: list[Completion | str] = []
            for request in requests:
                try:
                    results.extend(self._generate([request], sampling))
                except Exception as exc:
                    results.append(f"generation failed: {exc!r}")
            return results

    @endpoint
    async def update_weights(self, policy_version: int) -> float:
        """Pull `policy_version` from torchstore and reload it in place; returns seconds spent."""
        start = time.perf_counter()
        state_dict = await weight_sync.pull_state_dict(policy_version)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(state_dict.items())})
        self.llm.reset_prefix_cache()
        self.policy_version = policy_version
        return time.perf_counter() - start

    @endpoint
    async def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        """Logprob of each token given its prefix under the loaded weights (position 0 gets 0.0)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        output = self.llm.generate([TokensPrompt(prompt_token_ids=token_ids)], sampling_params=params, use_tqdm=False)[0]
        return [0.0] + [position[token_id].logprob for position, token_id in zip(output.prompt_logprobs[1:], token_ids[1:])]

    @endpoint
    async def version(self) -> int:
        return self.policy_version

    @endpoint
    async def shutdown(self) -> None:
        """Free the engine before the process is stopped, so teardown stays within Monarch's deadline."""
        self.llm.llm_engine.engine_core.shutdown()
        del self.llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
