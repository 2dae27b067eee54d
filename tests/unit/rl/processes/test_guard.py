"""The guarded launcher (rl.processes.guard) on real processes: a child killed by SIGSEGV is reported by its status, a
signal sent to the guard reaches the child once, and a guard that dies takes its child down with SIGTERM."""

import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.processes  # the guard and its launcher are processes

GUARD = textwrap.dedent(
    """
    import sys
    from rl.processes.guard import run_guarded

    ended = run_guarded(sys.argv[1:])
    print("ended", ended.status, ended.pid, flush=True)
    """
)


def guard(*child: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", GUARD, sys.executable, "-c", *child], stdout=subprocess.PIPE, text=True
    )


def test_a_child_killed_by_sigsegv_ends_with_a_negative_status():
    run = guard("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    out, _ = run.communicate(timeout=60)
    assert run.returncode == 0 and out.split()[:2] == ["ended", str(-signal.SIGSEGV)], out


# The child takes the forwarded signals as the launcher does (blocked, inherited from the guard; `sigwait`), after
# saying it is ready, and exits with 100 + the number of the first one; a second one within 1 s would exit 50.
WAITS_FOR_A_SIGNAL = textwrap.dedent(
    """
    import signal, sys
    print("ready", flush=True)
    first = signal.sigwait({signal.SIGINT, signal.SIGTERM})
    if signal.sigtimedwait({signal.SIGINT, signal.SIGTERM}, 1.0) is not None:
        sys.exit(50)
    sys.exit(100 + first)
    """
)


def test_a_signal_sent_to_the_guard_reaches_the_launcher_once():
    run = guard(WAITS_FOR_A_SIGNAL)
    assert run.stdout.readline().strip() == "ready"
    run.send_signal(signal.SIGINT)
    out, _ = run.communicate(timeout=60)
    assert out.split()[:2] == ["ended", str(100 + signal.SIGINT)], out


def test_the_launcher_gets_sigterm_when_its_guard_dies(tmp_path):
    marker = tmp_path / "terminated"
    run = guard(
        f"import os, signal, pathlib; print('ready', flush=True); signal.sigwait({{signal.SIGTERM}}); "
        f"pathlib.Path({str(marker)!r} + '.partial').write_text('SIGTERM'); "
        f"os.replace({str(marker)!r} + '.partial', {str(marker)!r})"  # whole, or absent: the poll below reads it once
    )
    assert run.stdout.readline().strip() == "ready"
    run.kill()
    run.wait(timeout=30)
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.read_text() == "SIGTERM"
