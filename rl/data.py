"""The training row stream: tasks mixed by weight, each task's rows reshuffled every epoch.

Fully determined by the seed and the number of rows drawn so far (`cursor`), so a resumed
run can continue exactly where it stopped by replaying the cursor.
"""

from __future__ import annotations

import copy
import random
from typing import Any


class RowStream:
    """Deterministic infinite stream of `(task_name, row)` pairs."""

    def __init__(self, rows_by_task: dict[str, list[dict[str, Any]]], weights: dict[str, float], seed: int):
        empty = [name for name, rows in rows_by_task.items() if not rows]
        if empty:
            raise ValueError(f"tasks with an empty training split: {empty}")
        self.task_names = sorted(rows_by_task)
        self.rows_by_task = rows_by_task
        self.weights = [weights[name] for name in self.task_names]
        self.seed = seed
        self.cursor = 0
        self._task_rng = random.Random(seed)
        self._orders: dict[str, list[int]] = {}
        self._positions = {name: 0 for name in self.task_names}
        self._epochs = {name: 0 for name in self.task_names}

    def _next_index(self, task_name: str) -> int:
        position = self._positions[task_name]
        rows = self.rows_by_task[task_name]
        if position == 0:
            order = list(range(len(rows)))
            random.Random(f"{self.seed}/{task_name}/{self._epochs[task_name]}").shuffle(order)
            self._orders[task_name] = order
        index = self._orders[task_name][position]
        self._positions[task_name] = (position + 1) % len(rows)
        if self._positions[task_name] == 0:
            self._epochs[task_name] += 1
        return index

    def next(self) -> tuple[str, dict[str, Any]]:
        task_name = self._task_rng.choices(self.task_names, weights=self.weights)[0]
        self.cursor += 1
        return task_name, copy.deepcopy(self.rows_by_task[task_name][self._next_index(task_name)])

    def take(self, count: int) -> list[tuple[str, dict[str, Any]]]:
        return [self.next() for _ in range(count)]

    def seek(self, cursor: int) -> None:
        """Continue from row `cursor` of a fresh stream with the same seed (replays the draws before it)."""
        if cursor < self.cursor:
            raise ValueError(f"cannot seek back from row {self.cursor} to {cursor}")
        while self.cursor < cursor:
            self.next()
