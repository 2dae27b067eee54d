"""The GPU suite (tests/gpu/, marker `gpu`): the trainer's GPU paths, runnable from the source tree on a machine with
CUDA torch, transformers and a few carried pure-Python wheels, without vLLM or Monarch (docs/gpus-and-clusters.md).
Every test is skipped, with the reason, where no CUDA device is present. `benchmarks/gpu_suite.py` runs the suite
and writes what the tests measured (the `record` fixture) as JSON."""

import json
import os
from pathlib import Path

import pytest
import torch

RESULTS_ENV = "RLMESH_GPU_RESULTS"
"""File the measured numbers are written to at the end of the session (set by benchmarks/gpu_suite.py)."""
_measured: dict[str, dict] = {}


HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    """Skip this folder's tests before any of their fixtures start (a process group, a model on the GPU)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device (torch.cuda.is_available() is False): the GPU suite needs one")
    for item in items:
        if HERE in Path(item.fspath).resolve().parents:
            item.add_marker(skip)


@pytest.fixture
def record(request):
    """`record(name=value, ...)`: numbers this test measured, kept under its node id."""

    def put(**values) -> None:
        _measured.setdefault(request.node.nodeid, {}).update(values)

    return put


def pytest_sessionfinish(session):
    path = os.environ.get(RESULTS_ENV)
    if path:
        Path(path).write_text(json.dumps(_measured, indent=2, sort_keys=True))
