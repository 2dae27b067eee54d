"""`rlmesh export`: a committed checkpoint of the trainer's state becomes a Hugging Face folder that transformers
loads with no rlmesh import and that computes what the trained model computed.

The checkpoint here is written by the trainer's own writer (`store.write(path, store.TRAINER, ...)`, 1 rank) from the tiny Qwen3
after one AdamW step; 2-rank checkpoints and the sampler's logprobs are checked end to end
(tests/e2e/test_sharded_trainer.py, tests/e2e/test_main_loop.py).
"""

import json

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from rl.assets import resolve_model_path
from rl.checkpoint import store
from rl.checkpoint.export import export_checkpoint, read_model_state
from rl.commands import cli
from tests.support.score_export import score_in_fresh_process

pytestmark = pytest.mark.processes  # the export is loaded in a Python without rlmesh

PROBE = [[151644, 872, 198, 3838, 374, 279, 2629, 315, 279, 18509, 315, 220, 19, 22, 30], list(range(100, 140))]


def logprobs(model: torch.nn.Module, ids: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1]
    return torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1).tolist()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run directory with one committed checkpoint (step 3) of the tiny Qwen3 after one AdamW step, and that model."""
    run_dir = tmp_path_factory.mktemp("run")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-qwen3"), dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    ids = torch.randint(0, 1000, (2, 24))
    model(ids, labels=ids).loss.backward()
    optimizer.step()
    tmp = store.begin(run_dir, 3)
    store.write(tmp, store.TRAINER, model, optimizer, scheduler)
    (tmp / "run_state.json").write_text(json.dumps({"step": 3}))
    (tmp / "config.toml").write_text('[model]\npath = "tiny-qwen3"\n')
    store.commit(run_dir, tmp, 3, keep=2)
    return run_dir, model.eval()


def test_the_export_loads_without_rlmesh_and_computes_the_trained_models_logprobs(trained, tmp_path):
    run_dir, model = trained
    out = tmp_path / "export"
    assert cli.main(["export", str(run_dir), "--out", str(out)]) == 0
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "chat_template.jinja"} <= {
        path.name for path in out.iterdir()
    }
    scored = score_in_fresh_process(out, PROBE, ["transformers"], tmp_path)["transformers"]
    base = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-qwen3"), dtype=torch.float32)
    for ids, exported in zip(PROBE, scored):
        expected = logprobs(model, ids)
        assert max(abs(a - b) for a, b in zip(exported, expected)) <= 1e-6
        assert max(abs(a - b) for a, b in zip(logprobs(base, ids), expected)) > 1e-3  # the step moved them


def test_a_bfloat16_export_holds_the_trained_weights_rounded(trained, tmp_path):
    run_dir, model = trained
    exported = export_checkpoint(store.newest_checkpoint(run_dir), tmp_path / "bf16", dtype="bfloat16")
    assert json.loads((exported.out / "config.json").read_text())["dtype"] == "bfloat16"
    trained_weights = model.state_dict()
    with safe_open(exported.out / "model.safetensors", "pt") as weights:
        for name in weights.keys():
            assert torch.equal(weights.get_tensor(name), trained_weights[name].to(torch.bfloat16)), name
    assert exported.bytes < 0.6 * sum(tensor.numel() * 4 for tensor in trained_weights.values())


def test_the_checkpoints_model_state_is_read_whole(trained):
    run_dir, model = trained
    state = read_model_state(store.newest_checkpoint(run_dir))
    assert sorted(state) == sorted(model.state_dict())
    for name, tensor in model.state_dict().items():
        assert torch.equal(state[name], tensor), name


def test_a_missing_step_an_occupied_folder_and_another_models_checkpoint_are_refused(trained, tmp_path, capsys):
    run_dir, _ = trained
    assert cli.main(["export", str(run_dir), "--step", "2", "--out", str(tmp_path / "a")]) == 2
    assert "no committed checkpoint of step 2 (committed: [3])" in capsys.readouterr().err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    assert cli.main(["export", str(run_dir), "--out", str(tmp_path / "full")]) == 2
    assert "not an empty folder" in capsys.readouterr().err
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"
    with pytest.raises(ValueError, match="is not a checkpoint of"):
        export_checkpoint(store.newest_checkpoint(run_dir), tmp_path / "b", model_path="smollm2-135m-instruct")
    assert not (tmp_path / "b").exists() and not list(tmp_path.glob(".b-*"))
