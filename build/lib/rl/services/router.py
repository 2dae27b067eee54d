"""Which replica serves a request: the healthy one with the fewest outstanding, sticky by key.

A key (a row's group id) stays on the replica that served its first request while that replica
is healthy, so the group's shared prompt prefix hits one replica's prefix cache.
"""

from __future__ import annotations

from collections import OrderedDict


class Router:
    def __init__(self, replicas: int, max_keys: int = 4096):
        self.outstanding = [0] * replicas
        self.served = [0] * replicas
        self.max_keys = max_keys
        self._sticky: OrderedDict[str, int] = OrderedDict()

    def pick(self, healthy: list[int], key: str | None = None) -> int:
        """A replica among `healthy` (non-empty) for a request, counted outstanding until `done`."""
        replica = self._sticky.get(key) if key is not None else None
        if replica not in healthy:
            replica = min(healthy, key=lambda index: (self.outstanding[index], index))
        if key is not None:
            self._sticky[key] = replica
            self._sticky.move_to_end(key)
            if len(self._sticky) > self.max_keys:
                self._sticky.popitem(last=False)
        self.outstanding[replica] += 1
        self.served[replica] += 1
        return replica

    def replica_of(self, key: str) -> int | None:
        """The replica `key`'s requests go to (the one that served its latest)."""
        return self._sticky.get(key)

    def done(self, replica: int) -> None:
        self.outstanding[replica] -= 1
