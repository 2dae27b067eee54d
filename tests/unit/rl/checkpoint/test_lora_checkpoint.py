"""Checkpoints and export of a `trainer.lora` run: the checkpoint holds the adapters and their optimizer state (the base
comes from the model's files), a resume continues bitwise, and `rlmesh export` writes the PEFT adapter and the merged
model, both computing what the trained adapters computed when loaded with no rlmesh import.

The trainer's objects are built as the trainer builds them (`rl.training.lora.with_adapters` on the tiny Qwen3, AdamW
over the trainable parameters) and written by its own writer (`store.write(path, store.TRAINER, ...)`).
"""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from rl.assets import resolve_model_path
from rl.checkpoint import store
from rl.checkpoint.estimate import checkpoint_bytes, model_size
from rl.checkpoint.export import read_model_state
from rl.commands import cli
from rl.config.lora import LoraConfig
from rl.training.lora import with_adapters
from tests.support.score_export import score_in_fresh_process

pytestmark = pytest.mark.processes  # the export is loaded in a Python without rlmesh

LORA = LoraConfig(enabled=True, rank=4, alpha=6.0, target_modules=["q_proj", "v_proj", "down_proj"])
"""alpha / rank = 1.5: not the 2 of the shipped configs, nor a power of two (the merge rounds W + 1.5 B A once)."""
PROBE = [[151644, 872, 198, 3838, 374, 279, 2629, 315, 279, 18509, 315, 220, 19, 22, 30], list(range(100, 140))]


def base_model() -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-qwen3"), dtype=torch.float32)


def adapted() -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """The trainer's LoRA policy, optimizer and schedule (fresh adapters: B = 0)."""
    torch.manual_seed(0)
    model = with_adapters(base_model(), LORA)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    return model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def update(model, optimizer, scheduler, seed: int) -> None:
    """One AdamW step on a language-modelling loss of random tokens drawn from `seed`."""
    ids = torch.randint(0, 1000, (2, 24), generator=torch.Generator().manual_seed(seed))
    model(ids, labels=ids).loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()


def logprobs(model: torch.nn.Module, ids: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1]
    return torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1).tolist()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run directory whose committed checkpoint (step 2) holds the adapters after two updates, and the model."""
    run_dir = tmp_path_factory.mktemp("run")
    model, optimizer, scheduler = adapted()
    update(model, optimizer, scheduler, 1)
    update(model, optimizer, scheduler, 2)
    tmp = store.begin(run_dir, 2)
    store.write(tmp, store.TRAINER, model, optimizer, scheduler)
    (tmp / "run_state.json").write_text(json.dumps({"step": 2}))
    lora = "".join(f"{key} = {json.dumps(value)}\n" for key, value in LORA.model_dump().items())
    (tmp / "config.toml").write_text(f'[model]\npath = "tiny-qwen3"\n[trainer.lora]\n{lora}')
    store.commit(run_dir, tmp, 2, keep=2)
    return run_dir, model, optimizer, scheduler


def test_the_checkpoint_holds_the_adapters_alone(trained):
    run_dir, model, _, _ = trained
    state = read_model_state(store.newest_checkpoint(run_dir))
    adapters = {name: p for name, p in model.named_parameters() if "lora_" in name}
    assert len(adapters) == 2 * 3 * base_model().config.num_hidden_layers  # A and B of 3 layers per block
    assert sorted(state) == sorted(adapters)
    for name, parameter in adapters.items():
        assert torch.equal(state[name], parameter.detach()), name
    written = sum(file.stat().st_size for file in (store.newest_checkpoint(run_dir) / "trainer").glob("*.distcp"))
    estimate = checkpoint_bytes(model_size("tiny-qwen3", LORA), "float32", "full")  # adapters + their AdamW moments
    assert estimate == 3 * 4 * sum(parameter.numel() for parameter in adapters.values())
    framing = 64 * 1024 + 4096 * 3 * len(adapters)  # DCP's own, ~2 KB per tensor: it outweighs tensors this small
    assert estimate <= written <= estimate * 1.01 + framing


def test_a_resumed_lora_run_continues_bitwise(trained):
    run_dir = trained[0]
    uninterrupted = adapted()
    for seed in (1, 2, 3):
        update(*uninterrupted, seed)
    resumed = adapted()
    update(*resumed, 99)  # state that the checkpoint must replace entirely
    store.load_trainer(store.newest_checkpoint(run_dir), *resumed)
    update(*resumed, 3)
    for (name, expected), actual in zip(uninterrupted[0].state_dict().items(), resumed[0].state_dict().values()):
        assert torch.equal(actual, expected), name
    assert resumed[2].state_dict() == uninterrupted[2].state_dict()


def test_the_export_is_the_peft_adapter_and_the_merged_model(trained, tmp_path, capsys):
    run_dir, model, _, _ = trained
    model = model.eval()
    out = tmp_path / "export"
    assert cli.main(["export", str(run_dir), "--step", "2", "--out", str(out)]) == 0
    # the adapter's hint loads the base as the run trained it (float32), whatever dtype the base folder is in
    hint = f"peft.AutoPeftModelForCausalLM.from_pretrained({str(out / 'adapter')!r}, dtype=torch.float32)"
    assert f"its LoRA adapter alone: {hint} (the base in float32, as the run trained it)" in capsys.readouterr().out
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {path.name for path in (out / "adapter").iterdir()}
    scored = score_in_fresh_process(out, PROBE, ["transformers", "peft"], tmp_path)
    base = base_model()
    for ids, from_merged, from_adapter in zip(PROBE, scored["transformers"], scored["peft"]):
        expected = logprobs(model, ids)
        assert max(abs(a - b) for a, b in zip(from_merged, expected)) <= 1e-5  # W + s B A rounded once
        assert max(abs(a - b) for a, b in zip(from_adapter, expected)) <= 1e-6
        assert max(abs(a - b) for a, b in zip(logprobs(base, ids), expected)) > 1e-2  # the adapters matter


def test_the_printed_adapter_hint_loads_the_runs_policy_on_a_base_folder_in_bf16(tmp_path, capsys):
    """The base folder says bf16 (as SmolLM2's does), the run trained on it in fp32: the printed hint, run as printed,
    gives the trained policy; loading the base in its folder's dtype does not."""
    import shutil

    import peft

    bf16_base = tmp_path / "bf16-base"
    shutil.copytree(resolve_model_path("tiny-qwen3"), bf16_base)
    config = json.loads((bf16_base / "config.json").read_text())
    (bf16_base / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}))
    torch.manual_seed(0)
    model = with_adapters(AutoModelForCausalLM.from_pretrained(bf16_base, dtype=torch.float32), LORA)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    update(model, optimizer, scheduler, 1)
    run_dir = tmp_path / "run"
    tmp = store.begin(run_dir, 1)
    store.write(tmp, store.TRAINER, model, optimizer, scheduler)
    (tmp / "run_state.json").write_text(json.dumps({"step": 1}))
    lora = "".join(f"{key} = {json.dumps(value)}\n" for key, value in LORA.model_dump().items())
    trainer = '[trainer]\nparam_dtype = "float32"\n'
    (tmp / "config.toml").write_text(f'[model]\npath = "{bf16_base}"\n{trainer}[trainer.lora]\n{lora}')
    store.commit(run_dir, tmp, 1, keep=1)
    out = tmp_path / "export"
    assert cli.main(["export", str(run_dir), "--out", str(out)]) == 0
    hint = capsys.readouterr().out.split("its LoRA adapter alone: ")[1].split(" (the base in")[0]
    loaded = eval(hint, {"peft": peft, "torch": torch}).eval()  # the hint as printed
    as_folder = peft.AutoPeftModelForCausalLM.from_pretrained(out / "adapter").eval()  # the base folder's bf16
    model = model.eval()
    for ids in PROBE:
        expected = logprobs(model, ids)
        assert max(abs(a - b) for a, b in zip(logprobs(loaded, ids), expected)) <= 1e-6
        assert max(abs(a - b) for a, b in zip(logprobs(as_folder, ids), expected)) > 1e-4  # another policy
