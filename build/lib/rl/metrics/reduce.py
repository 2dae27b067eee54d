"""`record_metric(key, value, reduction)`: per-process accumulators whose states merge exactly.

Every process (controller, each actor) holds one `MetricCollector`. Code anywhere records into
it; at the end of a step the controller drains its own states and gathers the actors' (the
`metric_states` endpoint of `rl.metrics.actor.MetricsActor`), and `reduce_states` merges them
into one value per key. States, not values, are merged: a mean is weighted by counts and a std
comes from merged moments, so N processes give the same numbers as one process seeing it all.

The trainer's step statistics use the same states: `StepStats` keeps a summary (sum, count, sum of
squares, min, max) of every metric as tensors on the device through the micro-batches of a step and
turns them into `Reduce.SUMMARY` states with one host sync at its end; ranks merge those states here.
"""

from __future__ import annotations

import math
import numbers
import threading
from enum import StrEnum
from typing import Any

import torch

State = dict[str, Any]
"""An accumulator's state: `{"reduction": "<Reduce value>", ...fields}`; plain JSON, picklable."""


class Reduce(StrEnum):
    MEAN = "mean"
    SUM = "sum"
    MAX = "max"
    MIN = "min"
    STD = "std"
    """Population standard deviation (ddof=0) of every recorded value."""
    SAMPLE = "sample"
    """Values are dicts (one logged sample each); reduced by concatenation, sent to `log_samples`."""
    SUMMARY = "summary"
    """Sum, count, sum of squares, min and max of every value: its value is the mean, `summary_metrics` adds std/min/max."""


def _as_float(key: str, value: Any) -> float:
    """`value` as a finite float; anything else is rejected here, naming the key, not at flush time."""
    if isinstance(value, numbers.Real) or (hasattr(value, "numel") and value.numel() == 1):
        number = float(value)
        if math.isfinite(number):
            return number
        raise ValueError(f"metric {key!r}: value {number} is not finite")
    raise TypeError(f"metric {key!r}: value must be a real number, got {type(value).__name__}")


def new_state(reduction: Reduce) -> State:
    fields: dict[Reduce, dict[str, Any]] = {
        Reduce.MEAN: {"sum": 0.0, "count": 0},
        Reduce.SUM: {"sum": 0.0},
        Reduce.MAX: {"max": -math.inf},
        Reduce.MIN: {"min": math.inf},
        Reduce.STD: {"count": 0, "mean": 0.0, "m2": 0.0},
        Reduce.SAMPLE: {"samples": []},
        Reduce.SUMMARY: {"sum": 0.0, "count": 0.0, "sumsq": 0.0, "min": math.inf, "max": -math.inf},
    }
    return {"reduction": reduction.value, **fields[reduction]}


def add_value(state: State, key: str, value: Any) -> None:
    """Fold one recorded value into `state` (validated first: nothing invalid ever enters a state)."""
    reduction = Reduce(state["reduction"])
    if reduction is Reduce.SAMPLE:
        if not isinstance(value, dict):
            raise TypeError(f"metric {key!r}: Reduce.SAMPLE takes a dict per sample, got {type(value).__name__}")
        state["samples"].append(value)
        return
    number = _as_float(key, value)
    if reduction is Reduce.SUMMARY:
        merge_summary(state, {"sum": number, "count": 1.0, "sumsq": number * number, "min": number, "max": number})
    elif reduction is Reduce.MEAN:
        state["sum"] += number
        state["count"] += 1
    elif reduction is Reduce.SUM:
        state["sum"] += number
    elif reduction is Reduce.MAX:
        state["max"] = max(state["max"], number)
    elif reduction is Reduce.MIN:
        state["min"] = min(state["min"], number)
    else:  # Welford's update
        state["count"] += 1
        delta = number - state["mean"]
        state["mean"] += delta / state["count"]
        state["m2"] += delta * (number - state["mean"])


def merge_states(key: str, states: list[State]) -> State:
    """One state equivalent to having recorded every value of `states` in one process."""
    reductions = {state["reduction"] for state in states}
    if len(reductions) != 1:
        raise ValueError(f"metric {key!r} was recorded with different reductions: {sorted(reductions)}")
    reduction = Reduce(reductions.pop())
    merged = new_state(reduction)
    for state in states:
        if reduction is Reduce.MEAN:
            merged["sum"] += state["sum"]
            merged["count"] += state["count"]
        elif reduction is Reduce.SUM:
            merged["sum"] += state["sum"]
        elif reduction is Reduce.MAX:
            merged["max"] = max(merged["max"], state["max"])
        elif reduction is Reduce.MIN:
            merged["min"] = min(merged["min"], state["min"])
        elif reduction is Reduce.SAMPLE:
            merged["samples"].extend(state.get("samples", []))
        elif reduction is Reduce.SUMMARY:
            merge_summary(merged, state)
        elif state["count"]:  # Chan et al.'s pairwise combination of (count, mean, M2)
            count = merged["count"] + state["count"]
            delta = state["mean"] - merged["mean"]
            merged["m2"] += state["m2"] + delta * delta * merged["count"] * state["count"] / count
            merged["mean"] += delta * state["count"] / count
            merged["count"] = count
    return merged


def merge_summary(into: State, other: State) -> None:
    """Fold summary `other` into `into` (in place): sums add, min and max combine."""
    into["sum"] += other["sum"]
    into["count"] += other["count"]
    into["sumsq"] += other["sumsq"]
    into["min"] = min(into["min"], other["min"])
    into["max"] = max(into["max"], other["max"])


def summary_metrics(key: str, state: State) -> dict[str, float]:
    """`key_mean/_std/_min/_max` of a SUMMARY state; the std is the population std of every value."""
    mean = state["sum"] / state["count"]
    return {
        f"{key}_mean": mean,
        f"{key}_std": math.sqrt(max(0.0, state["sumsq"] / state["count"] - mean * mean)),
        f"{key}_min": state["min"],
        f"{key}_max": state["max"],
    }


def state_value(state: State) -> float | list[dict]:
    """The reduced value of a state (a list of sample dicts for Reduce.SAMPLE)."""
    reduction = Reduce(state["reduction"])
    if reduction in (Reduce.MEAN, Reduce.SUMMARY):
        return state["sum"] / state["count"]
    if reduction is Reduce.SUM:
        return state["sum"]
    if reduction is Reduce.MAX:
        return state["max"]
    if reduction is Reduce.MIN:
        return state["min"]
    if reduction is Reduce.STD:
        return math.sqrt(state["m2"] / state["count"])
    return state["samples"]


def reduce_states(per_process: list[dict[str, State]]) -> tuple[dict[str, float], dict[str, list[dict]]]:
    """Merge the drained states of several processes: (scalar metrics, samples by key)."""
    keys = sorted({key for states in per_process for key in states})
    metrics: dict[str, float] = {}
    samples: dict[str, list[dict]] = {}
    for key in keys:
        merged = merge_states(key, [states[key] for states in per_process if key in states])
        if merged["reduction"] == Reduce.SAMPLE:
            samples[key] = merged["samples"]
        else:
            metrics[key] = state_value(merged)
    return metrics, samples


def merge_all(per_process: list[dict[str, State]]) -> dict[str, State]:
    """Several processes' states of one step as one state per key."""
    if len(per_process) == 1:
        return per_process[0]
    keys = sorted({key for states in per_process for key in states})
    return {key: merge_states(key, [states[key] for states in per_process if key in states]) for key in keys}


class StepStats:
    """A training step's statistics kept as float64 tensors until the step ends: no host sync per micro-batch.

    `add` folds samples (token or sequence values) into a [5] summary (sum, count, sumsq, min, max) that
    merges exactly over micro-batches; `add_total` sums a value (a loss already divided by a global count).
    `states()` reads them all with one host sync, as SUMMARY and SUM states that merge over ranks.
    """

    def __init__(self) -> None:
        self.summaries: dict[str, torch.Tensor] = {}  # name -> [5] float64
        self.totals: dict[str, torch.Tensor] = {}  # name -> [] float64

    def add(self, name: str, values: torch.Tensor) -> None:
        """Fold a tensor of samples into metric `name` (empty tensors are ignored)."""
        values = values.detach().double().flatten()
        if values.numel() == 0:
            return
        new = torch.stack(
            [
                values.sum(),
                values.new_tensor(float(values.numel())),
                (values * values).sum(),
                values.min(),
                values.max(),
            ]
        )
        old = self.summaries.get(name)
        if old is not None:
            new = torch.cat([old[:3] + new[:3], torch.minimum(old[3:4], new[3:4]), torch.maximum(old[4:], new[4:])])
        self.summaries[name] = new

    def add_total(self, name: str, value: torch.Tensor | float) -> None:
        value = torch.as_tensor(value).detach().double()
        old = self.totals.get(name)
        self.totals[name] = value if old is None else old + value.to(old.device)

    def states(self) -> dict[str, State]:
        """Every statistic as a mergeable state (one device-to-host copy for all of them): totals, then summaries."""
        parts = [total.reshape(1) for total in self.totals.values()] + list(self.summaries.values())
        device = parts[0].device if parts else None
        flat = torch.cat([part.to(device) for part in parts]).tolist() if parts else []
        out: dict[str, State] = {
            name: {"reduction": Reduce.SUM.value, "sum": value} for name, value in zip(self.totals, flat)
        }
        rest = flat[len(self.totals) :]
        for i, name in enumerate(self.summaries):
            total, count, sumsq, low, high = rest[5 * i : 5 * i + 5]
            out[name] = {
                "reduction": Reduce.SUMMARY.value,
                "sum": total,
                "count": count,
                "sumsq": sumsq,
                "min": low,
                "max": high,
            }
        return out


def step_metrics(states: dict[str, State], spread: tuple[str, ...] = ()) -> dict[str, float]:
    """Flat metrics of a step's states: a SUM is its total, a SUMMARY its mean, or `name_mean/_std/_min/_max` when in `spread`."""
    out: dict[str, float] = {}
    for key, state in states.items():
        if state["reduction"] == Reduce.SUMMARY and key in spread:
            out.update(summary_metrics(key, state))
        else:
            out[key] = state_value(state)
    return out


class MetricCollector:
    """One process's accumulators, keyed by metric name; thread-safe (sync reward functions run in threads)."""

    def __init__(self) -> None:
        self._states: dict[str, State] = {}
        self._lock = threading.Lock()

    def record(self, key: str, value: Any, reduction: Reduce) -> None:
        reduction = Reduce(reduction)
        with self._lock:
            state = self._states.get(key)
            if state is None:
                state = new_state(reduction)
            elif state["reduction"] != reduction.value:
                raise ValueError(
                    f"metric {key!r} is already recorded with Reduce.{Reduce(state['reduction']).name} this step"
                )
            add_value(state, key, value)
            self._states[key] = state

    def drain(self) -> dict[str, State]:
        """The states recorded since the last drain; the collector starts empty again."""
        with self._lock:
            states, self._states = self._states, {}
        return states


_COLLECTOR = MetricCollector()


def record_metric(key: str, value: Any, reduction: Reduce = Reduce.MEAN) -> None:
    """Record one value of `key` in this process; reduced across processes at the end of the step."""
    _COLLECTOR.record(key, value, reduction)


def drain_states() -> dict[str, State]:
    """This process's accumulator states since the last drain (what an actor returns at step end)."""
    return _COLLECTOR.drain()
