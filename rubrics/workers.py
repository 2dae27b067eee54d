"""Sync reward functions in worker processes, with a deadline that is enforced by killing the worker.

A sync reward function may hold the GIL as long as it likes (`math_verify` on `\\boxed{2^{2^{40}}}`
held it 33 s; `\\boxed{10^{10^{8}}}` over 90 s), and a thread cannot be stopped: run in a thread it
stalls the event loop of the RewardActor -- its health probe, every other group, the rubric's own
timeout. Here each call runs in one of a few long-lived worker processes (`python -m rubrics.workers`,
started on first use): past its deadline the worker is SIGKILLed and replaced, and the call fails as
timed out, so the rollout becomes TIMEOUT and the event loop never waits on the function.

A function and its arguments travel by pickle, so module-level functions and `functools.partial`s of
them (everything a config names) qualify; a lambda or a closure cannot be pickled and runs in a thread
as before (`Rubric` logs that once per function).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import os
import pickle
import random
import signal
import struct
import subprocess
import sys
import threading
import traceback
import weakref
from collections.abc import Callable
from typing import Any

_HEADER = struct.Struct("<Q")
MAX_WORKERS = max(1, min(4, len(os.sched_getaffinity(0))))
"""Worker processes per scoring process (its usable cores, at most 4)."""


class WorkerTimeout(Exception):
    """The call ran past its deadline; its worker was killed."""


class WorkerFailed(Exception):
    """The worker died during the call (a crash, the OOM killer) or sent back something unreadable."""


class FunctionRaised(Exception):
    """The function raised in the worker; the message is its exception line."""


class _Worker:
    """One worker process; its pipes are used from one thread at a time (the pool hands it to one call)."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "rubrics.workers", str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )

    def call(self, payload: bytes) -> tuple[bool, Any]:
        """Blocking: send one request, read its reply (run in a thread)."""
        try:
            self.process.stdin.write(_HEADER.pack(len(payload)) + payload)
            self.process.stdin.flush()
            header = self.process.stdout.read(_HEADER.size)
            reply = self.process.stdout.read(_HEADER.unpack(header)[0]) if len(header) == _HEADER.size else b""
            return pickle.loads(reply)
        except (OSError, ValueError, pickle.UnpicklingError, EOFError) as exc:
            raise WorkerFailed(f"the reward worker process died (exit status {self.process.poll()})") from exc

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            try:
                pipe.close()
            except OSError:  # unflushed bytes to a dead worker
                pass


class WorkerPool:
    """At most `size` worker processes, each running one call at a time; usable from any event loop."""

    def __init__(self, size: int = MAX_WORKERS):
        self.size = size
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._slots: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()

    async def call(
        self, fn: Callable[..., Any], args: tuple[Any, ...], timeout_s: float, seed: int | None = None
    ) -> Any:
        """`fn(*args)` in a worker; `WorkerTimeout` after `timeout_s` seconds of running, `WorkerFailed` if the
        worker died, `FunctionRaised` with the function's exception line. Raises `pickle.PicklingError` (or
        the `TypeError`/`AttributeError` pickle gives) before running anything when `fn` or `args` cannot be sent.
        `seed`: `random` (and numpy's global RNG, when the worker has numpy) is seeded with it before the call, so
        what the function draws does not depend on which worker serves it or what it ran before."""
        payload = pickle.dumps((list(sys.path), seed, pickle.dumps((fn, args))))  # the import path as it is now
        slots = self._slots.setdefault(asyncio.get_running_loop(), asyncio.Semaphore(self.size))
        async with slots:
            with self._lock:
                worker = self._idle.pop() if self._idle else None
            if worker is None or worker.process.poll() is not None:
                # PR_SET_PDEATHSIG fires when the *thread* that started the worker ends: start it from a thread
                # that lives as long as this process (an executor's idle thread waits for work until exit)
                worker = await asyncio.wrap_future(_SPAWNER.submit(_Worker))
            running = asyncio.ensure_future(asyncio.to_thread(worker.call, payload))
            try:
                ok, value = await asyncio.wait_for(asyncio.shield(running), timeout_s)
            except BaseException as exc:  # a timeout, a cancellation, a dead worker: the worker goes
                await asyncio.to_thread(worker.kill)  # ends the blocked read, so the thread ends too
                await asyncio.gather(running, return_exceptions=True)
                if isinstance(exc, asyncio.TimeoutError):
                    raise WorkerTimeout(f"killed after {timeout_s:g} s") from None
                raise
            with self._lock:
                self._idle.append(worker)
        if not ok:
            raise FunctionRaised(value)
        return value


_SPAWNER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward-worker-spawner")
_POOL = WorkerPool()


def pool() -> WorkerPool:
    """This process's pool."""
    return _POOL


def _serve(parent_pid: int) -> None:
    """The worker: run each `(fn, args)` request and send back `(ok, value or error text)`, until stdin closes."""
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the process that started us
    if os.getppid() != parent_pid:
        return
    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # what the functions print must not corrupt the replies
    while header := requests.read(_HEADER.size):
        path, seed, call = pickle.loads(requests.read(_HEADER.unpack(header)[0]))
        try:
            if path != sys.path:
                sys.path[:] = path
                importlib.invalidate_caches()
            fn, args = pickle.loads(call)
            if seed is not None:
                _seed(seed)
            reply = pickle.dumps((True, fn(*args)))
        except BaseException as exc:
            reply = pickle.dumps((False, "".join(traceback.format_exception_only(type(exc), exc)).strip()))
        replies.write(_HEADER.pack(len(reply)) + reply)
        replies.flush()


def _seed(seed: int) -> None:
    """Seed the worker's `random` and, when a function imported it, numpy's global RNG (which takes 32 bits)."""
    random.seed(seed)
    if (numpy := sys.modules.get("numpy")) is not None:
        numpy.random.seed(seed % 2**32)


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
