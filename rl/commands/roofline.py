"""What the machine allows each phase of the loop, from its measured matmul peak and memory bandwidth: the roofline
`rlmesh bench` holds the measured throughputs against.

A decode step of a dense transformer at batch B (B sequences, one new token each) does 2 FLOPs per parameter per
token (every weight matrix multiplies each token's activations once; a tied embedding counted once, as the lm_head
it is in the forward) and reads every weight once plus each sequence's KV cache. Its time is at least the larger of
FLOPs / matmul peak and bytes / bandwidth, so its throughput is at most B over that. Attention-score FLOPs (4 x layers
x hidden x context per token) are left out: at most 3% of 2 x parameters for the main job's model (SmolLM2-135M)
at its longest context (128 tokens).

A generation phase is more than decode steps at its full batch: its prompts are prefilled first, and its batch
shrinks as completions end, so its last steps read all the weights for a few tokens. `phase_bound` is the least
time of the work a phase did: each distinct prompt prefilled once, then each decode step at the batch still running.

Training a token costs 6 FLOPs per parameter (forward 2, backward 4), counted on the tokens actually forwarded
(a group's shared prompt once: prefix sharing).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class DecodeModel:
    """What one decode step of a model reads and computes, per the model's config and the sampler's dtype."""

    parameters: int
    """Distinct parameters (a tied embedding once)."""
    head_parameters: int
    """The lm_head's (vocabulary x hidden): a prefill runs it for each request's last prompt token only."""
    weight_bytes: int
    """Bytes of weights one forward reads: parameters x the sampler dtype's size."""
    kv_bytes_per_token: int
    """KV-cache bytes of one token of context: 2 (K, V) x layers x KV heads x head dim x dtype size."""


@dataclass(frozen=True)
class DecodeBound:
    """The roofline of a decode step at one batch size."""

    flops: float
    bytes: float
    compute_s: float
    memory_s: float

    @property
    def seconds(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def bound_by(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "bandwidth"


def decode_bound(
    model: DecodeModel, batch: int, context: float, matmul_gflops: float, bandwidth_gbs: float
) -> DecodeBound:
    """One decode step of `batch` sequences whose context averages `context` tokens."""
    flops = 2.0 * model.parameters * batch
    nbytes = model.weight_bytes + model.kv_bytes_per_token * context * batch
    return DecodeBound(flops, nbytes, flops / (matmul_gflops * 1e9), nbytes / (bandwidth_gbs * 1e9))


@dataclass(frozen=True)
class Completion:
    """One request of a generation phase: the prompt it continues (a group's samples share one) and its lengths."""

    prompt: str
    prompt_tokens: int
    completion_tokens: int


def phase_bound(
    model: DecodeModel, completions: Sequence[Completion], matmul_gflops: float, bandwidth_gbs: float
) -> float:
    """Least seconds one engine takes for a phase's work. The prefill runs each distinct prompt through the model once
    (a prefix cache serves the other samples of its group) and the lm_head once per request, for its first token: at
    the matmul peak or one read of the weights, whichever is longer. Then decode step k = 1, 2, ... runs the requests
    whose completions are longer than k, at their context (prompt + k): `decode_bound`."""
    prompts = {completion.prompt: completion.prompt_tokens for completion in completions}
    body = model.parameters - model.head_parameters
    flops = 2.0 * (body * sum(prompts.values()) + model.head_parameters * len(completions))
    seconds = max(flops / (matmul_gflops * 1e9), model.weight_bytes / (bandwidth_gbs * 1e9))
    for k in range(1, max(completion.completion_tokens for completion in completions)):
        running = [completion for completion in completions if completion.completion_tokens > k]
        context = statistics.fmean(completion.prompt_tokens + k for completion in running)
        seconds += decode_bound(model, len(running), context, matmul_gflops, bandwidth_gbs).seconds
    return seconds


def training_peak_fraction(parameters: int, forward_tokens_per_s: float, matmul_gflops: float) -> float:
    """Share of the trainer dtype's matmul peak the trainer reaches: 6 FLOPs per parameter per forwarded token."""
    return 6.0 * parameters * forward_tokens_per_s / (matmul_gflops * 1e9)


def decode_model(model_path: str, dtype_bytes: int) -> DecodeModel:
    """A Hugging Face model's `DecodeModel` (built on the meta device: no weights are read)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    parameters = sum(p.numel() for p in model.parameters())
    heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    kv = 2 * hf_config.num_hidden_layers * kv_heads * head_dim * dtype_bytes
    return DecodeModel(
        parameters=parameters,
        head_parameters=hf_config.vocab_size * hf_config.hidden_size,
        weight_bytes=parameters * dtype_bytes,
        kv_bytes_per_token=kv,
    )
