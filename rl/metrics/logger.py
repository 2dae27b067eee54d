"""A run's logging front: reduces each step's metrics once and fans them out to the backends.

A step's numbers come from two places: the plain dict the controller built (values it measured
itself) and the `record_metric` accumulators of every process, gathered and merged exactly. A
backend that raises (disk full, a wandb error) is switched off with one warning; the run goes on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from rl.config.metrics import WandbConfig
from rl.console import warn
from rl.metrics.backends import Backend, ConsoleBackend, JsonlBackend, WandbBackend
from rl.metrics.reduce import State, drain_states, reduce_states
from rollouts.types import RolloutGroup


class MetricsLogger:
    def __init__(
        self,
        run_dir: Path,
        *,
        log_rollouts: bool,
        wandb: WandbConfig | None = None,
        run_config: dict[str, Any] | None = None,
        backends: list[Backend] | None = None,
        console_samples: bool = False,
    ):
        """`log_rollouts`: `run.log_rollouts`; `wandb` (None = off) with `run_config`, the resolved config wandb records;
        `console_samples`: `sample_logging.console`."""
        self.run_dir = run_dir
        self.console = ConsoleBackend(samples=console_samples)
        if backends is None:
            # metrics.jsonl first: a step is on disk before the console shows it (a kill right after sees it saved)
            backends = [JsonlBackend(run_dir / "metrics.jsonl", run_dir / "samples.jsonl"), self.console]
            if wandb is not None and wandb.enabled and wandb.mode != "disabled":
                backends.append(WandbBackend(wandb, run_dir, run_config or {}))
        self.backends = backends
        self.rollouts_file = open(run_dir / "rollouts.jsonl", "a") if log_rollouts else None

    def progress(self, first: int, steps: int) -> Iterable[int]:
        """Steps `first`..`steps`-1 (a resumed run starts past 0) behind a live bar: ETA, and the last
        step's key metrics as its postfix. Only on a terminal: when stderr is a file or a pipe (CI, `| tee`, nohup)
        the bar's carriage-return redraws would land as fragments between the step lines, so there is none."""
        bar = tqdm(
            range(first, steps),
            desc="train",
            unit="step",
            dynamic_ncols=True,
            initial=first,
            total=steps,
            disable=None,  # tqdm: off when its stream (stderr) is not a TTY
        )
        self.console.bar = bar
        return bar

    def log_step(self, step: int, metrics: dict[str, Any], actor_states: list[dict[str, State]] = ()) -> dict[str, Any]:
        """Merge `metrics` with everything recorded in this process and in `actor_states`; log; return the merged dict."""
        merged, samples = self.reduce_step(metrics, actor_states)
        self.write_step(step, merged, samples)
        return merged

    def reduce_step(
        self, metrics: dict[str, Any], actor_states: list[dict[str, State]] = ()
    ) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
        """The step's record: `metrics` merged with what was recorded in this process and in `actor_states`
        (drained), and the samples; what a checkpoint commits before the step is logged."""
        recorded, samples = reduce_states([drain_states(), *actor_states])
        clash = sorted(recorded.keys() & metrics.keys())
        if clash:
            raise ValueError(f"metrics {clash} were both recorded with record_metric and set in the step's dict")
        return {**metrics, **recorded}, samples

    def write_step(self, step: int, merged: dict[str, Any], samples: dict[str, list[dict[str, Any]]]) -> None:
        """Log a reduced record (`reduce_step`) to every backend: samples first, then the metrics."""
        if samples:
            self._fan_out("log_samples", samples, step)
        self._fan_out("log", merged, step)

    def _fan_out(self, method: str, payload: dict[str, Any], step: int) -> None:
        for backend in list(self.backends):
            try:
                getattr(backend, method)(payload, step)
            except Exception as exc:  # a logging failure must not end a training run
                self.backends.remove(backend)
                warn(f"{backend.name} logging failed and is off for the rest of the run: {exc!r}")

    def log_rollouts(self, step: int, kind: str, groups: list[RolloutGroup]) -> None:
        if self.rollouts_file is None:
            return
        for group in groups:
            for rollout in group.rollouts:
                record = {
                    "step": step,
                    "kind": kind,
                    "example": group.example,
                    "rollout": rollout.model_dump(mode="json"),
                }
                self.rollouts_file.write(json.dumps(record) + "\n")
        self.rollouts_file.flush()

    def close(self) -> None:
        if self.console.bar is not None:
            self.console.bar.close()
        for backend in self.backends:
            try:
                backend.close()
            except Exception as exc:
                warn(f"closing {backend.name} logging failed: {exc!r}")
        if self.rollouts_file is not None:
            self.rollouts_file.close()
