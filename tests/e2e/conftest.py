"""The end-to-end tests' shared runs."""

import fcntl
import os
from pathlib import Path

import pytest

from tests.support.paths import TINY
from tests.support.runs import EXACT_RUN, train_to_end


def session_dir(tmp_path_factory) -> Path:
    """A directory of this test session that every pytest-xdist worker sees (the workers' own temporary
    directories are `popen-gw<N>` inside it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def clean_tiny_run(tmp_path_factory) -> Path:
    """The uninterrupted `EXACT_RUN` (a checkpoint every step), once per test session: the resumed and the recovered
    runs must equal it. Their files may run in different workers, so the first to need it trains it under a lock and
    the others read it."""
    shared = session_dir(tmp_path_factory)
    output_dir = shared / "clean_tiny_run"
    with open(shared / "clean_tiny_run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (output_dir / "trained").exists():
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
            (output_dir / "trained").touch()
    return output_dir / "tiny_qwen3_e2e"
