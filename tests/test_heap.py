"""`rl.processes.heap`: with the threshold fixed, freed large blocks leave the process; without, they stay.

Each case runs in its own interpreter, so glibc's adjusted threshold starts fresh and the test process's
heap is not touched."""

import platform
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import ctypes, sys
from rl.processes.heap import return_large_blocks_to_the_system
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def resident_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
if sys.argv[1] == "fixed":
    assert return_large_blocks_to_the_system()
weights = libc.malloc(8 << 20)            # a reload's layer: mapped, and freeing it raises the threshold to 8 MiB
ctypes.memset(weights, 1, 8 << 20)
libc.free(weights)
before = resident_mb()
blocks = [libc.malloc(4 << 20) for _ in range(4)]
for block in blocks:
    ctypes.memset(block, 1, 4 << 20)
for block in blocks[:3]:                  # the fourth stays in use, above the three freed ones
    libc.free(block)
print(resident_mb() - before)
"""


def resident_growth_mb(mode: str) -> float:
    """MB still resident after 3 of 4 touched 4 MiB blocks are freed, in a fresh interpreter."""
    result = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True,
                            cwd=Path(__file__).resolve().parent.parent)
    return float(result.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the C library is not glibc")
def test_freed_large_blocks_leave_the_process_once_the_threshold_is_fixed():
    assert resident_growth_mb("default") >= 12  # glibc as it starts: the three freed blocks stay resident
    assert resident_growth_mb("fixed") <= 4.5  # only the block still in use
