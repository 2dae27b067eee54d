"""A PolicyTrainer mesh spawned as a run spawns it, for the tests that drive a trainer directly, and a fixed packed
batch to train it on."""

import torch

from actors.trainer import PolicyTrainer
from rl.config import Config
from rl.packing.rows import TrainSample, pack_samples, split_micro_batches
from rl.processes.cluster import Placement
from rl.processes.trainer_mesh import spawn_trainer


def batch(seed: int) -> list:
    """13 samples of 40..92 tokens with random advantages and sampling logprobs -> 7 packed rows of 128, micro-batches of 2 rows."""
    generator = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(13):
        length = 40 + (i * 29) % 53
        prompt = 10
        ids = torch.randint(0, 1000, (length,), generator=generator).tolist()
        mask = [False] * prompt + [True] * (length - prompt)
        sampling = [float(-3 - torch.rand((), generator=generator)) if m else 0.0 for m in mask]
        samples.append(TrainSample(ids, mask, sampling, float(torch.randn((), generator=generator)), 0))
    packed = pack_samples(samples, seq_len=128, pad_token_id=0)
    assert len(packed) == 7
    return split_micro_batches(packed, 2)


async def start_trainer(cfg: Config, num_steps: int):
    """`cfg`'s trainer (`trainer.num_procs` ranks) on the processes a run would give it, publishing through
    `weight_sync.transport` in the generator's dtype; returns the actor mesh and its processes once it has loaded."""
    placement = Placement(cfg.cluster, cfg.trainer, cfg.generator, cfg.models)
    trainer, procs = await spawn_trainer(
        placement.spawn_procs,
        cfg.trainer,
        PolicyTrainer,
        cfg.trainer,
        cfg.loss,
        cfg.model.path,
        num_steps,
        weight_transport=cfg.weight_sync.transport,
        wire_dtype=cfg.generator.dtype,
    )
    await trainer.initialized
    return trainer, procs
