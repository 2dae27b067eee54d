"""The trainer group's collectives get tensors its backends can reduce, for a GPU trainer too (checked on CPU).

A sharded GPU trainer's group is created by `distributed.init_process_group("cuda")`; NCCL reduces CUDA tensors
only ("No backend type associated with device type cpu"), and gloo, which every CPU test uses, accepts
anything. Here the backend string the GPU trainer would create its group with is captured, parsed by torch's own
`BackendConfig`, and every tensor a whole train step hands to a collective is checked against it.
"""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import BackendConfig
from transformers import AutoModelForCausalLM

from rl.assets import resolve_model_path
from rl.config.loss import LossConfig
from rl.packing.rows import TrainSample, pack_samples, split_micro_batches
from rl.training import distributed
from rl.training.train_step import train_step


def _gpu_group_backend(monkeypatch) -> tuple[distributed.Ranks, dict[str, object]]:
    """The Ranks and device -> backend map a 2-rank GPU trainer gets (the group itself is not created)."""
    created: dict[str, str] = {}
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kwargs: created.update(backend=backend))
    ranks = distributed.init_process_group("cuda")
    return ranks, BackendConfig(created["backend"]).get_device_backend_map()


def _samples(n: int = 6) -> list[TrainSample]:
    generator = torch.Generator().manual_seed(0)
    samples = []
    for i in range(n):
        length = 6 + i
        ids = torch.randint(0, 1000, (length,), generator=generator).tolist()
        mask = [False] * 2 + [True] * (length - 2)
        sampling = [float(-1.0 - torch.rand((), generator=generator)) if m else 0.0 for m in mask]
        samples.append(TrainSample(ids, mask, sampling, float(i % 3 - 1), 0))
    return samples


@pytest.mark.parametrize("preset", [None, "decoupled_token_is"])
def test_every_tensor_a_gpu_trainers_step_reduces_has_a_backend(monkeypatch, preset):
    ranks, backends = _gpu_group_backend(monkeypatch)
    assert ranks.world == 2
    assert "cuda" in backends, backends  # the GPU's own tensors (FSDP2's reduce-scatter, full_tensor) go to NCCL
    reduced: list[torch.device] = []

    def all_reduce(tensor, *args, **kwargs):
        reduced.append(tensor.device)
        if tensor.device.type not in backends:
            raise RuntimeError(f"No backend type associated with device type {tensor.device.type}")

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    monkeypatch.setattr(
        dist, "all_gather_object", lambda out, value, *a, **k: out.__setitem__(slice(None), [value] * 2)
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-qwen3"), dtype=torch.float32).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    algorithm = LossConfig(rollout_correction={"preset": preset, "rollout_is_batch_normalize": True} if preset else {})
    batch = pack_samples(_samples(), seq_len=32, pad_token_id=0)
    train_step(
        model,
        optimizer,
        scheduler,
        split_micro_batches(batch, 2),
        algorithm,
        max_grad_norm=1.0,
        horizon=32,
        ranks=ranks,
    )
    assert len(reduced) >= 3 + (preset is not None)  # the step's counts, each minibatch's, the tokens (+ IS mean)
