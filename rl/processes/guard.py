"""The launcher as the child of a thin parent, so that a launcher killed by a signal still ends with a message.

Monarch 0.7.0's runtime can crash the launcher's process where no Python code can catch it. Measured with attached
workers (docs/gpus-and-clusters.md, "Faults across hosts"): a worker restarted at the address of a host whose
processes a running run had passes the messages still sent to those dead processes around until their TTL runs out
and returns them; returned to a port that is gone, such a message recurses without end in hyperactor's return path
(`return_undeliverable` -> `UndeliverableMailboxSender::post` -> `return_undeliverable`, the TTL check failing each
time) until a Tokio thread's stack overflows: SIGSEGV, on a thread with no signal stack, nothing printed.

`run_guarded` starts the launcher in its own process group (a terminal's Ctrl-C reaches only the parent, which
passes it on once), forwards SIGINT, SIGTERM and SIGHUP to it, makes it get SIGTERM if the parent dies, and returns
its exit status (negative when a signal killed it, for the caller to explain) and pid.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
from collections.abc import Sequence
from typing import NamedTuple

GUARDED_ENV = "RLMESH_GUARDED_LAUNCHER"
"""Set in the launcher started by `run_guarded`: it runs the command itself instead of guarding it again."""
FORWARDED = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
_PR_SET_PDEATHSIG = 1


class LauncherExit(NamedTuple):
    status: int
    """The launcher's exit status; -N when signal N killed it."""
    pid: int


def inside_guard() -> bool:
    return os.environ.get(GUARDED_ENV) == "1"


def _stop_with_parent() -> None:
    """In the child before exec: SIGTERM (a graceful stop, rl.processes.interrupts) when the parent dies."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def run_guarded(command: Sequence[str]) -> LauncherExit:
    """Run `command` (the launcher) to its end, forwarding signals; how it ended.

    Call it before this process starts any thread: the forwarded signals are blocked here and taken with
    `sigtimedwait`, so none is lost on another thread (the child inherits the mask; the launcher takes them with
    `sigwait` too)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    child = subprocess.Popen(
        list(command), env=os.environ | {GUARDED_ENV: "1"}, process_group=0, preexec_fn=_stop_with_parent
    )
    while child.poll() is None:
        received = signal.sigtimedwait(FORWARDED, 0.2)
        if received is not None:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(received.si_signo)
    return LauncherExit(child.returncode, child.pid)
