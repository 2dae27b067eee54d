"""A pytest plugin that records when each test ran and in which pytest-xdist worker, for
benchmarks/suite_timeline.py: `RLMESH_TIMELINE=FILE PYTHONPATH=$PWD PYTEST_ADDOPTS="-p tests.support.timeline"
scripts/test.sh` appends one JSON line per test (worker, node id, start and end, wall-clock seconds) to FILE."""

import json
import os
import time

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start = time.time()
    yield
    path = os.environ.get("RLMESH_TIMELINE")
    if path:
        record = {"worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "test": item.nodeid, "start": start}
        with open(path, "a") as out:  # one short append per test: lines from the workers do not interleave
            out.write(json.dumps({**record, "end": time.time()}) + "\n")
