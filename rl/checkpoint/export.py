"""A trained policy as a Hugging Face model folder (`rlmesh export`: `rl.commands.export`).

A checkpoint's trainer state is torch.distributed.checkpoint shards, however many trainer ranks wrote it. The
export reads the model's tensors back whole with DCP's own reader (as `dcp_to_torch_save` does: no process group,
no optimizer state), puts them into the base model's architecture (the run's `model.path`) and writes

    DIR/model.safetensors (or shards with an index)   config.json   generation_config.json
    DIR/tokenizer.json, tokenizer_config.json, chat_template.jinja (the base model's tokenizer and chat template)
    DIR/adapter/adapter_config.json, adapter_model.safetensors   (a `trainer.lora` run: its PEFT adapter, always
                                                                  fp32; DIR is then the base with the adapter merged)

which transformers (`AutoModelForCausalLM.from_pretrained(DIR)`) and vLLM (`LLM(model=DIR, dtype="float32")`; vLLM's
"auto" serves a float32 folder in bf16) load with no rlmesh import; the adapter loads with
`peft.PeftModel.from_pretrained(base, DIR/adapter)` or vLLM's `LoRARequest`. A LoRA checkpoint holds the adapters
alone: the base weights are read from the run's `model.path`. The folder is written beside DIR and renamed into place when complete: a failed export leaves no folder.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rl.assets import resolve_model_path

if TYPE_CHECKING:
    import torch

    from rl.config.lora import LoraConfig

EXPORT_DTYPES = ("float32", "bfloat16")
"""Weights dtypes an export can be written in (the CLI imports this module before torch: names, not torch dtypes)."""


@dataclass(frozen=True)
class Exported:
    """What `export_checkpoint` wrote."""

    out: Path
    checkpoint: Path
    bytes: int
    """Size of the whole folder (weights, config and tokenizer files)."""
    seconds: float


def read_model_state(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The model tensors of checkpoint `checkpoint`'s trainer state, whole, whatever number of ranks wrote them."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict[str, dict[str, torch.Tensor]] = {}
    _load_state_dict(
        state,
        storage_reader=FileSystemReader(str(checkpoint / "trainer")),
        planner=_EmptyStateDictLoadPlanner(keys={"model"}),
        no_dist=True,
    )
    if "model" not in state:
        raise ValueError(f"{checkpoint}/trainer holds no model state")
    return state["model"]


def checkpoint_model_path(checkpoint: Path) -> str:
    """The run's `model.path` (the base the policy was trained from), from the config the checkpoint was written with."""
    config = tomllib.loads((checkpoint / "config.toml").read_text())
    return config.get("model", {}).get("path", "smollm2-135m-instruct")


def checkpoint_param_dtype(checkpoint: Path) -> str:
    """The dtype the run trained its parameters in (`trainer.param_dtype`), from the checkpoint's config."""
    config = tomllib.loads((checkpoint / "config.toml").read_text())
    return config.get("trainer", {}).get("param_dtype", "float32")


def adapter_hint(exported: Exported) -> str:
    """How to load an exported LoRA adapter so that it computes the run's policy: on its base (the adapter config's
    `base_model_name_or_path`) in the dtype the run trained, not the base folder's own (a bf16 base loaded as bf16
    is not the fp32 policy the adapters were trained on)."""
    dtype = checkpoint_param_dtype(exported.checkpoint)
    return (
        f"peft.AutoPeftModelForCausalLM.from_pretrained({str(exported.out / 'adapter')!r}, dtype=torch.{dtype})"
        f" (the base in {dtype}, as the run trained it)"
    )


def checkpoint_lora(checkpoint: Path) -> LoraConfig:
    """The run's `[trainer.lora]`, from the config the checkpoint was written with (off when it has none: a trainer's
    own checkpoint, written outside a run)."""
    from rl.config.lora import LoraConfig

    if not (checkpoint / "config.toml").is_file():
        return LoraConfig()
    config = tomllib.loads((checkpoint / "config.toml").read_text())
    return LoraConfig.model_validate(config.get("trainer", {}).get("lora", {}))


def export_checkpoint(checkpoint: Path, out: Path, dtype: str = "float32", model_path: str | None = None) -> Exported:
    """Write the policy of `checkpoint` as a Hugging Face folder `out` in `dtype`; `model_path`: the base model
    (default: the checkpoint's own config's), whose architecture, tokenizer and generation config the folder gets."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig

    start = time.perf_counter()
    if dtype not in EXPORT_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(EXPORT_DTYPES)}, got {dtype!r}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an empty folder; choose another --out")
    base = resolve_model_path(model_path or checkpoint_model_path(checkpoint))
    model = trained_model(checkpoint, base)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        if hasattr(model, "merge_and_unload"):  # a LoRA run: the PEFT adapter, then the base with it merged
            model.peft_config["default"].base_model_name_or_path = base
            model.save_pretrained(tmp / "adapter")
            model = model.merge_and_unload()  # W + (alpha / rank) B A, in fp32
        model.to(getattr(torch, dtype))
        model.config.dtype = getattr(torch, dtype)
        try:
            model.generation_config = GenerationConfig.from_pretrained(base)
        except OSError:  # the base has no generation_config.json: keep the one derived from its config
            pass
        model.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(base).save_pretrained(tmp)
        tmp.chmod(0o755)
        if out.exists():
            out.rmdir()  # empty, checked above
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    size = sum(file.stat().st_size for file in out.rglob("*") if file.is_file())
    return Exported(out=out, checkpoint=checkpoint, bytes=size, seconds=time.perf_counter() - start)


def trained_model(checkpoint: Path, base: str) -> torch.nn.Module:
    """The base architecture (fp32) holding the checkpoint's model state: all of it after full training; for a LoRA
    run, the base model's own weights wrapped with the run's adapters (a peft model) holding the checkpoint's."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    state = read_model_state(checkpoint)
    lora = checkpoint_lora(checkpoint)
    if lora.enabled:
        from rl.training.lora import with_adapters

        model = with_adapters(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), lora)
        expected = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    else:
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(base), dtype=torch.float32)
        expected = set(model.state_dict())
    if missing := sorted(expected - set(state)):
        raise ValueError(f"{checkpoint} is not a checkpoint of {base}: it lacks {missing[:3]} ({len(missing)} in all)")
    if unexpected := sorted(set(state) - expected):
        raise ValueError(f"{checkpoint} has tensors {base} does not: {unexpected[:3]} ({len(unexpected)} in all)")
    model.load_state_dict(state, strict=not lora.enabled)  # copies into the model's parameters: ties stay tied
    return model


def run_checkpoint(run_dir: Path, step: int | None) -> Path:
    """Checkpoint `step` of `run_dir` (committed and intact), or its newest loadable one when `step` is None."""
    from rl.checkpoint import store

    if step is None:
        return store.newest_loadable(run_dir)
    path = store.checkpoint_root(run_dir) / f"step_{step:08d}"
    if path not in store.committed_checkpoints(run_dir):
        steps = [int(found.name.removeprefix("step_")) for found in store.committed_checkpoints(run_dir)]
        raise FileNotFoundError(f"{run_dir} has no committed checkpoint of step {step} (committed: {steps or 'none'})")
    if (reason := store.damage(path)) is not None:
        raise ValueError(f"checkpoint {path.name} cannot be exported: {reason}")
    return path
