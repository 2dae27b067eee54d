"""The launcher's hard stop (rl.processes.interrupts), on a real process: a run that ignores the first interrupt
is killed with its children at the grace deadline, or at once on a second interrupt. (The graceful stop of a real
run, by SIGINT and SIGTERM: tests/e2e/test_interrupt.py.)"""

import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

pytestmark = pytest.mark.processes  # runs interrupted in child processes

# A "run" that swallows cancellation (a teardown stuck in some await) and has started a child process.
STUBBORN_RUN = textwrap.dedent(
    """
    import asyncio, subprocess, sys
    from rl.processes.interrupts import InterruptibleRun

    async def stuck():
        child = subprocess.Popen(["sleep", "600"])
        print(child.pid, flush=True)
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                print("cancelled; ignoring it", flush=True)

    InterruptibleRun(grace_s=float(sys.argv[1])).run(stuck())
    """
)


# A run that ignores the first interrupt, then ends as soon as its child dies (a run whose actors the hard stop kills),
# while the hard stop takes a while to reap what it killed (a real run's dozens of actor processes).
RUN_ENDING_WITH_ITS_CHILD = textwrap.dedent(
    """
    import asyncio, subprocess, sys, time
    from rl.processes import interrupts

    kill_descendants = interrupts.kill_descendants
    interrupts.kill_descendants = lambda: (kill_descendants(), time.sleep(2))

    async def ends_with_its_child():
        child = subprocess.Popen(["sleep", "600"])
        print(child.pid, flush=True)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            print("cancelled; ignoring it", flush=True)
        await asyncio.to_thread(child.wait)

    interrupts.InterruptibleRun(grace_s=600.0).run(ends_with_its_child())
    print("the run's own exit", file=sys.stderr, flush=True)
    """
)


def start(grace_s: float, script: str = STUBBORN_RUN) -> tuple[subprocess.Popen, int]:
    run = subprocess.Popen(
        [sys.executable, "-c", script, str(grace_s)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    return run, int(run.stdout.readline())


@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_a_run_that_does_not_stop_is_killed_with_its_children_at_the_grace_deadline(signal_number):
    run, child = start(grace_s=1.0)
    sent = time.monotonic()
    run.send_signal(signal_number)
    stdout, stderr = run.communicate(timeout=30)
    assert run.returncode == 130, stderr
    assert 1.0 <= time.monotonic() - sent < 15
    assert "cancelled; ignoring it" in stdout
    assert "rlmesh: interrupted (run did not stop within 1 s; it was waiting in:" in stderr
    assert "in stuck" in stderr  # where the run was stuck
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


@pytest.mark.parametrize("script", [STUBBORN_RUN, RUN_ENDING_WITH_ITS_CHILD], ids=["stuck_run", "run_ending_as_killed"])
def test_a_second_interrupt_stops_at_once(script):
    run, child = start(grace_s=600.0, script=script)
    run.send_signal(signal.SIGINT)
    assert run.stdout.readline() == "cancelled; ignoring it\n"
    sent = time.monotonic()
    run.send_signal(signal.SIGINT)
    _, stderr = run.communicate(timeout=30)
    assert run.returncode == 130 and time.monotonic() - sent < 10
    assert "Ctrl-C again to stop at once" in stderr
    assert "rlmesh: interrupted (second interrupt); actor processes killed" in stderr
    assert "the run's own exit" not in stderr  # the run, ending as the hard stop killed its actors, did not exit first
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
