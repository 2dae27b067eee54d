"""The IO pump of one sandboxed call: the request fed to stdin, stdout read as it arrives up to its cap, stderr's
tail kept, the wall-clock limit, and the process tree killed and reaped whatever ends the call."""

from __future__ import annotations

import asyncio
import os
import signal

from tools import cgroup
from tools.sandbox.limits import MAX_OUTPUT_BYTES, STDERR_TAIL_BYTES, SandboxError, SandboxLimits

_CHUNK = 1 << 16


async def communicate(
    command: list[str],
    env: dict[str, str],
    cwd: str,
    request: bytes,
    limits: SandboxLimits,
    group: cgroup.CallCgroup | None,
) -> tuple[int, bytes, bytes]:
    """Run one call: (exit status, stdout, stderr's tail); a `SandboxError` when it overflowed or timed out."""
    process = await asyncio.create_subprocess_exec(
        *command,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=cwd,
        env=env,
        start_new_session=True,
    )
    stdout, stderr = bytearray(), bytearray()
    overflow = asyncio.Event()

    async def feed() -> None:
        try:
            process.stdin.write(request)
            await process.stdin.drain()
            process.stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            pass

    async def drain_stdout() -> None:
        while chunk := await process.stdout.read(_CHUNK):
            stdout.extend(chunk)
            if len(stdout) > MAX_OUTPUT_BYTES:
                overflow.set()
                return

    async def drain_stderr() -> None:
        while chunk := await process.stderr.read(_CHUNK):
            stderr.extend(chunk)
            del stderr[:-STDERR_TAIL_BYTES]

    async def finish() -> None:
        await asyncio.gather(feed(), drain_stdout(), drain_stderr())
        await process.wait()

    finished = asyncio.ensure_future(finish())
    stopped = asyncio.ensure_future(overflow.wait())
    try:
        done, _ = await asyncio.wait({finished, stopped}, timeout=limits.timeout_s, return_when=asyncio.FIRST_COMPLETED)
        if stopped in done:
            raise SandboxError(f"the tool wrote more than {MAX_OUTPUT_BYTES >> 20} MiB of output and was stopped")
        if finished not in done:
            raise SandboxError(f"the tool took longer than {limits.timeout_s:g} s and was stopped")
        finished.result()
    finally:
        stopped.cancel()
        if process.returncode is None:
            _kill_group(process.pid)
        if group is not None:
            await asyncio.shield(asyncio.to_thread(group.kill))
        finished.cancel()
        await asyncio.shield(_reap(process, finished))
    return process.returncode, bytes(stdout), bytes(stderr)


async def _reap(process: asyncio.subprocess.Process, readers: asyncio.Future) -> None:
    """Wait for the killed tool's exit. asyncio's `wait()` returns only once every pipe is closed, and a stdout that
    stopped being read (the output cap) is paused with bytes left in it: read both pipes to their end first."""
    await asyncio.wait({readers})
    process.stdin.close()
    while await process.stdout.read(_CHUNK):
        pass
    while await process.stderr.read(_CHUNK):
        pass
    await process.wait()


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
