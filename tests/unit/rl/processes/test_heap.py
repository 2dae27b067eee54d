"""`rl.processes.heap`: with the threshold fixed, freed large blocks leave the process; without, they stay.

Each case runs in its own interpreter, so glibc's adjusted threshold starts fresh and the test process's
heap is not touched."""

import os
import platform
import subprocess
import sys

import pytest

from tests.support.paths import REPO

pytestmark = pytest.mark.processes  # each measurement in a fresh process

PROBE = """
import ctypes, sys
from rl.processes.heap import return_free_heap_pages, return_large_blocks_to_the_system
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def resident_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
if sys.argv[1] in ("trim", "untrimmed"):           # blocks under the threshold: the heap's middle
    blocks = [libc.malloc(96 << 10) for _ in range(200)]
    for block in blocks:
        ctypes.memset(block, 1, 96 << 10)
    before = resident_mb()
    for block in blocks[:-1]:
        libc.free(block)
    if sys.argv[1] == "trim":
        return_free_heap_pages()
    print(before - resident_mb())                   # MB given back
    sys.exit()
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


def probe(mode: str) -> float:
    """fixed / default: MB still resident after 3 of 4 touched 4 MiB blocks are freed; trim / untrimmed: MB given
    back when 199 of 200 touched 96 KiB heap blocks are freed. In a fresh interpreter."""
    result = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True, cwd=REPO)
    return float(result.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the C library is not glibc")
def test_freed_large_blocks_leave_the_process_once_the_threshold_is_fixed():
    assert probe("default") >= 12  # glibc as it starts: the three freed blocks stay resident
    assert probe("fixed") <= 4.5  # only the block still in use


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the C library is not glibc")
def test_free_pages_in_the_middle_of_the_heap_leave_once_trimmed():
    assert probe("untrimmed") <= 1  # freed below the block still in use: they stay
    assert probe("trim") >= 16  # 199 x 96 KiB = 18.7 MB back


ONEDNN_PROBE = """
import ctypes, sys
from rl.processes.heap import no_shared_onednn_primitive_cache
if sys.argv[1] == "off":
    no_shared_onednn_primitive_cache()
import torch
from vllm import _custom_ops as ops
if not ops._supports_onednn:
    print("unsupported"); sys.exit()
class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
weight = torch.randn(576, 1536)                     # [K, N]: a SmolLM2 MLP projection
def reload_and_generate(token_counts):
    handler = ops.create_onednn_mm(weight, 32)      # what vLLM builds for a CPU linear layer at each weight reload
    for m in token_counts:                          # continuous batching: each step's token count M
        ops.onednn_mm(handler, torch.randn(m, 576), None)
reload_and_generate(range(1, 81))                   # oneDNN's own set-up
before = libc.mallinfo2().uordblks
for reload in range(1, 4):                          # three reloads, each meeting 80 token counts not seen before
    reload_and_generate(range(80 * reload + 1, 80 * reload + 81))
print((libc.mallinfo2().uordblks - before) / 2**20)  # MB of heap still in use once every handler is gone
"""


def onednn_probe(mode: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", ONEDNN_PROBE, mode],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env={k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"},
    )
    return result.stdout.strip().splitlines()[-1]


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallinfo2 is glibc's")
def test_reloaded_layers_leave_no_primitives_behind_once_the_shared_onednn_cache_is_off():
    default = onednn_probe("default")
    if default == "unsupported":
        pytest.skip("this vLLM build has no oneDNN matmul")
    # 240 primitives (~0.3 MB each) kept by the process-wide cache after their handlers died
    assert float(default) >= 30
    assert float(onednn_probe("off")) <= 5
