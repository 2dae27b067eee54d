"""What a vLLM worker holds after a load, as fingerprint pieces under the trainer's parameter names.

vLLM renames, fuses and slices the checkpoint's tensors: `q_proj`/`k_proj`/`v_proj` become one `qkv_proj`,
`gate_proj`/`up_proj` one `gate_up_proj` (the model's `packed_modules_mapping`), each tensor-parallel worker holds
a shard (column-parallel layers a block of rows, row-parallel ones a block of columns, kv heads replicated when
there are fewer than workers), and the vocabulary is padded. This module maps each block back to the published
tensor and rows/columns it came from, and measures its share (`rl.weights.attestation`):
  - from the parameter's bytes when vLLM keeps them as a tensor of the layer's shape (GPU, embeddings, norms);
  - through the layer's own kernel (`quant_method.apply` on the two ±1 probe columns) when vLLM packed them for it
    and left an empty parameter (vLLM on CPU, oneDNN): what the engine computes with is what is measured.
A LoRA sync publishes adapter tensors only (PEFT's names, `base_model.model.<layer>.lora_A.weight`); `adapter_pieces`
reads them from the slot vLLM activated the adapter in (the `lora_a_stacked`/`lora_b_stacked` buffers its LoRA
kernels read), one slice per packed part (q/k/v of `qkv_proj`, gate/up of `gate_up_proj`).
A published tensor the walk does not reach is reported missing by `check`, so an architecture this mapping does not
know fails loudly instead of passing.

Runs inside vLLM's workers (`rl.weights.vllm_worker`); imports vLLM.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from rl.weights.attestation import Piece, exact_piece, kernel_inputs, kernel_piece


def loaded_pieces(model: torch.nn.Module, shapes: dict[str, tuple[int, ...]], seed: int) -> list[Piece]:
    """Every block of the published tensors (`shapes`: name -> full shape) this worker's `model` holds."""
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    packed = getattr(model, "packed_modules_mapping", {}) or {}
    pieces: list[Piece] = []
    with torch.no_grad():
        for module_name, module in model.named_modules():
            if isinstance(module, LinearBase):
                pieces += _linear_pieces(module_name, module, packed, shapes, seed)
            elif isinstance(module, VocabParallelEmbedding):
                pieces += _embedding_pieces(module_name, module, shapes, seed)
            else:
                for parameter_name, parameter in module.named_parameters(recurse=False):
                    name = f"{module_name}.{parameter_name}"
                    if name in shapes and tuple(parameter.shape) == tuple(shapes[name]):
                        rows, cols = _whole(shapes[name])
                        pieces.append(exact_piece(name, parameter, shapes[name], rows, cols, seed))
    return pieces


def _whole(shape: tuple[int, ...]) -> tuple[tuple[int, int], tuple[int, int]]:
    from rl.weights.attestation import matrix_shape

    rows, cols = matrix_shape(tuple(shape))
    return (0, rows), (0, cols)


def _row_parts(module_name: str, module, packed: dict[str, list[str]]) -> list[tuple[str, int, int, int]]:
    """(published module name, local row start, rows, published row start) of each part of a linear layer's output."""
    from vllm.model_executor.layers.linear import (
        ColumnParallelLinear,
        MergedColumnParallelLinear,
        QKVParallelLinear,
        RowParallelLinear,
    )

    prefix, _, leaf = module_name.rpartition(".")
    parts = [f"{prefix}.{part}" if prefix else part for part in packed.get(leaf, [])]
    rank = getattr(module, "tp_rank", 0)
    if isinstance(module, QKVParallelLinear):
        q, k, v = parts or [module_name.replace("qkv_proj", name) for name in ("q_proj", "k_proj", "v_proj")]
        kv_rank = rank // module.num_kv_head_replicas
        q_rows, k_rows = module.num_heads * module.head_size, module.num_kv_heads * module.head_size
        v_rows = module.num_kv_heads * module.v_head_size
        return [
            (q, 0, q_rows, rank * q_rows),
            (k, q_rows, k_rows, kv_rank * k_rows),
            (v, q_rows + k_rows, v_rows, kv_rank * v_rows),
        ]
    if isinstance(module, MergedColumnParallelLinear):
        sizes = [size // module.tp_size for size in module.output_sizes]
        starts = [sum(sizes[:index]) for index in range(len(sizes))]
        return [(part, start, size, rank * size) for part, start, size in zip(parts, starts, sizes)]
    rows = module.output_size_per_partition
    if isinstance(module, ColumnParallelLinear):
        return [(module_name, 0, rows, rank * rows)]
    if isinstance(module, RowParallelLinear):
        return [(module_name, 0, rows, 0)]
    return [(module_name, 0, rows, 0)]  # ReplicatedLinear


def _linear_pieces(module_name: str, module, packed: dict[str, list[str]], shapes, seed: int) -> list[Piece]:
    from vllm.model_executor.layers.linear import RowParallelLinear

    out_rows, in_cols = module.output_size_per_partition, module.input_size_per_partition
    col_start = module.tp_rank * in_cols if isinstance(module, RowParallelLinear) else 0
    cols = (col_start, col_start + in_cols)
    parts = [part for part in _row_parts(module_name, module, packed) if f"{part[0]}.weight" in shapes]
    pieces: list[Piece] = []
    weight = module.weight
    if parts and tuple(weight.shape) == (out_rows, in_cols):  # the bytes are there
        for part, local, size, start in parts:
            name = f"{part}.weight"
            block = weight[local : local + size]
            pieces.append(exact_piece(name, block, shapes[name], (start, start + size), cols, seed))
    elif parts:  # packed for the kernel: measure through it, one call for every part (they share their v)
        dtype = module.params_dtype
        name = f"{parts[0][0]}.weight"
        inputs = kernel_inputs(name, shapes[name], cols, seed).to(device=weight.device, dtype=dtype)
        outputs = module.quant_method.apply(module, inputs)
        for part, local, size, start in parts:
            name = f"{part}.weight"
            block = outputs[:, local : local + size]
            pieces.append(kernel_piece(name, block, shapes[name], (start, start + size), cols, dtype, seed))
    bias = getattr(module, "bias", None)
    if bias is not None and not isinstance(module, RowParallelLinear):
        for part, local, size, start in _row_parts(module_name, module, packed):
            name = f"{part}.bias"
            if name in shapes:
                pieces.append(
                    exact_piece(name, bias[local : local + size], shapes[name], (start, start + size), (0, 1), seed)
                )
    elif bias is not None and f"{module_name}.bias" in shapes and module.tp_rank == 0:
        name = f"{module_name}.bias"  # a row-parallel bias is added once, by rank 0
        rows, whole_cols = _whole(shapes[name])
        pieces.append(exact_piece(name, bias, shapes[name], rows, whole_cols, seed))
    return pieces


def _embedding_pieces(module_name: str, module, shapes, seed: int) -> list[Piece]:
    """The vocabulary rows this worker holds (padding rows left out)."""
    name = f"{module_name}.weight"
    if name not in shapes:
        return []
    indices = module.shard_indices
    start, end = indices.org_vocab_start_index, indices.org_vocab_end_index
    cols = (0, _whole(shapes[name])[1][1])
    return [exact_piece(name, module.weight[: end - start], shapes[name], (start, end), cols, seed)]


def adapter_pieces(
    manager, lora_int_id: int, shapes: dict[str, tuple[int, ...]], scaling: float, seed: int
) -> list[Piece]:
    """Every published adapter tensor (`shapes`) as vLLM's LoRA model `manager` holds adapter `lora_int_id` in its
    slot: A as `lora_a_stacked[part][slot, 0, :rank, :in]`, B as `lora_b_stacked[part][slot, 0, :out, :rank]`
    divided by `scaling` (vLLM stores B x alpha / rank). Dividing by a power of two is exact; otherwise the stored
    product was rounded to the slot's dtype once, which the piece declares ("kernel": that dtype's rounding
    tolerance). An adapter in no slot gives no pieces (`check` then reports every tensor missing).

    Tensor-parallel slices of adapters are not mapped: a worker with `tp_size > 1` raises."""
    if lora_int_id not in manager.lora_index_to_id:
        return []
    slot = manager.lora_index_to_id.index(lora_int_id)
    exact_scaling = math.frexp(scaling)[0] == 0.5
    pieces: list[Piece] = []
    with torch.no_grad():
        for module_name, module in manager.modules.items():
            parts = manager.packed_modules.get(module_name) or [module_name]
            names = [
                (f"base_model.model.{part}.lora_A.weight", f"base_model.model.{part}.lora_B.weight") for part in parts
            ]
            if not any(a in shapes or b in shapes for a, b in names):
                continue
            if getattr(module, "tp_size", 1) > 1:
                raise NotImplementedError(f"{module_name}: attesting a tensor-parallel adapter is not supported")
            for index, (a_name, b_name) in enumerate(names):
                if a_name in shapes:
                    rank, columns = shapes[a_name]
                    block = module.lora_a_stacked[index][slot, 0, :rank, :columns]
                    pieces.append(exact_piece(a_name, block, shapes[a_name], (0, rank), (0, columns), seed))
                if b_name in shapes:
                    rows, rank = shapes[b_name]
                    stored = module.lora_b_stacked[index][slot, 0, :rows, :rank]
                    piece = exact_piece(b_name, stored.float() / scaling, shapes[b_name], (0, rows), (0, rank), seed)
                    dtype = str(stored.dtype).removeprefix("torch.")
                    pieces.append(replace(piece, dtype=dtype, how="exact" if exact_scaling else "kernel"))
    return pieces
