"""Ctrl-C that always stops a run: a graceful stop first, a hard stop on a second Ctrl-C or a deadline.

Why not asyncio's own SIGINT handling: CPython runs Python signal handlers only on the main
thread, and on Linux a process-directed SIGINT is delivered to any thread that does not block
it. The launcher has many threads (Monarch's Rust runtime, its actor event loops, telemetry).
When the signal lands on one of them, CPython (3.11, POSIX) marks it pending but does not arm
the main thread's eval breaker, and asyncio sets no wakeup fd; the main thread, mostly idle in
`epoll_wait`, then runs the handler only when some other event happens to re-arm it — often
never. That was the lost Ctrl-C.

So the launcher blocks SIGINT/SIGTERM in its main thread before any other thread exists
(every later thread, and every actor process, inherits the mask) and one watcher thread takes
them with `sigwait`. The first one cancels the run's main task, which tears the actors down;
a second one, or `grace_s` without the run ending, kills every descendant process and exits.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from collections.abc import Coroutine
from typing import Any

import psutil

from rl.processes.bootstrap import is_actor_process

_SIGNALS = {signal.SIGINT, signal.SIGTERM}
EXIT_INTERRUPTED = 130


def kill_descendants() -> None:
    """SIGKILL every process this one started, children of children included."""
    reap(psutil.Process().children(recursive=True), timeout_s=0)


def monarch_processes() -> list[psutil.Process]:
    """This process's Monarch actor processes and their children (not, e.g., wandb's service)."""
    found = []
    for child in psutil.Process().children():
        try:
            if is_actor_process(child.cmdline()):
                found += [child, *child.children(recursive=True)]
        except psutil.Error:
            continue
    return found


def local_processes(pids: list[int]) -> list[psutil.Process]:
    """The processes among `pids` that are this process's descendants (actor processes on this host), with their children."""
    found = []
    for child in psutil.Process().children(recursive=True):
        if child.pid in pids:
            try:
                found += [child, *child.children(recursive=True)]
            except psutil.Error:
                found.append(child)
    return found


def reap(processes: list[psutil.Process], timeout_s: float) -> None:
    """Wait up to `timeout_s` for `processes` to exit, then SIGKILL the ones left."""
    _, alive = psutil.wait_procs(processes, timeout=timeout_s)
    for process in alive:
        try:
            process.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)


class InterruptibleRun:
    """Runs one coroutine as the run's main task, stoppable by Ctrl-C or SIGTERM from any thread."""

    def __init__(self, grace_s: float = 20.0):
        self.grace_s = grace_s
        self._deadline = float("inf")  # monotonic time of the hard stop, once interrupted
        self.interrupted = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._lock = threading.Lock()
        self._hard_stopping = threading.Event()
        signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        threading.Thread(target=self._watch, name="rlmesh-signals", daemon=True).start()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run `coro` to completion; raises `KeyboardInterrupt` if it was interrupted."""
        with asyncio.Runner() as runner:
            loop = runner.get_loop()
            task = loop.create_task(coro)
            with self._lock:
                self._loop, self._task = loop, task
                if self.interrupted.is_set():
                    task.cancel()
            try:
                return loop.run_until_complete(task)
            except asyncio.CancelledError:
                if self.interrupted.is_set():
                    raise KeyboardInterrupt from None
                raise
            finally:
                if self._hard_stopping.is_set():
                    threading.Event().wait()  # the hard stop is killing the actors and ends the process: say nothing

    def _watch(self) -> None:
        signal.sigwait(_SIGNALS)
        self.interrupted.set()
        print(
            "\nrlmesh: interrupt received, stopping the run (Ctrl-C again to stop at once)", file=sys.stderr, flush=True
        )
        with self._lock:
            if self._loop is not None and self._task is not None:
                self._loop.call_soon_threadsafe(self._task.cancel)
        self.extend(self.grace_s)
        threading.Thread(target=self._hard_stop_after_grace, name="rlmesh-grace", daemon=True).start()
        signal.sigwait(_SIGNALS)
        self._hard_stop("second interrupt")

    def extend(self, seconds: float) -> None:
        """Push the hard stop to `seconds` from now (from any thread): the Ctrl-C checkpoint's save, then the teardown."""
        with self._lock:
            now = time.monotonic()
            self._deadline = now + seconds if self._deadline == float("inf") else max(self._deadline, now + seconds)

    def _hard_stop_after_grace(self) -> None:
        start = time.monotonic()
        while (left := self._deadline - time.monotonic()) > 0:
            threading.Event().wait(left)
        waited = time.monotonic() - start
        self._hard_stop(f"run did not stop within {waited:.0f} s; it was waiting in:\n{self._where()}")

    def _where(self) -> str:
        """Where the run's main task is suspended (innermost last), for the hard-stop message."""
        if self._task is None:
            return "  (not started)"
        lines, awaited = [], self._task.get_coro()
        while awaited is not None and getattr(awaited, "cr_frame", None) is not None:
            frame = awaited.cr_frame
            lines.append(f"  {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
            awaited = awaited.cr_await
        return "\n".join(lines[-6:]) or "  (finished)"

    def _hard_stop(self, why: str) -> None:
        self._hard_stopping.set()  # the run, ending as its actors die, must not exit first with another message
        kill_descendants()
        print(f"rlmesh: interrupted ({why}); actor processes killed", file=sys.stderr, flush=True)
        os._exit(EXIT_INTERRUPTED)
