"""The PolicyTrainer as a 2-rank gloo mesh (FSDP2) against the 1-process trainer, on the tiny Qwen3 (fp32).

Both get the same packed batch (7 rows, so the 2-rank mesh also pads one all-padding row). Tolerances:
- loss: rel 1e-6. Each rank's loss is its rows' share normalized by the token counts summed over both
  ranks, so the two shares add up to the 1-process loss; only fp32 summation order differs (~1e-7 relative).
- weights after AdamW: abs 1e-5, i.e. 1% of the step. AdamW's first step moves every weight by about
  lr = 1e-3 (|m / sqrt(v)| = 1), so a rank that normalized by its own counts, or gradients averaged
  instead of summed, would be off by ~1e-3 on most weights. The 2-rank gradient differs from the 1-process
  one only by reduction order (measured ~1e-8 absolute), which moves a weight noticeably only where its
  gradient is itself near Adam's eps (1e-8); measured worst case 2e-6.
The 2-rank mesh also publishes its weights through the shared-memory file (the one-host transport): what
a generator reads equals, bit for bit, the weights in the mesh's checkpoint; and `rlmesh export` makes that checkpoint
a Hugging Face folder that computes, with no rlmesh import, the logprobs the mesh computes.
"""

import asyncio
from pathlib import Path

import monarch.actor
import monarch.config
import pytest
import pytest_asyncio
import torch
import torch.distributed.checkpoint as dcp
from transformers import AutoModelForCausalLM

from rl.assets import resolve_model_path
from rl.checkpoint.export import export_checkpoint
from rl.config import load_config
from rl.loop.resolve import resolve_config
from rl.weights import sync as weight_sync
from rl.weights.shared_file import MappedFiles
from tests.support.paths import TINY
from tests.support.score_export import score_in_fresh_process
from tests.support.trainer_mesh import batch, start_trainer

pytestmark = [pytest.mark.asyncio(loop_scope="module")]

DEADLINE_S = 300


def config(num_procs: int):
    """The 2-rank trainer also recomputes activations (activation checkpointing under FSDP2): same numbers."""
    overrides = {
        "trainer.num_procs": str(num_procs),
        "trainer.micro_batch_size": "2",
        "trainer.gradient_checkpointing": str(num_procs > 1).lower(),
    }
    return resolve_config(load_config(TINY, overrides))


async def start(num_procs: int):
    return await start_trainer(config(num_procs), 4)


def checkpoint_weights(path: Path) -> dict[str, torch.Tensor]:
    """The model weights of a trainer checkpoint, loaded into a plain model in this process (no process group)."""
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-qwen3"), dtype=torch.float32)
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=path / "trainer")
    return {name: tensor.clone() for name, tensor in state["model"].items()}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("sharded")
    monarch.config.configure(cleanup_timeout="10s")  # as the controller: a trainer process takes a few seconds to stop
    previous_hook, monarch.actor.unhandled_fault_hook = monarch.actor.unhandled_fault_hook, lambda failure: None
    await weight_sync.initialize_store()
    (one, one_procs), (two, two_procs) = await start(1), await start(2)
    resumed, resumed_procs = await start(1)
    probe = list(range(5, 60))
    try:
        first = await asyncio.wait_for(
            asyncio.gather(one.train_step.call_one(batch(0)), two.train_step.call_one(batch(0))), DEADLINE_S
        )
        for name, trainer in (("one", one), ("two", two)):
            (root / name).mkdir()
            await trainer.save_checkpoint.call_one(str(root / name))
        await two.push_weights.call_one(1)  # shared memory: ranks gather one parameter at a time, rank 0 writes
        handle = await weight_sync.WeightReceiver("shared_memory").pull(1)  # what a generator hands its vLLM workers
        published = {name: tensor.clone() for name, tensor in MappedFiles().state_dict(handle).items()}
        await resumed.load_checkpoint.call_one(str(root / "two"))
        logprobs = await asyncio.gather(two.logprobs.call_one(probe), resumed.logprobs.call_one(probe))
        second = await asyncio.wait_for(
            asyncio.gather(two.train_step.call_one(batch(1)), resumed.train_step.call_one(batch(1))), DEADLINE_S
        )
        for name, trainer in (("two_again", two), ("resumed", resumed)):
            (root / name).mkdir()
            await trainer.save_checkpoint.call_one(str(root / name))
    finally:
        await two.release_weights.call()
        await asyncio.gather(one_procs.stop(), two_procs.stop(), resumed_procs.stop(), return_exceptions=True)
        await weight_sync.shutdown_store()
        monarch.actor.unhandled_fault_hook = previous_hook
    yield {"root": root, "first": first, "second": second, "logprobs": logprobs, "published": published, "probe": probe}


async def test_two_ranks_give_the_loss_and_the_updated_weights_of_one(runs):
    one, two = runs["first"]
    assert one["num_loss_tokens"] == two["num_loss_tokens"] > 0  # counts summed over ranks
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-6) and abs(one["loss"]) > 1e-4
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    for key in ("ratio_mean", "ratio_max", "clip_frac_low", "entropy"):
        assert two[key] == pytest.approx(one[key], rel=1e-6, abs=1e-9), key
    base = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-qwen3"), dtype=torch.float32).state_dict()
    weights_one, weights_two = checkpoint_weights(runs["root"] / "one"), checkpoint_weights(runs["root"] / "two")
    moved = max(float((weights_one[name] - base[name]).abs().max()) for name in base)
    assert moved > 5e-4  # the step moved weights by about lr = 1e-3
    for name in base:
        torch.testing.assert_close(weights_two[name], weights_one[name], atol=1e-5, rtol=0, msg=name)


async def test_a_two_rank_checkpoint_resumes_on_one_rank(runs):
    two_logprobs, resumed_logprobs = runs["logprobs"]
    assert max(abs(a - b) for a, b in zip(two_logprobs, resumed_logprobs)) < 1e-5
    two, resumed = runs["second"]  # a second step needs the restored AdamW moments and LR schedule too
    assert resumed["loss"] == pytest.approx(two["loss"], rel=1e-6) and resumed["lr"] == two["lr"]
    weights_two, weights_resumed = (
        checkpoint_weights(runs["root"] / "two_again"),
        checkpoint_weights(runs["root"] / "resumed"),
    )
    for name in weights_two:
        torch.testing.assert_close(weights_resumed[name], weights_two[name], atol=1e-5, rtol=0, msg=name)


async def test_a_sharded_trainer_publishes_its_whole_weights_through_shared_memory(runs):
    published, saved = runs["published"], checkpoint_weights(runs["root"] / "two")
    assert sorted(published) == sorted(saved)
    for name, tensor in saved.items():
        assert torch.equal(published[name], tensor), name


async def test_the_export_of_a_two_rank_checkpoint_computes_the_meshs_logprobs(runs, tmp_path):
    """fp32 throughout: the exported folder (transformers, a fresh process) and the mesh differ by summation order only
    (measured 2026-11-25: 1.9e-6 on logprobs near -12, i.e. 1.6e-7 relative)."""
    exported = export_checkpoint(runs["root"] / "two", tmp_path / "export", model_path="tiny-qwen3")
    scored = score_in_fresh_process(exported.out, [runs["probe"]], ["transformers"], tmp_path)["transformers"][0]
    mesh = runs["logprobs"][0][1:]  # the 2-rank mesh's, after the step the checkpoint holds
    torch.testing.assert_close(torch.tensor(scored), torch.tensor(mesh), rtol=1e-6, atol=1e-6)
