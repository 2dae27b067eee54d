"""`with timer("generation"):` adds the span's wall-clock seconds to `time/generation_s`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from rl.metrics.reduce import Reduce, record_metric


@contextmanager
def timer(name: str, reduction: Reduce = Reduce.SUM) -> Iterator[None]:
    """Time the block; spans of one name in one step add up (Reduce.SUM) unless told otherwise.

    The span is recorded also when the block raises, so a failed phase still shows its cost.
    """
    start = time.perf_counter()
    try:
        yield
    finally:
        record_metric(f"time/{name}_s", time.perf_counter() - start, reduction)
