"""Prefix-shared training refuses models whose layers ignore the tree mask, read from transformers'
own configs of each family: linear attention and gated delta nets, Mamba and other state-space layers, RWKV,
short convolutions; softmax-attention models (sliding windows included) pass."""

import pytest
import transformers

from rl.packing.attention_kinds import non_softmax_layers, prefix_sharing_refusal

RECURRENT = [
    "Qwen3NextConfig",  # gated delta net + full attention, layer_types
    "Qwen3_5TextConfig",
    "MambaConfig",
    "Mamba2Config",
    "JambaConfig",
    "BambaConfig",
    "Zamba2Config",
    "FalconH1Config",
    "NemotronHConfig",
    "GraniteMoeHybridConfig",
    "RecurrentGemmaConfig",
    "RwkvConfig",
    "Lfm2Config",
    "MiniMaxConfig",
]
SOFTMAX = ["Qwen3Config", "LlamaConfig", "Qwen2Config", "Gemma3TextConfig", "GptOssConfig", "SmolLM3Config"]


@pytest.mark.parametrize("name", RECURRENT)
def test_recurrent_layers_are_refused_naming_the_setting(name):
    config = getattr(transformers, name)().to_dict()
    refusal = prefix_sharing_refusal(config, "org/model")
    assert refusal is not None and "Set trainer.prefix_sharing = false" in refusal and "'org/model'" in refusal


@pytest.mark.parametrize("name", SOFTMAX)
def test_softmax_attention_passes(name):
    assert prefix_sharing_refusal(getattr(transformers, name)().to_dict(), "org/model") is None


def test_a_multimodal_text_config_and_a_hybrid_pattern_are_read():
    text = transformers.Qwen3NextConfig().to_dict()
    assert "linear_attention" in non_softmax_layers({"model_type": "some_vlm", "text_config": text})
    assert "Mamba layers" in non_softmax_layers({"model_type": "custom", "hybrid_override_pattern": "M-M*-"})
    assert non_softmax_layers({"model_type": "custom", "hybrid_override_pattern": "*-*-"}) is None
