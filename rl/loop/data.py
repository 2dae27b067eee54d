"""The training row stream: tasks mixed by weight, each task's rows reshuffled every epoch.

Fully determined by the seed and the number of rows drawn so far (`cursor`), so a resumed
run can continue exactly where it stopped by replaying the cursor. Each row is handed out as a
fresh copy, so code that mutates its row cannot change later epochs.
"""

from __future__ import annotations

import copy
import math
import random
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rl.config.run import RunConfig
    from tasks.build import BuiltTask


def row_limit(
    rows_by_task: dict[str, list[dict[str, Any]]], *, epochs: float | None, max_rows: int | None
) -> int | None:
    """Rows a run may draw: `epochs` passes over all tasks' rows and/or `max_rows`, the smaller; None = unlimited."""
    limits = [max_rows] if max_rows is not None else []
    if epochs is not None:
        limits.append(math.floor(epochs * sum(len(rows) for rows in rows_by_task.values())))
    return min(limits) if limits else None


class RowStream:
    """Deterministic stream of `(task_name, row)` pairs, endless unless it has a `limit`."""

    def __init__(
        self,
        rows_by_task: dict[str, list[dict[str, Any]]],
        weights: dict[str, float],
        seed: int,
        limit: int | None = None,
    ):
        empty = [name for name, rows in rows_by_task.items() if not rows]
        if empty:
            raise ValueError(f"tasks with an empty training split: {empty}")
        self.task_names = sorted(rows_by_task)
        self.rows_by_task = rows_by_task
        self.weights = [weights[name] for name in self.task_names]
        self.seed = seed
        self.limit = limit
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

    def next(self) -> tuple[str, dict[str, Any]] | None:
        """The next row, or None once `limit` rows were drawn."""
        if self.limit is not None and self.cursor >= self.limit:
            return None
        task_name = self._task_rng.choices(self.task_names, weights=self.weights)[0]
        self.cursor += 1
        return task_name, copy.deepcopy(self.rows_by_task[task_name][self._next_index(task_name)])

    def next_not_in(self, skipped: set[int]) -> tuple[int, tuple[str, dict[str, Any]] | None]:
        """The next row whose index is not in `skipped` (rows consumed before a resume), with its index; None at the
        limit."""
        row_index = self.cursor
        while (drawn := self.next()) is not None and row_index in skipped:
            row_index = self.cursor
        return row_index, drawn

    def take(self, count: int) -> list[tuple[str, dict[str, Any]]]:
        """Up to `count` rows (fewer at the limit)."""
        rows = []
        while len(rows) < count and (row := self.next()) is not None:
            rows.append(row)
        return rows

    def seek(self, cursor: int) -> None:
        """Continue from row `cursor` of a fresh stream with the same seed (replays the draws before it)."""
        if cursor < self.cursor:
            raise ValueError(f"cannot seek back from row {self.cursor} to {cursor}")
        while self.cursor < cursor:
            self.next()


def training_stream(tasks: dict[str, BuiltTask], run: RunConfig, cursor: int) -> tuple[RowStream, int]:
    """The tasks' training rows mixed by weight, continuing from row `cursor`, and the optimizer steps the run
    plans: `run.steps`, or fewer when `run.epochs` / `run.max_rows` leave rows for fewer steps."""
    train_rows = {name: task.load_rows("train") for name, task in tasks.items()}
    limit = row_limit(train_rows, epochs=run.epochs, max_rows=run.max_rows)
    stream = RowStream(
        train_rows, {name: task.config.weight for name, task in tasks.items()}, seed=run.seed, limit=limit
    )
    stream.seek(cursor)
    return stream, run.steps if limit is None else min(run.steps, limit // run.groups_per_step)
