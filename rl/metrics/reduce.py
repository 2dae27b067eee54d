"""`record_metric(key, value, reduction)`: per-process accumulators whose states merge exactly.

Every process (controller, each actor) holds one `MetricCollector`. Code anywhere records into
it; at the end of a step the controller drains its own states and gathers the actors' (the
`metric_states` endpoint of `rl.metrics.actor.MetricsActor`), and `reduce_states` merges them
into one value per key. States, not values, are merged: a mean is weighted by counts and a std
comes from merged moments, so N processes give the same numbers as one process seeing it all.
"""

from __future__ import annotations

import math
import numbers
import threading
from enum import StrEnum
from typing import Any

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
    if reduction is Reduce.MEAN:
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
        elif state["count"]:  # Chan et al.'s pairwise combination of (count, mean, M2)
            count = merged["count"] + state["count"]
            delta = state["mean"] - merged["mean"]
            merged["m2"] += state["m2"] + delta * delta * merged["count"] * state["count"] / count
            merged["mean"] += delta * state["count"] / count
            merged["count"] = count
    return merged


def state_value(state: State) -> float | list[dict]:
    """The reduced value of a state (a list of sample dicts for Reduce.SAMPLE)."""
    reduction = Reduce(state["reduction"])
    if reduction is Reduce.MEAN:
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
                raise ValueError(f"metric {key!r} is already recorded with Reduce.{Reduce(state['reduction']).name} this step")
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
