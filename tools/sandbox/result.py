"""The result of a sandboxed call read from what its runner left: the last stdout line (one JSON object), or
why there is none (killed, out of memory, failed, malformed)."""

from __future__ import annotations

import json
import signal

from tools.sandbox.limits import SandboxError, SandboxLimits


def read_result(
    returncode: int, stdout: bytes, stderr: bytes, limits: SandboxLimits, out_of_memory: bool = False
) -> str:
    """The tool's result from the runner's last stdout line; anything malformed is a `SandboxError` for the model."""
    if out_of_memory:
        raise SandboxError(f"the tool ran out of memory (the sandbox's limit is {limits.memory_mb} MB) and was killed")
    lines = stdout.decode(errors="replace").strip().splitlines()
    try:
        result = json.loads(lines[-1]) if lines else None
    except (json.JSONDecodeError, RecursionError):
        result = None
    if result is None:
        # unshare --fork re-raises its child's fatal signal on itself; for SIGKILL (the hard CPU limit)
        # that fails and it exits 1 with "sigprocmask unblock failed" instead.
        killed_inside_unshare = b"sigprocmask unblock failed" in stderr
        if killed_inside_unshare or returncode in (
            -signal.SIGXCPU,
            128 + signal.SIGXCPU,
            -signal.SIGKILL,
            128 + signal.SIGKILL,
        ):
            raise SandboxError(f"the tool was killed (CPU limit {limits.cpu_s} s or a signal)")
        detail = stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit status {returncode}"]
        raise SandboxError(f"the tool process failed: {detail[0]}")
    if not isinstance(result, dict) or not isinstance(result.get("ok"), bool):
        raise SandboxError(
            f"the tool's output is malformed (its last line is not the runner's result): {lines[-1][:200]!r}"
        )
    field = "result" if result["ok"] else "error"
    if not isinstance(result.get(field), str):
        raise SandboxError(f"the tool's output is malformed ({field!r} is not text): {lines[-1][:200]!r}")
    text = result[field].encode("utf-8", errors="replace").decode("utf-8")  # lone surrogates cannot be tokenized
    if not result["ok"]:
        raise SandboxError(text)
    return text
