"""The ledger of in-flight requests: which replica holds each, and how many replicas it has been tried on."""

from __future__ import annotations

import itertools
from dataclasses import dataclass


@dataclass
class Entry:
    replica: int | None = None
    attempts: int = 0


class Ledger:
    def __init__(self) -> None:
        self.entries: dict[int, Entry] = {}
        self.resubmitted = 0
        """Attempts after the first, over all requests."""
        self._ids = itertools.count()

    def open(self) -> int:
        request = next(self._ids)
        self.entries[request] = Entry()
        return request

    def assign(self, request: int, replica: int) -> int:
        """Record that `request` now runs on `replica`; returns its attempt number (1 = first)."""
        entry = self.entries[request]
        entry.replica, entry.attempts = replica, entry.attempts + 1
        self.resubmitted += entry.attempts > 1
        return entry.attempts

    def on(self, replica: int) -> list[int]:
        """Requests in flight on `replica`."""
        return [request for request, entry in self.entries.items() if entry.replica == replica]

    def close(self, request: int) -> None:
        del self.entries[request]
