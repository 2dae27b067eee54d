"""Shared fixtures: `renderer` and `tokenizer` are the real Qwen3 renderer and tokenizer of the tiny-qwen3 asset (built once per session)."""

import pytest


@pytest.fixture(scope="session")
def renderer():
    from rl.renderer import RendererConfig

    return RendererConfig(name="qwen3").build("tiny-qwen3")


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import AutoTokenizer

    from rl.assets import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path("tiny-qwen3"))
