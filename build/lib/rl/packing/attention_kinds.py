"""Which models prefix-shared packing is exact for, read from their Hugging Face config.

A prefix tree (`rl.packing.prefix_tree`) is exact because softmax attention reads the tree mask: each token attends
to its own prefix only. Layers that carry a recurrent state instead (linear attention and gated delta nets as in
Qwen3-Next / Qwen3.5, Mamba and other state-space layers, RWKV, short convolutions as in LFM2) run along the row and
ignore the mask, so one sample's state would flow into the next sample's tokens. Such models are refused.
"""

from __future__ import annotations

from typing import Any

MASKED_LAYER_TYPES = frozenset(
    {"full_attention", "attention", "sliding_attention", "chunked_attention", "global", "local", "mlp", "moe"}
)
"""Per-layer kinds (`layer_types`, `layers_block_type`, `block_types`) that read the mask: softmax attention, and the
feed-forward blocks some hybrids list as layers of their own (they carry nothing from token to token)."""

RECURRENT_MODEL_TYPES = frozenset(
    {
        "mamba",
        "mamba2",
        "falcon_mamba",
        "jamba",
        "bamba",
        "zamba",
        "zamba2",
        "falcon_h1",
        "nemotron_h",
        "granitemoehybrid",
        "rwkv",
        "recurrent_gemma",
        "xlstm",
        "qwen3_next",
        "lfm2",
        "lfm2_moe",
        "minimax",
        "plamo2",
    }
)
"""`model_type`s whose layers (all or some) are not softmax attention, whatever their per-layer fields say."""

_LAYER_KIND_FIELDS = ("layer_types", "layers_block_type", "block_types")


def non_softmax_layers(hf_config: dict[str, Any]) -> str | None:
    """Why a model (its `config.json` as a dict; a multimodal model's `text_config` too) has layers that do not
    attend through a mask, or None when every layer is softmax attention."""
    for config in (hf_config, hf_config.get("text_config") or {}):
        model_type = config.get("model_type")
        for field in _LAYER_KIND_FIELDS:
            kinds = config.get(field)
            if isinstance(kinds, list):
                other = sorted({str(kind) for kind in kinds} - MASKED_LAYER_TYPES)
                if other:
                    return f"its {field} include {other} (not softmax attention)"
        pattern = config.get("hybrid_override_pattern")
        if isinstance(pattern, str) and "M" in pattern:
            return f"its hybrid_override_pattern {pattern!r} has Mamba layers (M)"
        if model_type in RECURRENT_MODEL_TYPES:
            return f"model_type {model_type!r} has recurrent (linear-attention or state-space) layers"
        for architecture in config.get("architectures") or []:
            if any(word in architecture for word in ("Mamba", "Rwkv", "RWKV", "RecurrentGemma", "xLSTM")):
                return f"its architecture {architecture} has recurrent (state-space) layers"
    return None


def prefix_sharing_refusal(hf_config: dict[str, Any], model: str) -> str | None:
    """The error for prefix-shared training of `model`, or None when its attention reads the tree mask."""
    reason = non_softmax_layers(hf_config)
    if reason is None:
        return None
    return (
        f"model.path {model!r}: {reason}; such layers ignore the prefix tree's attention mask, so samples packed "
        "into one row would leak into each other. Set trainer.prefix_sharing = false"
    )
