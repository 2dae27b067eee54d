"""`[trainer.lora]`: train low-rank adapters on the frozen base model and sync only them to the generators."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from rl.config.section import Section

LLAMA_QWEN3_LINEAR_LAYERS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Every linear layer of a decoder block in Llama (SmolLM2) and Qwen3: the attention and MLP projections."""

VLLM_MAX_LORA_RANK = 512
"""The largest adapter rank vLLM serves (`max_lora_rank`)."""


class LoraConfig(Section):
    """LoRA (Hu et al. 2021) through peft: the trainer optimizes only the adapters (base weights frozen), each weight sync
    carries only the adapters, and the generators serve them with vLLM's LoRA support."""

    enabled: bool = False
    """Train adapters instead of every parameter. A section that sets other keys must set this too (either way): the
    settings alone are refused, as they would silently do nothing."""
    rank: int = Field(16, ge=1, le=VLLM_MAX_LORA_RANK)
    """Rank r of each adapter's A (r x in) and B (out x r) matrices; vLLM serves ranks up to 512."""
    alpha: float = Field(32.0, gt=0)
    """Scale: an adapter adds (alpha / rank) * B A x to its layer's output."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapters' input in the trainer's forward passes of a step. Above 0 those see a noisy policy, not
    the sampler's: the importance ratios no longer start at exactly 1, so the run resolves decoupled mode with token IS
    (a sampler gap: docs/algorithms.md). 0 keeps training on-policy."""
    target_modules: list[str] = Field(default_factory=lambda: list(LLAMA_QWEN3_LINEAR_LAYERS), min_length=1)
    """Names (last component) of the linear layers that get adapters; the default covers the attention and MLP
    projections of Llama (SmolLM2) and Qwen3, all of which vLLM serves adapters on."""
    sync_check_tolerance: float = Field(1e-3, gt=0)
    """After each adapter sync, every generator's logprobs of a fixed 64-token probe must be within this of the
    trainer's, else the run stops naming the generator (an adapter that did not reach it, or is not applied). An fp32
    generator measures ~1e-6; raise it for a generator in a lower dtype than the trainer's weights."""

    @model_validator(mode="after")
    def _settings_need_a_choice(self) -> LoraConfig:
        """Adapter settings without `enabled` are refused, naming them: LoRA is off by default, so they would do
        nothing while every parameter trains (the memory, the sync size and the export all change with the choice)."""
        settings = sorted(self.model_fields_set - {"enabled"})
        if settings and "enabled" not in self.model_fields_set:
            raise ValueError(
                f"sets {', '.join(settings)} but not enabled: LoRA is off unless enabled = true, so every parameter "
                "would train. Add enabled = true to train adapters (enabled = false keeps the settings with LoRA off)"
            )
        return self

    @field_validator("target_modules")
    @classmethod
    def _distinct_names(cls, names: list[str]) -> list[str]:
        if len(set(names)) != len(names) or any(not name or "." in name for name in names):
            raise ValueError("distinct layer names without dots (e.g. 'q_proj')")
        return names
