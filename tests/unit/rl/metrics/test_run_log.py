"""RUN_DIR/run.log: the controller's warnings and the actor processes' stderr, kept off the console."""

import os
import subprocess
import sys
import warnings

import pytest

from rl.metrics.run_log import LOG_FILE_ENV, RunLog
from tests.support.paths import REPO

ACTOR_PROCESS = (
    "from rl.metrics.run_log import redirect_actor_process; import os, sys; redirect_actor_process(); "
    "os.write(2, b'[W] NUMA binding note\\n'); print('FutureWarning from a dependency', file=sys.stderr)"
)


def actor_process(env):
    return subprocess.run(
        [sys.executable, "-c", ACTOR_PROCESS], env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True
    )


@pytest.mark.processes
def test_warnings_and_actor_stderr_land_in_the_run_log_even_when_an_actor_opens_it_late(tmp_path):
    run_log = RunLog(tmp_path)
    try:
        early = actor_process(os.environ.copy())
        with warnings.catch_warnings():
            warnings.showwarning = run_log._write_warning
            warnings.warn("old API", FutureWarning, stacklevel=2)
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        run_log.move_into(run_dir)
        late = actor_process(os.environ.copy())  # opens the hidden name after the run dir got its own
    finally:
        run_log.close()
    assert early.stderr == late.stderr == ""  # nothing reached the console
    text = (run_dir / "run.log").read_text()
    assert text.count("NUMA binding note") == 2 and text.count("FutureWarning from a dependency") == 2
    assert "FutureWarning: old API" in text
    assert LOG_FILE_ENV not in os.environ and [path.name for path in tmp_path.iterdir()] == ["run"]


def test_a_resumed_run_keeps_its_earlier_log(tmp_path):
    (tmp_path / "run.log").write_text("earlier\n")
    run_log = RunLog(tmp_path.parent / f"{tmp_path.name}-out")
    run_log.move_into(tmp_path)
    run_log.close()
    assert (tmp_path / "run.log").read_text() == "earlier\n" and (tmp_path / "run.1.log").exists()


def test_the_controller_process_itself_is_never_redirected(tmp_path):
    run_log = RunLog(tmp_path)
    try:
        from rl.metrics.run_log import redirect_actor_process

        before = os.fstat(2).st_ino
        redirect_actor_process()
        assert os.fstat(2).st_ino == before
    finally:
        run_log.close()
