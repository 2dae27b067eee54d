"""A sharded trainer rank's model without the whole model: built on the meta device, sharded, then each rank reads
its own rows of every tensor from the model's safetensors files.

`from_pretrained` in every rank would hold the whole model per rank before FSDP2 keeps 1/W of it (a 70B model in
fp32 on an 8-GPU host: 8 x 280 GB of host RAM). Here a rank allocates only its shards (`to_empty`) and reads each
tensor's dim-0 rows of its shard (FSDP2 shards parameters on dim 0) straight from the file into them; a tensor stored
in another dtype (bf16 files for fp32 master weights) passes through one buffer of that slice. Peak host RAM per rank:
its shard plus one slice. The file is read with `pread`-style reads, not mapped, so no file page stays resident in
the rank. Non-persistent buffers (the rotary frequencies) are not in the files: their modules are rebuilt from the
config on the CPU and their buffers copied in.

The safetensors layout (the format's spec): 8 bytes little-endian header length N, N bytes of JSON
`{name: {"dtype", "shape", "data_offsets": [begin, end]}}`, then the data, offsets relative to byte 8 + N.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


@dataclass(frozen=True)
class StoredTensor:
    """Where one tensor's bytes are in a safetensors file."""

    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    """Absolute byte offset of its first element."""


def stored_tensors(model_dir: Path) -> dict[str, StoredTensor]:
    """Every tensor of a model folder's safetensors files (one `model.safetensors`, or the shards its index names),
    from the files' headers alone."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        files = sorted({model_dir / name for name in json.loads(index.read_text())["weight_map"].values()})
    else:
        files = [model_dir / "model.safetensors"]
    if not all(file.is_file() for file in files):
        raise FileNotFoundError(f"{model_dir} has no safetensors weights ({', '.join(map(str, files))})")
    found: dict[str, StoredTensor] = {}
    for file in files:
        with open(file, "rb") as handle:
            length = int.from_bytes(handle.read(8), "little")
            header = json.loads(handle.read(length))
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            found[name] = StoredTensor(
                file, SAFETENSORS_DTYPES[entry["dtype"]], tuple(entry["shape"]), 8 + length + entry["data_offsets"][0]
            )
    return found


def read_rows(stored: StoredTensor, first_row: int, out: torch.Tensor) -> None:
    """Rows `[first_row, first_row + len(out))` of `stored` (on dim 0; a 0-d tensor whole) into `out`, cast to its dtype."""
    row_elements = math.prod(stored.shape[1:])
    count = out.numel()
    direct = out.dtype == stored.dtype and out.device.type == "cpu" and out.is_contiguous()
    target = out if direct else torch.empty(count, dtype=stored.dtype)  # [rows * row_elements]: one slice
    with open(stored.file, "rb", buffering=0) as handle:
        handle.seek(stored.start + first_row * row_elements * stored.dtype.itemsize)
        view = memoryview(target.reshape(-1).view(torch.uint8).numpy())
        if handle.readinto(view) != len(view):
            raise ValueError(f"{stored.file} ends inside a tensor (rows from {first_row})")
    if not direct:
        out.copy_(target.view(out.shape))


def local_rows(tensor: torch.Tensor) -> tuple[int, torch.Tensor]:
    """The first global row this rank holds of `tensor` (a DTensor sharded on dim 0, or a whole tensor) and its local
    tensor."""
    if not isinstance(tensor, DTensor):
        return 0, tensor.data
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    local = tensor.to_local()
    _, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
    return (offset[0] if offset else 0), local


def load_shards(model: torch.nn.Module, model_dir: Path) -> None:
    """Read this rank's share of every parameter and persistent buffer of `model` (already sharded, allocated with
    `to_empty`) from the safetensors files in `model_dir`; a tied tensor is read once."""
    stored = stored_tensors(model_dir)
    seen: set[int] = set()
    with torch.no_grad():
        for name, tensor in model.state_dict(keep_vars=True).items():
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            if name not in stored:
                raise ValueError(f"{model_dir} has no tensor {name!r} (its files hold {len(stored)} tensors)")
            entry = stored[name]
            if entry.shape != tuple(tensor.shape):
                raise ValueError(f"{name}: {model_dir} stores shape {entry.shape}, the model has {tuple(tensor.shape)}")
            first_row, local = local_rows(tensor)
            if local.numel():
                read_rows(entry, first_row, local)
    rebuild_non_persistent_buffers(model)


def rebuild_non_persistent_buffers(model: torch.nn.Module) -> None:
    """Fill the buffers no file holds (left uninitialised by `to_empty`): each module owning one is built again from
    its `config` on the CPU (HF rotary embeddings compute their frequencies in `__init__`) and its buffers copied."""
    for name, module in model.named_modules():
        missing = [key for key in module._non_persistent_buffers_set if getattr(module, key, None) is not None]
        if not missing:
            continue
        if not hasattr(module, "config"):
            raise ValueError(f"{name}: non-persistent buffers {missing} cannot be rebuilt (the module has no config)")
        with torch.device("cpu"):
            fresh = type(module)(module.config)
        with torch.no_grad():
            for key in missing:
                getattr(module, key).copy_(getattr(fresh, key))
