"""Shared fixtures: `renderer` and `tokenizer` are the real Qwen3 renderer and tokenizer of the tiny-qwen3 asset (built once per session)."""

from pathlib import Path

import pytest

from tests.support.deadline import pytest_runtest_protocol  # noqa: F401 (every test runs under a deadline)
from tests.support.spawns import (  # noqa: F401 (a test that starts a process is marked `processes`)
    _starts_processes_only_if_marked,
    pytest_configure,
    pytest_terminal_summary,
)

TESTS = Path(__file__).resolve().parent
MARKERS_OF_FOLDER = {  # tests/<folder>/... gets the markers
    "e2e": ("e2e", "processes"),
    "adversarial": ("adversarial",),
    "gpu": ("gpu", "processes"),
}


def pytest_collection_modifyitems(items):
    """Markers come from the folder (`tests/e2e/` is `e2e` and `processes`, ...)."""
    for item in items:
        folder = Path(item.fspath).resolve().relative_to(TESTS).parts[0]
        for marker in MARKERS_OF_FOLDER.get(folder, ()):
            item.add_marker(marker)


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
