"""Offline model assets: built once, deterministic, loadable with transformers."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from rl import assets
from rl.assets import resolve_model_path, smollm2_path, tiny_qwen3_path


def test_cached_build_is_atomic_and_runs_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RLMESH_CACHE", str(tmp_path))
    (tmp_path / "thing").mkdir()
    (tmp_path / "thing" / "partial").write_text("left by a crashed build")
    calls = []

    def build(out):
        calls.append(out)
        (out / "data").write_text("built")

    path = assets._cached("thing", build)
    assert path == tmp_path / "thing"
    assert sorted(p.name for p in path.iterdir()) == [".rlmesh-complete", "data"]
    built = capsys.readouterr().err.splitlines()  # a launch that builds says so: its first minute is not silent
    assert built[0] == f"rlmesh: building the model assets thing into {path} (first use)"
    assert built[1].startswith("rlmesh: built thing in ") and len(built) == 2
    assert assets._cached("thing", build) == path
    assert capsys.readouterr().err == ""  # built already: nothing to say
    assert len(calls) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["thing"]  # no temporary folder left


def test_tiny_qwen3_build_is_deterministic(tmp_path, monkeypatch):
    folders = []
    for name in ("a", "b"):
        monkeypatch.setenv("RLMESH_CACHE", str(tmp_path / name))
        folders.append(tiny_qwen3_path())
    first, second = folders
    assert first != second
    files = sorted(p.name for p in first.iterdir())
    assert "model.safetensors" in files
    assert files == sorted(p.name for p in second.iterdir())
    for file in files:
        assert (first / file).read_bytes() == (second / file).read_bytes(), file


def test_tiny_qwen3_is_a_tiny_qwen3_on_the_qwen3_tokenizer():
    path = tiny_qwen3_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.dtype == torch.float32
    assert model.config.vocab_size == len(tokenizer) == 151669
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert sum(p.numel() for p in model.parameters()) == 9_805_568  # 151669 x 64 embeddings + 2 layers
    assert tokenizer.eos_token == "<|im_end|>"
    generation = GenerationConfig.from_pretrained(path)
    assert generation.eos_token_id == [151645, 151643]  # <|im_end|>, <|endoftext|>


def test_smollm2_loads_with_transformers_and_answers():
    path = smollm2_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.dtype == torch.bfloat16
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2
    assert GenerationConfig.from_pretrained(path).eos_token_id == 2

    messages = [{"role": "user", "content": "What is 2+3? Answer with just the number."}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        output = model.generate(**prompt, max_new_tokens=16, do_sample=False)
    reply = output[0, prompt["input_ids"].shape[1] :].tolist()
    assert reply[-1] == 2  # stopped at <|im_end|>
    assert "5" in tokenizer.decode(reply, skip_special_tokens=True)


@pytest.mark.parametrize("name", ["tiny-qwen3", "smollm2-135m-instruct"])
def test_resolve_builtin_names(name):
    assert resolve_model_path(name) == str(assets.cache_dir() / name)


def test_resolve_passes_other_paths_through():
    assert resolve_model_path("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"
    assert resolve_model_path("/some/checkpoint") == "/some/checkpoint"


def test_the_large_random_qwen3_is_a_real_decoder_at_1_5_gb_with_the_tiny_tokenizer():
    """Built on first use (about 10 s); a whole extra copy of it shows in any memory bound."""
    from transformers import AutoConfig

    from rl.assets import BUILT_AT_SETUP, random_qwen3_1_5gb_path
    from rl.checkpoint.estimate import model_size

    assert "random-qwen3-1.5gb" not in BUILT_AT_SETUP  # the suite's set-up does not pay for it
    path = random_qwen3_1_5gb_path()
    config, tiny = AutoConfig.from_pretrained(path), AutoConfig.from_pretrained(tiny_qwen3_path())
    assert config.model_type == tiny.model_type == "qwen3" and config.num_hidden_layers >= 40
    size = model_size("random-qwen3-1.5gb")
    assert size.parameters * 4 >= 1.5e9 and (path / "model.safetensors").stat().st_size >= 1.5e9
    assert size.largest_elements <= size.parameters / 3  # the tied embedding: 116M of 381M
    assert (path / "tokenizer.json").read_bytes() == (tiny_qwen3_path() / "tokenizer.json").read_bytes()
