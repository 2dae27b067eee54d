"""Markers that tell the truth: a test that starts a process (a subprocess, a multiprocessing worker, a fork) should be
marked `processes`, so that `pytest -m "not processes"` runs only in-process tests. An unmarked test that starts one
is listed at the end of the run; with `RLMESH_CHECK_MARKERS=1` it fails instead, naming the marker.

Processes are counted where Python starts them (`_posixsubprocess.fork_exec`, under `subprocess`, asyncio's
subprocesses and multiprocessing's spawn; `os.fork`; `os.posix_spawn`); Monarch starts its actor processes from Rust,
so a test that spawns actors is marked by hand (tests/e2e/ and tests/gpu/ are marked by folder: tests/conftest.py).
A process-wide pool started on first use (the sync reward functions' workers, `rubrics.workers`; inductor's compile
workers) counts for whichever test uses it first, which depends on the order the tests run in: that is why an
unmarked test is listed, not failed, by default.
A pytest plugin: tests/conftest.py imports its hooks.
"""

import _posixsubprocess
import functools
import os
import subprocess

import pytest

MARKER = "processes"
CHECK_ENV = "RLMESH_CHECK_MARKERS"
started = [0]
"""Processes started by this pytest process so far."""
unmarked: list[str] = []
"""Tests not marked `processes` that started one, with how many."""


def _counted(start):
    @functools.wraps(start)
    def counting(*args, **kwargs):
        started[0] += 1
        return start(*args, **kwargs)

    return counting


def pytest_configure(config: pytest.Config) -> None:
    _posixsubprocess.fork_exec = _counted(_posixsubprocess.fork_exec)
    subprocess._fork_exec = _counted(subprocess._fork_exec)  # subprocess holds its own reference
    for name in ("fork", "posix_spawn", "posix_spawnp"):
        setattr(os, name, _counted(getattr(os, name)))


@pytest.fixture(autouse=True)
def _starts_processes_only_if_marked(request: pytest.FixtureRequest):
    before = started[0]
    yield
    if started[0] > before and request.node.get_closest_marker(MARKER) is None:
        line = f"{request.node.nodeid} started {started[0] - before} process(es) but is not marked `{MARKER}`"
        if os.environ.get(CHECK_ENV) == "1":
            pytest.fail(f"{line}: add `pytestmark = pytest.mark.{MARKER}` to its module (or mark the test)", False)
        unmarked.append(line)


def pytest_terminal_summary(terminalreporter) -> None:
    if unmarked:
        terminalreporter.section(f"tests that started processes unmarked ({CHECK_ENV}=1 fails them)")
        for line in unmarked:
            terminalreporter.write_line(line)
