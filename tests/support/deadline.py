"""A deadline on every test: a test (with its fixtures) still running after `RLMESH_TEST_DEADLINE_S` (default
1200 s) prints every thread's stack, kills the processes it started and ends the pytest run with exit 1, so a hung
vLLM engine, store or actor fails CI in minutes instead of holding it until the job's own time limit.
A pytest plugin: tests/conftest.py imports its hook."""

import faulthandler
import os
import sys
import threading

import psutil
import pytest

DEFAULT_DEADLINE_S = 1200.0  # the slowest e2e tests (chaos, exactly-once) allow their runs 900 s


def deadline_s() -> float:
    return float(os.environ.get("RLMESH_TEST_DEADLINE_S") or DEFAULT_DEADLINE_S)


def start_deadline(item: pytest.Item) -> threading.Timer:
    """Arm the deadline for `item`; cancel the returned timer when the test ends."""
    capture = item.config.pluginmanager.getplugin("capturemanager")
    seconds = deadline_s()

    def expire() -> None:
        if capture is not None:
            capture.suspend_global_capture(in_=False)  # write to the real stderr, not the test's captured one
        sys.stderr.write(f"\n{item.nodeid}: still running after {seconds:g} s (RLMESH_TEST_DEADLINE_S); stacks:\n")
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        for child in psutil.Process().children(recursive=True):
            try:
                child.kill()
            except psutil.Error:
                pass
        os._exit(1)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    return timer


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    deadline = start_deadline(item)
    try:
        yield
    finally:
        deadline.cancel()
