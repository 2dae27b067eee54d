"""The end-to-end tests' shared runs."""

from pathlib import Path

import pytest

from tests.support.paths import TINY
from tests.support.runs import EXACT_RUN, train_to_end


@pytest.fixture(scope="session")
def clean_tiny_run(tmp_path_factory) -> Path:
    """The uninterrupted `EXACT_RUN` (a checkpoint every step), once per session: the resumed and the recovered runs
    must equal it."""
    output_dir = tmp_path_factory.mktemp("clean")
    train_to_end(
        "--config",
        str(TINY),
        "--run.output_dir",
        str(output_dir),
        "--wandb.enabled",
        "false",
        "--checkpoint.every_steps",
        "1",
        *EXACT_RUN,
    )
    return output_dir / "tiny_qwen3_e2e"
