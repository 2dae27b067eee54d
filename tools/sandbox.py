"""Running tool code on model-chosen arguments in a sandboxed subprocess.

Every call runs `fn(**arguments)` in a fresh Python process and returns its result as text, or
a `SandboxError` saying what stopped it. What the sandbox enforces, all through the Linux
kernel, without root (unprivileged user namespaces through `unshare`, checked at start):

- no network: the process gets its own network namespace, with no interface but a loopback
  that is down, so every connection fails (binding works, but nothing can reach the socket);
- one writable directory: in its own mount namespace every mount is re-mounted read-only except
  the sandbox's scratch directory (the process's working directory, `HOME` and `TMPDIR`), and
  then every capability is dropped (`setpriv`), so it cannot re-mount anything writable;
- its own PID namespace: it cannot see or signal other processes, and when it ends the kernel
  kills everything it started;
- limits (`setrlimit`): address space `memory_mb`, CPU time, size of any file written, open
  files; and a wall-clock `timeout_s` after which the whole process tree is killed.

What it does not do: it can still read what the user running rlmesh can read; it has no
syscall filter (seccomp) and no cgroup, so the number of processes it starts is not capped
(they all die with it); the scratch directory lives as long as the `Sandbox` (one per rollout
in `ToolEnv`), so calls of one rollout share files. `isolate=False` keeps only the limits and
the timeout, for machines without user namespaces: then there is NO network or file-system
isolation.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import io
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import traceback
from contextlib import redirect_stdout
from dataclasses import dataclass
from typing import Any

# Runs inside the new namespaces as the namespace's root: make every mount but the scratch
# directory read-only, then drop all capabilities for good and exec the tool runner.
_SETUP = r"""
set -eu
mount --bind "$RLMESH_SCRATCH" "$RLMESH_SCRATCH"
for target in $(awk '{print $5}' /proc/self/mountinfo | sort -u); do
    [ "$target" = "$RLMESH_SCRATCH" ] && continue
    mount -o remount,bind,ro "$target"
done
cd "$RLMESH_SCRATCH"  # the working directory was resolved before the bind mount: re-enter it on the writable one
exec setpriv --inh-caps=-all --bounding-set=-all --no-new-privs -- "$@"
"""

_MAX_OUTPUT_BYTES = 1 << 20


class SandboxError(Exception):
    """A tool call that did not return: it raised, ran out of time or memory, or broke a rule."""


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 5.0
    """Wall-clock time of one call, process start included."""
    cpu_s: int = 5
    memory_mb: int = 512
    """Address-space limit of the tool process (Python itself needs ~30 MB of it)."""
    max_file_mb: int = 16
    max_open_files: int = 64


@functools.cache
def namespaces_available() -> bool:
    """Whether unprivileged user, network, PID and mount namespaces work on this machine."""
    if shutil.which("unshare") is None or shutil.which("setpriv") is None:
        return False
    probe = ["unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--mount", "true"]
    return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0


class Sandbox:
    """A scratch directory and the means to run tool functions confined to it."""

    def __init__(self, limits: SandboxLimits = SandboxLimits(), *, isolate: bool = True):
        if isolate and not namespaces_available():
            raise RuntimeError(
                "the tool sandbox needs unprivileged user namespaces (`unshare --user --net --pid --mount`) and "
                "`setpriv`; they are not available here. Pass isolate=False to run tools with limits only "
                "(no network or file-system isolation)."
            )
        self.limits = limits
        self.isolate = isolate
        self.scratch = os.path.realpath(tempfile.mkdtemp(prefix="rlmesh-sandbox-"))

    async def run(self, fn_path: str, arguments: dict[str, Any]) -> str:
        """`fn(**arguments)` in the sandbox, `fn` given as `package.module:function`; its result as text."""
        command = [sys.executable, "-m", "tools.sandbox"]
        if self.isolate:
            command = [
                "unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child=SIGKILL",
                "--mount", "--mount-proc", "sh", "-c", _SETUP, "sandbox-setup", *command,
            ]
        python_path = os.pathsep.join(path for path in sys.path if path)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": python_path, "HOME": self.scratch,
               "TMPDIR": self.scratch, "RLMESH_SCRATCH": self.scratch, "PYTHONDONTWRITEBYTECODE": "1"}
        process = await asyncio.create_subprocess_exec(
            *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            cwd=self.scratch, env=env, start_new_session=True, preexec_fn=functools.partial(_apply_limits, self.limits),
        )
        request = json.dumps({"fn": fn_path, "arguments": arguments}).encode()
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(request), self.limits.timeout_s)
        except asyncio.TimeoutError:
            _kill_group(process.pid)
            await process.wait()
            raise SandboxError(f"the tool took longer than {self.limits.timeout_s:g} s and was stopped") from None
        finally:
            if process.returncode is None:
                _kill_group(process.pid)
                await process.wait()
        return _read_result(process.returncode, stdout[:_MAX_OUTPUT_BYTES], stderr[-4000:], self.limits)

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)


def _apply_limits(limits: SandboxLimits) -> None:
    """In the child before exec: the limits every process of the sandbox inherits."""
    memory = limits.memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.max_file_mb << 20, limits.max_file_mb << 20))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.max_open_files, limits.max_open_files))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _read_result(returncode: int, stdout: bytes, stderr: bytes, limits: SandboxLimits) -> str:
    try:
        result = json.loads(stdout.decode(errors="replace").strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        # unshare --fork re-raises its child's fatal signal on itself; for SIGKILL (the hard CPU limit)
        # that fails and it exits 1 with "sigprocmask unblock failed" instead.
        killed_inside_unshare = b"sigprocmask unblock failed" in stderr
        if killed_inside_unshare or returncode in (-signal.SIGXCPU, 128 + signal.SIGXCPU, -signal.SIGKILL, 128 + signal.SIGKILL):
            raise SandboxError(f"the tool was killed (CPU limit {limits.cpu_s} s or a signal)") from None
        detail = stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit status {returncode}"]
        raise SandboxError(f"the tool process failed: {detail[0]}") from None
    if not result["ok"]:
        raise SandboxError(result["error"])
    return result["result"]


def _describe(exc: BaseException) -> str:
    """What the model is told: the exception line (a denied write reads `OSError: [Errno 30] Read-only file system`)."""
    if isinstance(exc, MemoryError):
        return "the tool ran out of memory (limit reached)"
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


def _child_main() -> None:
    """Inside the sandbox: read the request from stdin, call the function, print one JSON line."""
    request = json.loads(sys.stdin.read())
    printed = io.StringIO()
    try:
        module_name, _, attr = request["fn"].partition(":")
        fn = getattr(importlib.import_module(module_name), attr)
        with redirect_stdout(printed):
            value = fn(**request["arguments"])
        text = printed.getvalue() if value is None else value if isinstance(value, str) else json.dumps(value)
        result = {"ok": True, "result": text}
    except BaseException as exc:  # noqa: BLE001 - everything the tool does wrong is reported, not raised
        result = {"ok": False, "error": _describe(exc)}
    sys.stdout.write("\n" + json.dumps(result) + "\n")


if __name__ == "__main__":
    _child_main()
