"""Which generator replica serves a row: the one with the fewest rows outstanding."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


class LeastOutstanding:
    """Routes each row (all its samples and turns, so a replica's prefix cache serves the group) to one replica."""

    def __init__(self, replicas: int):
        self.outstanding = [0] * replicas

    @contextmanager
    def route(self) -> Iterator[int]:
        """The chosen replica's index while the row runs (ties go to the lowest index)."""
        replica = min(range(len(self.outstanding)), key=lambda index: self.outstanding[index])
        self.outstanding[replica] += 1
        try:
            yield replica
        finally:
            self.outstanding[replica] -= 1
