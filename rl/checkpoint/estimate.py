"""What a run's checkpoints will weigh, stated at start-up (`rlmesh train`), before any is written.

A checkpoint's model part is the model's state dict in `trainer.param_dtype`, where tied weights appear under each of
their names (torch.distributed.checkpoint writes each: SmolLM2-135M's 28M-parameter embedding twice); a full
checkpoint adds AdamW's two moment tensors per parameter (once each), same dtype, plus RNG states and small records.
SmolLM2-135M in fp32: (162.8M + 2 x 134.5M) x 4 B = 1.73 GB full, 0.65 GB weights only. A `trainer.lora` run's
checkpoint holds the adapters alone: rank x (in + out) elements per adapted linear layer, and their moments.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rl.assets import resolve_model_path
from rl.config import Config
from rl.config.lora import LoraConfig


@dataclass(frozen=True)
class ModelSize:
    parameters: int
    """Trainable elements, tied weights once (what AdamW keeps moments of)."""
    state_elements: int
    """Elements of the state dict a checkpoint writes: tied weights once per name, persistent buffers too."""
    largest_elements: int = 0
    """Elements of the largest tensor of the state dict (a sharded load's read buffer is one slice of it)."""
    file_dtype: torch.dtype | None = None
    """The dtype the model's files store its floating tensors in (`dtype` in its config.json; None: not stated):
    a sharded load reads a file already in `trainer.param_dtype` straight into the shard, others through a buffer."""
    load_order: tuple[int, ...] = ()
    """Elements of each tensor a load reads, in the state dict's order (tied weights once, at their first name): what
    a sharded load holds when it reads each (`rl.commands.footprint.sharded_load_bytes`)."""
    layers: int = 0
    """Decoder layers (`num_hidden_layers` in its config.json; 0: not stated): a load's Python and FSDP objects grow
    with them (`rl.commands.footprint.LOAD_BYTES_PER_LAYER`)."""


def model_size(model_path: str, lora: LoraConfig | None = None) -> ModelSize:
    """The model's sizes, counted on the meta device: nothing is read or allocated; with an enabled `lora`, the
    adapters' (A: rank x in, B: out x rank on every linear layer named in `target_modules`)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(resolve_model_path(model_path))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    if lora is not None and lora.enabled:
        adapters = sum(
            lora.rank * (module.in_features + module.out_features)
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in lora.target_modules
        )
        return ModelSize(parameters=adapters, state_elements=adapters)
    state = model.state_dict(keep_vars=True)  # the tensors themselves: a tied one is one object under each name
    stated = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)  # "torch_dtype": older configs
    return ModelSize(
        parameters=sum(parameter.numel() for parameter in model.parameters()),
        state_elements=sum(tensor.numel() for tensor in state.values()),
        largest_elements=max(tensor.numel() for tensor in state.values()),
        file_dtype=getattr(torch, stated) if isinstance(stated, str) else stated,
        load_order=tuple({id(tensor): tensor.numel() for tensor in state.values()}.values()),
        layers=getattr(config, "num_hidden_layers", 0) or 0,
    )


def checkpoint_bytes(size: ModelSize, param_dtype: str, kind: str) -> int:
    """Tensor bytes of a checkpoint of `kind` ("full": the state dict + AdamW's two moments; "weights"; "none": 0)."""
    itemsize = getattr(torch, param_dtype).itemsize
    weights = size.state_elements * itemsize
    return {"full": weights + 2 * size.parameters * itemsize, "weights": weights, "none": 0}[kind]


def checkpoint_line(config: Config) -> str:
    """One console line (for `rl.console.say`): the final checkpoint's kind and estimated size, the
    alternatives, and any regular ones."""
    sizes = model_size(config.model.path, config.trainer.lora)
    dtype, chosen = config.trainer.param_dtype, config.checkpoint.final

    def size(kind: str) -> str:
        return f"{checkpoint_bytes(sizes, dtype, kind) / 1e9:.2g} GB"

    trained = "adapter parameters" if config.trainer.lora.enabled else "parameters"
    described = {
        "full": f"full (resumable), about {size('full')}: {sizes.parameters / 1e6:.1f}M {dtype} {trained} + AdamW",
        "weights": f"weights only (export/eval, not resumable), about {size('weights')}",
        "none": "none",
    }
    others = ", ".join(f"{kind}: {size(kind) if kind != 'none' else 'nothing'}" for kind in described if kind != chosen)
    line = f"final checkpoint: {described[chosen]} (--checkpoint.final {others})"
    if config.checkpoint.every_steps:
        line += f"; and a full one every {config.checkpoint.every_steps} steps (newest {config.checkpoint.keep} kept)"
    return line
