"""The trainer's data-parallel group: torch.distributed inside the trainer's proc mesh, FSDP2 sharding,
and the cross-rank sums the loss and the metrics need.

Every rank runs the same endpoint on its own share of the packed rows (`rank_rows`); the loss is
normalized by per-component token counts summed over all ranks, so the gradient FSDP2 reduce-scatters
(as a sum, not its default mean) is the gradient of the whole batch. With one rank nothing here runs:
`Ranks.single()` reduces nothing and no process group exists.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from tensordict import TensorDict

from rl.training.logprobs import LogprobsModel


@dataclass(frozen=True)
class Ranks:
    """This process's place in the trainer's group; the identity when `world == 1` and no group exists (a one-rank
    group, as the GPU suite makes, reduces through its backends like any other)."""

    rank: int = 0
    world: int = 1

    @classmethod
    def single(cls) -> Ranks:
        return cls()

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Elementwise sum over ranks (a new tensor; `tensor` is left alone)."""
        if self.alone:
            return tensor
        out = tensor.clone()
        dist.all_reduce(out)
        return out

    def gather(self, value: object) -> list[object]:
        """Every rank's `value`, in rank order."""
        if self.alone:
            return [value]
        out: list[object] = [None] * self.world
        dist.all_gather_object(out, value)
        return out

    def barrier(self) -> None:
        if not self.alone:
            dist.barrier()

    @property
    def alone(self) -> bool:
        return self.world == 1 and not dist.is_initialized()


def process_group_backend(device: str) -> str:
    """The group's backend per tensor device: gloo on CPU; on GPU NCCL for CUDA tensors and gloo for CPU ones.

    NCCL has no CPU backend, and a step's collectives are not all on the GPU: the loss normalizers
    (`component_counts`), the token count and the IS batch normalizer are a few float64 numbers built on the
    CPU on purpose (no device sync per micro-batch), and object gathers pickle into CPU memory.
    """
    return "cpu:gloo,cuda:nccl" if device == "cuda" else "gloo"


def init_process_group(device: str) -> Ranks:
    """Join the trainer's group from RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT (set by `rl.processes.trainer_mesh`).

    Backends: `process_group_backend` (each GPU process sees only its own GPU, so it is cuda:0).
    """
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if not dist.is_initialized():
        dist.init_process_group(process_group_backend(device), rank=rank, world_size=world)
    return Ranks(rank, world)


def shard(model: torch.nn.Module, *, device: str, param_dtype: torch.dtype | None) -> LogprobsModel:
    """FSDP2 over the group: one unit per decoder layer, the root (`LogprobsModel`) holds embeddings, norm and output layer.

    The root keeps a tied output layer with its embedding and gathers it once per forward, however many
    chunks the log-softmax runs in. `param_dtype` (GPU): compute dtype of the gathered weights, with fp32
    gradient reduction; None keeps the parameters' dtype (CPU uses autocast instead). Gradients are summed
    over ranks, not averaged: the loss is already normalized by global counts.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device, (dist.get_world_size(),))
    policy = (
        MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
        if param_dtype is not None
        else MixedPrecisionPolicy()
    )
    root = LogprobsModel(model)
    for layer in model.get_decoder().layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(root, mesh=mesh, mp_policy=policy)
    for unit in [*model.get_decoder().layers, root]:  # each unit reduces its own gradients
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)  # a plain SUM: gloo has no pre-multiplied sum
    return root


def pad_row(batch: TensorDict) -> TensorDict:
    """One all-padding row shaped like `batch`'s rows: no weight, so it adds nothing but keeps collectives in step."""
    row = batch[:1].clone()
    for key, value in row.items():
        if key in ("sequence_ids", "policy_version", "fwd_parent"):
            value.fill_(-1)
        elif key in ("input_ids", "fwd_input_ids"):
            value.fill_(_pad_token(batch))
        elif key == "fwd_subtree_end":  # a prefix-tree row of padding: every node a root that sees only itself
            value.copy_(torch.arange(1, value.shape[1] + 1))
        else:
            value.zero_()
    return row


def _pad_token(batch: TensorDict) -> int:
    """A token id already used as padding in the batch (or the first row's last token): any id works under zero weight."""
    pad = batch["input_ids"][batch["sequence_ids"] < 0]
    return int(pad[0]) if pad.numel() else int(batch["input_ids"][0, -1])


def rank_rows(micro_batches: list[TensorDict], ranks: Ranks, micro_batch_size: int) -> list[TensorDict]:
    """This rank's micro-batches: rows rank, rank + world, ... of the batch, padded so every rank has as many.

    Every rank must run the same number of forwards (FSDP gathers each layer in each), so the batch is
    padded to a multiple of `world` rows with all-padding rows; a row never splits, so no sequence spans ranks.
    """
    batch = torch.cat(micro_batches) if len(micro_batches) > 1 else micro_batches[0]  # [R, L]
    missing = -len(batch) % ranks.world
    if missing:
        batch = torch.cat([batch] + [pad_row(batch)] * missing)
    mine = batch[torch.arange(ranks.rank, len(batch), ranks.world)]  # [R / world, L]
    return list(mine.split(micro_batch_size, dim=0))
