"""The LoRA scale alpha / rank where the trainer, the generators' adapter folders and the export each apply it, against
W x + (alpha / rank) B A x written out by hand, with alpha != 2 x rank (the shipped configs' ratio, under which a
scale of 2 taken for alpha / rank, or rank / alpha taken for it, would go unnoticed)."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from rl.assets import resolve_model_path
from rl.config.lora import LoraConfig
from rl.training.lora import with_adapters
from rl.weights.adapter import AdapterFolders

RANK = 4
LAYER = "model.layers.1.self_attn.q_proj"


def adapted(alpha: float) -> torch.nn.Module:
    """The tiny Qwen3 with adapters on q_proj and down_proj, A and B random (fresh adapters have B = 0)."""
    base = resolve_model_path("tiny-qwen3")
    lora = LoraConfig(enabled=True, rank=RANK, alpha=alpha, target_modules=["q_proj", "down_proj"])
    model = with_adapters(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), lora)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator))
    return model.eval()


def by_hand(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`LAYER`'s base weight W [out, in], A [r, in] and B [out, r], as plain tensors."""
    layer = model.get_submodule(f"base_model.model.{LAYER}")
    return (
        layer.base_layer.weight.detach().clone(),
        layer.lora_A["default"].weight.detach().clone(),
        layer.lora_B["default"].weight.detach().clone(),
    )


@pytest.mark.parametrize("alpha", [float(RANK), 3.0], ids=["alpha=rank", "alpha=3,rank=4"])
def test_the_adapter_adds_alpha_over_rank_times_b_a_x_in_the_trainer_and_in_the_merge(alpha):
    model = adapted(alpha)
    weight, a, b = by_hand(model)
    scale = alpha / RANK  # 1.0 and 0.75: neither is 2
    x = torch.randn(3, weight.shape[1], generator=torch.Generator().manual_seed(1))  # [tokens, in]
    expected = x @ weight.T + scale * (x @ a.T) @ b.T  # [tokens, out]
    with torch.no_grad():
        trained = model.get_submodule(f"base_model.model.{LAYER}")(x)
    torch.testing.assert_close(trained, expected, rtol=1e-5, atol=1e-5)
    assert (expected - x @ weight.T).abs().max() > 1e-2  # the adapter's term is not negligible
    merged = model.merge_and_unload().get_submodule(LAYER).weight.detach()  # what rlmesh export writes
    torch.testing.assert_close(merged, weight + scale * b @ a, rtol=1e-6, atol=1e-6)


def test_the_generators_adapter_folder_gives_vllm_alpha_and_rank_and_the_attestation_their_ratio():
    lora = LoraConfig(enabled=True, rank=RANK, alpha=3.0, target_modules=["q_proj"])
    folders = AdapterFolders(lora, str(resolve_model_path("tiny-qwen3")))
    try:
        assert folders.scaling == 0.75  # vLLM stores B x alpha / rank; the attestation divides it back out
        written = json.loads((folders.write(1, {}) / "adapter_config.json").read_text())
        assert (written["r"], written["lora_alpha"]) == (RANK, 3.0)  # what vLLM computes its scale from
    finally:
        folders.close()
