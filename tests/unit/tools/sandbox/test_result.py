"""Reading a call's result from what its runner left: the last stdout line, or why there is none."""

import json
import signal

import pytest

from tools.sandbox.limits import SandboxError, SandboxLimits
from tools.sandbox.result import read_result

LIMITS = SandboxLimits(cpu_s=3, memory_mb=256)


def line(**result) -> bytes:
    return b"printed by the tool\n" + json.dumps(result).encode() + b"\n"


def test_the_last_line_is_the_result_or_the_tools_error():
    assert read_result(0, line(ok=True, result="42"), b"", LIMITS) == "42"
    with pytest.raises(SandboxError, match="^ZeroDivisionError: division by zero$"):
        read_result(0, line(ok=False, error="ZeroDivisionError: division by zero"), b"", LIMITS)


@pytest.mark.parametrize("returncode", [-signal.SIGXCPU, 128 + signal.SIGKILL])
def test_a_killed_runner_names_the_cpu_limit(returncode):
    with pytest.raises(SandboxError, match=r"killed \(CPU limit 3 s or a signal\)"):
        read_result(returncode, b"", b"", LIMITS)


def test_no_result_line_names_the_last_stderr_line_or_the_exit_status():
    with pytest.raises(SandboxError, match="failed: ImportError: no module x$"):
        read_result(1, b"", b"Traceback ...\nImportError: no module x\n", LIMITS)
    with pytest.raises(SandboxError, match="failed: exit status 3$"):
        read_result(3, b"", b"", LIMITS)


def test_out_of_memory_and_malformed_lines_are_errors():
    with pytest.raises(SandboxError, match=r"out of memory \(the sandbox's limit is 256 MB\)"):
        read_result(0, line(ok=True, result="42"), b"", LIMITS, out_of_memory=True)
    with pytest.raises(SandboxError, match="malformed"):
        read_result(0, b"[1, 2]\n", b"", LIMITS)
    with pytest.raises(SandboxError, match="'result' is not text"):
        read_result(0, line(ok=True, result=42), b"", LIMITS)
