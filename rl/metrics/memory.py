"""Peak memory of this process over a window (a step): the kernel's resident high-water mark, and the CUDA allocator's.

`VmHWM` in `/proc/self/status` is the most resident memory (anonymous, file-backed and shared pages) the process has
held since it started or since its mark was reset by writing "5" to `/proc/self/clear_refs`; the kernel keeps it on
every page fault, so a copy that lives for a millisecond counts, where sampling RSS would miss it. On a GPU,
`torch.cuda.max_memory_allocated` is the same for the caching allocator (reset with `reset_peak_memory_stats`).

Each process reports its own peak under its role (`memory/<role>/peak_rss_mb`, `Reduce.MAX`: the largest over the
role's processes) when its metric states are drained at the end of a step, then resets the marks, so a step's record
holds the peaks of that step.
"""

from __future__ import annotations

from pathlib import Path

import torch

from rl.metrics.reduce import Reduce, State, add_value, new_state

MIB = 2**20


def peak_rss_bytes() -> int:
    """This process's resident high-water mark (`VmHWM`) since it started or since `reset_peaks`."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024  # "VmHWM:   123456 kB"
    raise OSError("/proc/self/status has no VmHWM line")


def rss_bytes() -> int:
    """This process's resident memory now (`VmRSS`)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise OSError("/proc/self/status has no VmRSS line")


def reset_peaks() -> None:
    """Start a new window: the high-water mark drops to the current resident size (and the CUDA peak to what is
    allocated now, when this process uses CUDA)."""
    Path("/proc/self/clear_refs").write_text("5")
    if torch.cuda.is_initialized():
        torch.cuda.reset_peak_memory_stats()


def peak_states(role: str) -> dict[str, State]:
    """This process's peaks since the last reset as metric states, `memory/<role>/peak_rss_mb` (and `peak_gpu_mb` on
    a GPU), and its resident memory now, at the step's end (`rss_mb`: what it keeps between steps), `Reduce.MAX`
    over the role's processes; then a new window starts."""
    peaks = {f"memory/{role}/peak_rss_mb": peak_rss_bytes() / MIB, f"memory/{role}/rss_mb": rss_bytes() / MIB}
    if torch.cuda.is_initialized():
        peaks[f"memory/{role}/peak_gpu_mb"] = torch.cuda.max_memory_allocated() / MIB
    reset_peaks()
    states = {}
    for key, value in peaks.items():
        states[key] = new_state(Reduce.MAX)
        add_value(states[key], key, value)
    return states
