"""A sharded trainer rank loads its shard of the model, not the whole model.

Two gloo ranks load SmolLM2-135M (bf16 files, fp32 master weights: 538 MB whole, 269 MB per rank; the largest tensor,
the tied embedding, 113 MB) through the trainer's own `load_policy`. Each rank's resident high-water mark (`VmHWM`,
reset after its imports) may grow by its shard plus two of the largest tensor; `from_pretrained` in every rank, then
FSDP2, grows each by the whole model and its shard (over 800 MB). Every shard equals its rows of the file, read back
by the safetensors library itself.
"""

import os
import tempfile

import pytest
import torch
import torch.multiprocessing as mp

from rl.assets import resolve_model_path
from rl.checkpoint.estimate import model_size

MODEL = "smollm2-135m-instruct"
MIB = 2**20


def _rank(rank: int, world: int, init_file: str, out: str) -> None:
    import torch.distributed as dist
    from safetensors import safe_open

    from actors.trainer import load_policy
    from rl.config.roles import TrainerConfig
    from rl.metrics.memory import peak_rss_bytes, reset_peaks, rss_bytes
    from rl.training.distributed import Ranks
    from rl.training.sharded_load import local_rows

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    reset_peaks()
    before = rss_bytes()
    lm, _sharded, reference = load_policy(MODEL, TrainerConfig(), Ranks(rank, world), kl_reference=False)
    growth = peak_rss_bytes() - before
    mismatched = []
    with safe_open(os.path.join(resolve_model_path(MODEL), "model.safetensors"), "pt") as stored:
        for name, tensor in lm.state_dict(keep_vars=True).items():
            if name not in stored.keys():  # the tied output layer: the embedding's tensor
                assert tensor is lm.model.embed_tokens.weight, name
                continue
            first, local = local_rows(tensor)
            rows = stored.get_slice(name)[first : first + local.shape[0]]
            if not torch.equal(local, rows.to(local.dtype)):
                mismatched.append(name)
    torch.save({"growth": growth, "mismatched": mismatched, "reference": reference}, f"{out}.{rank}")
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.processes  # two gloo ranks in their own processes
def test_each_rank_holds_its_shard_and_a_bounded_buffer_while_loading() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank")
        mp.spawn(_rank, args=(2, os.path.join(tmp, "init"), out), nprocs=2, join=True)
        results = [torch.load(f"{out}.{rank}", weights_only=False) for rank in range(2)]
    size = model_size(MODEL)
    shard = size.parameters * 4 // 2
    largest = 49152 * 576 * 4  # the embedding (vocabulary x hidden), fp32
    for rank, result in enumerate(results):
        assert result["mismatched"] == [], result["mismatched"]
        assert result["reference"] is None
        assert result["growth"] <= shard + 2 * largest, (
            f"rank {rank} grew {result['growth'] / MIB:.0f} MiB while loading (its shard: {shard / MIB:.0f} MiB, the "
            f"whole model: {2 * shard / MIB:.0f} MiB)"
        )
