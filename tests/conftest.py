"""Shared fixtures: `renderer` and `tokenizer` are the real Qwen3 renderer and tokenizer of the tiny-qwen3 asset (built once per session)."""

from pathlib import Path

import pytest

from tests.support.deadline import pytest_runtest_protocol  # noqa: F401 (every test runs under a deadline)

TESTS = Path(__file__).resolve().parent
MARKER_OF_FOLDER = {"e2e": "e2e", "adversarial": "adversarial", "gpu": "gpu"}  # tests/<folder>/... gets the marker


HEAVIEST_FIRST = (
    "e2e/test_trainer_recovery.py",
    "e2e/test_interrupt.py",
    "e2e/test_exactly_once.py",
    "e2e/test_main_loop.py",
    "e2e/test_chaos.py",
    "e2e/test_lora.py",
    "e2e/test_services.py",
    "e2e/test_multihost.py",
    "e2e/test_agents.py",
    "e2e/test_resume.py",
    "e2e/test_algorithms.py",
    "e2e/test_tensor_parallel.py",
    "e2e/test_slurm.py",
    "e2e/test_cluster.py",
    "e2e/test_tasks.py",
    "e2e/test_sharded_trainer.py",
)
"""The slowest files, slowest first: 60-400 s each in `scripts/test.sh`'s three workers (measured 2026-11-27 on a
2-core Zen 4), the rest a few seconds to a minute. pytest-xdist hands out whole files in collection order, so these
start first and the last file to start is a short one (xdist's own order, most tests first, started the one-test
3-minute files last)."""


def pytest_collection_modifyitems(items):
    """Markers come from the folder (`tests/e2e/` is `e2e`, ...); the files in `HEAVIEST_FIRST` come first, in its
    order, the others keep theirs."""
    for item in items:
        folder = Path(item.fspath).resolve().relative_to(TESTS).parts[0]
        if folder in MARKER_OF_FOLDER:
            item.add_marker(MARKER_OF_FOLDER[folder])
    rank = {name: index for index, name in enumerate(HEAVIEST_FIRST)}
    items.sort(key=lambda item: rank.get(Path(item.fspath).resolve().relative_to(TESTS).as_posix(), len(rank)))


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
