"""What bounds one sandboxed call (`SandboxLimits`, the output caps) and how a call that did not return is told
(`SandboxError`): shared by the host side and the jailed runner."""

from __future__ import annotations

from dataclasses import dataclass

MAX_OUTPUT_BYTES = 1 << 20
"""Stdout a call may write (its result included); past it the tool is killed and the model told."""
STDERR_TAIL_BYTES = 4096
"""The end of the tool's stderr that is kept (for the error of a process that failed)."""


class SandboxError(Exception):
    """A tool call that did not return: it raised, ran out of time or memory, or broke a rule."""


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 5.0
    """Wall-clock time of one call, process start included."""
    cpu_s: int = 5
    memory_mb: int = 512
    """Memory of the whole sandbox with a cgroup, else address space of each process (Python needs ~30 MB)."""
    max_processes: int = 16
    """Processes and threads of the sandbox (the tool runner is one)."""
    max_file_mb: int = 16
    scratch_mb: int = 64
    """Size of the scratch tmpfs (and of `/dev/shm`); with a cgroup it counts towards `memory_mb` too."""
    max_open_files: int = 64
