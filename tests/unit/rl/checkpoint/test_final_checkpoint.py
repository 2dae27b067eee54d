"""`checkpoint.final`: a weights-only checkpoint is a third of a full one, is read by export and eval, and is never
resumed from; the start-up line's size estimate matches the bytes the trainer's writer puts on disk.

Checkpoints are written by the trainer's own writer (`store.save_trainer_rank`) from the tiny Qwen3 after one AdamW step,
committed by `rl.loop.state.save_checkpoint` (the roles' part is that writer, as the PolicyTrainer runs it)."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from rl.assets import resolve_model_path
from rl.checkpoint import store
from rl.checkpoint.estimate import checkpoint_bytes, checkpoint_line, model_size
from rl.checkpoint.export import read_model_state, run_checkpoint
from rl.checkpoint.resume import resume_config
from rl.config import ConfigError, dump_toml, load_config
from rl.loop.state import RunState, save_checkpoint
from tests.support.paths import TINY


class TrainerWriter:
    """The roles' part of a checkpoint reduced to the trainer's writer on an in-process model (one rank)."""

    def __init__(self):
        torch.manual_seed(0)
        self.model = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-qwen3"), dtype=torch.float32)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: 1.0)
        ids = torch.randint(0, 1000, (2, 24))
        self.model(ids, labels=ids).loss.backward()
        self.optimizer.step()

    async def save_checkpoint(self, path, weights_only=False):
        store.save_trainer_rank(path, self.model, self.optimizer, self.scheduler, 0, weights_only)


@pytest.fixture(scope="module")
def writer():
    return TrainerWriter()


def tensor_bytes(checkpoint):
    return sum(file.stat().st_size for file in (checkpoint / "trainer").glob("*.distcp"))


async def test_the_size_estimate_matches_what_the_writer_puts_on_disk(writer, tmp_path):
    config = load_config(TINY, {"run.steps": "10"})
    size = model_size("tiny-qwen3")
    assert size.parameters == sum(parameter.numel() for parameter in writer.model.parameters())  # tied weights once
    embedding = writer.model.get_input_embeddings().weight
    assert writer.model.lm_head.weight is embedding  # tied: the state dict names it twice, the checkpoint writes both
    assert size.state_elements == size.parameters + embedding.numel()
    for step, kind in ((2, "full"), (4, "weights")):
        await save_checkpoint(tmp_path, RunState(step=step), writer, config, weights_only=kind == "weights")
        written = tensor_bytes(store.checkpoint_root(tmp_path) / f"step_{step:08d}")
        estimate = checkpoint_bytes(size, "float32", kind)
        assert estimate <= written <= estimate * 1.01 + 64 * 1024, (kind, written, estimate)  # + DCP's own framing
    assert checkpoint_bytes(size, "bfloat16", "weights") * 2 == checkpoint_bytes(size, "float32", "weights")


async def test_a_weights_only_checkpoint_is_exported_and_evaluated_but_never_resumed(writer, tmp_path, capsys):
    config = load_config(TINY, {"run.steps": "10"})
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.toml").write_text(dump_toml(config))
    await save_checkpoint(run_dir, RunState(step=4), writer, config, weights_only=True)
    with pytest.raises(ConfigError, match="no committed checkpoint can be resumed"):
        resume_config(run_dir, {})
    assert "skipping checkpoint step_00000004: it holds weights only" in capsys.readouterr().err
    await save_checkpoint(run_dir, RunState(step=2), writer, config)  # an older full one, e.g. a regular checkpoint
    _, resumed = resume_config(run_dir, {})
    assert resumed.name == "step_00000002" and not store.is_weights_only(resumed)
    newest = run_checkpoint(run_dir, None)  # what rlmesh export and rlmesh eval take
    assert newest.name == "step_00000004" and store.is_weights_only(newest) and store.damage(newest) is None
    state = read_model_state(newest)
    expected = writer.model.state_dict()
    assert state.keys() == expected.keys() and all(torch.equal(state[key], expected[key]) for key in expected)
    manifest = json.loads((newest / store.MANIFEST).read_text())
    assert store.WEIGHTS_ONLY in manifest  # the marker is committed and checked like every file


def test_the_start_up_line_states_the_final_checkpoint_its_size_and_the_alternatives():
    size = model_size("tiny-qwen3")
    full, weights = (checkpoint_bytes(size, "float32", kind) / 1e9 for kind in ("full", "weights"))
    line = checkpoint_line(load_config(TINY))
    assert line == (
        f"final checkpoint: full (resumable), about {full:.2g} GB: {size.parameters / 1e6:.1f}M float32 parameters"
        f" + AdamW (--checkpoint.final weights: {weights:.2g} GB, none: nothing)"
    )
    line = checkpoint_line(load_config(TINY, {"checkpoint.final": "none", "checkpoint.every_steps": "5"}))
    assert line.startswith("final checkpoint: none (--checkpoint.final full: ")
    assert line.endswith("; and a full one every 5 steps (newest 1 kept)")
