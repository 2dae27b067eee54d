"""Pinning an actor process to CPU cores, so training and generation can own separate cores."""

from __future__ import annotations

import os

import torch


def pin_process(cpus: list[int] | None, *, rank: int = 0, of: int = 1) -> list[int]:
    """Restrict this process (and torch's intra-op threads) to its share of `cpus`; [] when unset.

    With `of` processes sharing the list (generator replicas), process `rank` takes the `rank`-th
    of `of` equal consecutive slices, or the whole list when it has fewer cores than processes.
    """
    if not cpus:
        return []
    share = len(cpus) // of
    mine = cpus[rank * share : (rank + 1) * share] if share else list(cpus)
    os.sched_setaffinity(0, mine)
    torch.set_num_threads(len(mine))
    return mine
