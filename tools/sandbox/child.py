"""The runner inside the sandbox (`python -m tools.sandbox.child`): reads the request from stdin, sets the limits
before the tool is imported, calls it and prints its result as one JSON line."""

from __future__ import annotations

import importlib
import io
import json
import resource
import sys
import traceback
from contextlib import redirect_stdout

from tools.sandbox.limits import SandboxLimits


def apply_limits(limits: SandboxLimits, nproc: bool) -> None:
    """In the runner, before the tool is imported: the limits every process it starts inherits (the hard
    limits cannot be raised again: no capability is left)."""

    def cap(kind: int, value: int) -> None:
        resource.setrlimit(kind, (value, value))

    cap(resource.RLIMIT_AS, limits.memory_mb << 20)
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
    cap(resource.RLIMIT_FSIZE, limits.max_file_mb << 20)
    cap(resource.RLIMIT_NOFILE, limits.max_open_files)
    cap(resource.RLIMIT_CORE, 0)
    if nproc:
        cap(resource.RLIMIT_NPROC, limits.max_processes)


def describe(exc: BaseException) -> str:
    """What the model is told: the exception line (a denied write reads `OSError: [Errno 30] Read-only file system`)."""
    if isinstance(exc, MemoryError):
        return "the tool ran out of memory (limit reached)"
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


def main() -> None:
    """Inside the sandbox: read the request from stdin, set the limits, call the function, print one JSON line."""
    request = json.loads(sys.stdin.read())
    apply_limits(SandboxLimits(**request["limits"]), request["nproc"])
    printed = io.StringIO()
    try:
        module_name, _, attr = request["fn"].partition(":")
        fn = getattr(importlib.import_module(module_name), attr)
        with redirect_stdout(printed):
            value = fn(**request["arguments"])
        text = printed.getvalue() if value is None else value if isinstance(value, str) else json.dumps(value)
        result = {"ok": True, "result": text}
    except BaseException as exc:
        result = {"ok": False, "error": describe(exc)}
    sys.stdout.write("\n" + json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
