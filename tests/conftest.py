"""Shared fixtures: `renderer` and `tokenizer` are the real Qwen3 renderer and tokenizer of the tiny-qwen3 asset (built once per session)."""

from pathlib import Path

import pytest

from tests.support.deadline import pytest_runtest_protocol  # noqa: F401 (every test runs under a deadline)

TESTS = Path(__file__).resolve().parent
MARKER_OF_FOLDER = {"e2e": "e2e", "adversarial": "adversarial", "gpu": "gpu"}  # tests/<folder>/... gets the marker


def pytest_collection_modifyitems(items):
    """Markers come from the folder (`tests/e2e/` is `e2e`, ...)."""
    for item in items:
        folder = Path(item.fspath).resolve().relative_to(TESTS).parts[0]
        if folder in MARKER_OF_FOLDER:
            item.add_marker(MARKER_OF_FOLDER[folder])


@pytest.fixture(scope="session")
def renderer():
    from env_types.renderer import build_renderer
    from rl.config.tasks import RendererConfig

    return build_renderer(RendererConfig(name="qwen3"), "tiny-qwen3")


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import AutoTokenizer

    from rl.assets import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path("tiny-qwen3"))
