"""Metric statistics reduced correctly over micro-batches (and, later, ranks).

A metric is fed samples (token or sequence values) and keeps sum, count, sum of squares, min and max:
summing the first three and taking min/max of the last two merges micro-batches or ranks exactly, so a
mean, std, min or max over the whole step never depends on how the batch was split. `totals` are plain
sums (e.g. loss terms already divided by a global count).
"""

from __future__ import annotations

import math

import torch

FIELDS = ("sum", "count", "sumsq", "min", "max")


class MetricStats:
    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = {}
        self.totals: dict[str, float] = {}

    def add(self, name: str, values: torch.Tensor) -> None:
        """Fold a 1-D tensor of samples into metric `name` (empty tensors are ignored)."""
        values = values.detach().double().flatten()
        if values.numel() == 0:
            return
        new = [values.sum().item(), float(values.numel()), (values * values).sum().item(), values.min().item(), values.max().item()]
        old = self.samples.get(name)
        self.samples[name] = new if old is None else merge(old, new)

    def add_total(self, name: str, value: float) -> None:
        self.totals[name] = self.totals.get(name, 0.0) + float(value)

    def mean(self, name: str) -> float | None:
        stat = self.samples.get(name)
        return None if stat is None else stat[0] / stat[1]


def merge(a: list[float], b: list[float]) -> list[float]:
    """Two (sum, count, sumsq, min, max) records as one: what an all-reduce across ranks would do."""
    return [a[0] + b[0], a[1] + b[1], a[2] + b[2], min(a[3], b[3]), max(a[4], b[4])]


def merge_stats(parts: list[MetricStats]) -> MetricStats:
    """Several processes' statistics of one step as one (ranks of a sharded trainer)."""
    if len(parts) == 1:
        return parts[0]
    out = MetricStats()
    for part in parts:
        for name, stat in part.samples.items():
            out.samples[name] = stat if name not in out.samples else merge(out.samples[name], stat)
        for name, value in part.totals.items():
            out.add_total(name, value)
    return out


def reduce_metric_stats(stats: MetricStats, spread: tuple[str, ...] = ()) -> dict[str, float]:
    """Flat metrics of a step: `name` = mean of its samples; for names in `spread`, `name_mean/_std/_min/_max`.

    Totals are returned as they are. The std is the population std over all samples of the step.
    """
    out = dict(stats.totals)
    for name, (total, count, sumsq, low, high) in stats.samples.items():
        mean = total / count
        if name in spread:
            out[f"{name}_mean"] = mean
            out[f"{name}_std"] = math.sqrt(max(0.0, sumsq / count - mean * mean))
            out[f"{name}_min"] = low
            out[f"{name}_max"] = high
        else:
            out[name] = mean
    return out
