"""LoRA through peft: the trainer's policy as adapters on a frozen base, and the adapter tensors a sync carries.

The same `peft.LoraConfig` describes the adapters everywhere: the trainer wraps its model with it, the generators
write it beside each synced version (vLLM loads adapters from PEFT folders), and `rlmesh export` saves it with the
adapter. Tensor names are PEFT's saved names (`base_model.model.<layer>.lora_A.weight`), the ones vLLM reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rl.config.lora import LoraConfig

if TYPE_CHECKING:
    import peft
    import torch


def peft_config(lora: LoraConfig) -> peft.LoraConfig:
    """`[trainer.lora]` as a `peft.LoraConfig`: adapters on `target_modules`, no bias terms trained."""
    import peft

    return peft.LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )


def with_adapters(model: torch.nn.Module, lora: LoraConfig, adapter_name: str = "default") -> peft.PeftModel:
    """`model` with fresh adapters (B = 0: the policy starts as the base) and every base weight frozen.
    A target name the model lacks raises peft's ValueError naming it. `adapter_name`: peft's name of this set of
    adapters (several tenants' sets live on one model: `actors.tenant_trainer`)."""
    import peft

    return peft.get_peft_model(model, peft_config(lora), adapter_name=adapter_name)


def adapter_state_dict(model: peft.PeftModel, adapter_name: str = "default") -> dict[str, torch.Tensor]:
    """The adapters' tensors of set `adapter_name` under PEFT's saved names (the set's name left out): all a sync of
    a LoRA policy carries."""
    import peft

    return peft.get_peft_model_state_dict(model, adapter_name=adapter_name)
