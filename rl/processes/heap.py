"""The native memory of a long-lived process that frees large blocks every step (a generator, a trainer): keep it flat.

glibc serves a block of at least `M_MMAP_THRESHOLD` bytes with its own `mmap` and unmaps it when freed. The
threshold starts at 128 KiB, but each time such a block is freed glibc raises it to that block's size (up to
32 MiB), so from then on blocks of that size come from the heap, and freeing them leaves holes there that the
next step's allocations of other sizes rarely fill. vLLM's in-place weight reload materialises every layer's
weights anew each sync (megabytes per layer) and frees them, between generation steps that allocate their own
(a 150-step soak of the main job saw the generator's resident memory grow in steps). Fixing the threshold stops
the adjustment: large blocks are always mapped and always returned (`tests/unit/rl/processes/test_heap.py` shows both behaviours).

A trainer frees large blocks each step too: the previous step's gradients, its activations and, sharded, each
layer's weights gathered for its forward and backward. A trainer's live tensors are the same from its first step on,
but under the adjusted threshold its resident memory at a step's end grew with glibc's free heap memory: by 0.6 GiB
per rank from the first step to the second (SmolLM2-135M, 2 ranks), by 1.2 GiB per step (a 1.4 GiB model, 2 ranks)
until the kernel's OOM killer stopped the run. Every trainer trims its heap after each step and each push
(`return_free_heap_pages`), which keeps its end-of-step memory flat. Within a step, a sharded rank's gathers (a
layer's weights, in sizes that differ from layer to layer) still fragment the heap: the large model's step peaked
2.7 GiB higher per rank on the heap than with its blocks mapped, so a sharded rank also fixes the threshold. A
one-process trainer does not: its blocks are the same activations step after step, which the heap reuses, while
mapping them costs page faults on every use (the main job's train phase took 30% longer for a peak 0.2-0.4 GiB lower;
2 CPU cores). `tests/e2e/test_trainer_heap.py` runs both.

vLLM's CPU linear layers run oneDNN matmuls through handlers that cache their own primitives, one per token count
M, and are rebuilt at every reload. oneDNN keeps a second, process-wide cache of up to 1024 primitives (about
0.3 MB each with their JIT kernels), keyed by shape and M, that nothing hits after the reload that built them: as
continuous batching meets new token counts it fills for hundreds of steps (a 150-step soak of the main job: +38 MB
per 100 steps). `no_shared_onednn_primitive_cache` turns that second cache off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

M_MMAP_THRESHOLD = -3
"""mallopt's parameter number (malloc.h)."""
LARGE_BLOCK_BYTES = 1 << 20
"""Blocks of this size and over get their own mapping. Smaller ones (per-token activations) stay on the heap,
where they are reused from step to step; mapping them would cost a page fault per page on each use."""


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The C library if it is glibc; looked up once (`find_library` runs `ldconfig`, and the trim runs every sync)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name)
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "gnu_get_libc_version") else None


def return_large_blocks_to_the_system() -> bool:
    """Fix glibc's mmap threshold at `LARGE_BLOCK_BYTES` for this process; False where the C library is not
    glibc (musl, macOS: their allocators do not adjust a threshold) or refuses."""
    libc = _glibc()
    return libc is not None and libc.mallopt(M_MMAP_THRESHOLD, LARGE_BLOCK_BYTES) == 1


def return_free_heap_pages() -> None:
    """Give the free pages inside the heap back to the system (`malloc_trim(0)`): the smaller blocks a weight reload
    and a generation step free leave holes the fixed threshold does not cover. A few milliseconds; glibc only."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


ONEDNN_CACHE_CAPACITY_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"


def no_shared_onednn_primitive_cache() -> None:
    """Set oneDNN's process-wide primitive cache capacity to 0, unless the user set it. oneDNN reads it when the
    cache is first used, so call this before the engine builds its first layer."""
    os.environ.setdefault(ONEDNN_CACHE_CAPACITY_ENV, "0")
