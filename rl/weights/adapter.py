"""The generator's side of an adapter-only sync: each synced LoRA version as the PEFT folder vLLM loads it from.

vLLM loads an adapter from a folder (`adapter_config.json` + `adapter_model.safetensors`), by a `LoRARequest` whose
integer id it caches the adapter under. Each policy version therefore gets its own folder and id; once the engine
serves a version, the older folders go.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch

from rl.config.lora import LoraConfig
from rl.training.lora import peft_config


class AdapterFolders:
    """A generator's adapter folders, one per synced policy version, under one temporary folder of its own."""

    def __init__(self, lora: LoraConfig, base_model: str):
        """`base_model`: the path of the model the adapters apply to (recorded in each folder's config)."""
        self.config = peft_config(lora)
        self.config.base_model_name_or_path = base_model
        self.scaling = lora.alpha / lora.rank
        """What each adapter's B is multiplied by (vLLM folds it into B when it loads the adapter)."""
        self.root = Path(tempfile.mkdtemp(prefix="rlmesh-adapters-"))

    def write(self, policy_version: int, state_dict: dict[str, torch.Tensor]) -> Path:
        """The folder of `policy_version` holding `state_dict` (PEFT's saved tensor names), written in full."""
        from safetensors.torch import save_file

        folder = self.root / f"v{policy_version}"
        folder.mkdir(exist_ok=True)
        self.config.save_pretrained(str(folder))
        save_file(
            {name: tensor.detach().contiguous().clone() for name, tensor in state_dict.items()},
            str(folder / "adapter_model.safetensors"),
        )
        return folder

    def keep_only(self, folder: Path) -> None:
        """Remove every version's folder but `folder` (the one the engine serves)."""
        for old in self.root.iterdir():
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def lora_request_id(policy_version: int) -> int:
    """vLLM's adapter id of a policy version: distinct per version (vLLM caches adapters by id) and above 0."""
    return policy_version + 1
