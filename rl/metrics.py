"""Where a run's numbers and samples go: metrics.jsonl, rollouts.jsonl, wandb (offline), console."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tqdm import tqdm

from rl.config import Config
from rollouts.types import RolloutGroup

CONSOLE_KEYS = ("reward/mean", "eval/reward/mean", "loss", "time/step_s")


class MetricsLogger:
    """One flat JSON object per step in `metrics.jsonl`, mirrored to wandb and a console line."""

    def __init__(self, config: Config, run_dir: Path):
        self.run_dir = run_dir
        self.metrics_file = open(run_dir / "metrics.jsonl", "a")
        self.rollouts_file = open(run_dir / "rollouts.jsonl", "a") if config.run.log_rollouts else None
        self.wandb_run = None
        if config.wandb.enabled and config.wandb.mode != "disabled":
            os.environ.setdefault("WANDB_SILENT", "true")
            import wandb

            self.wandb_run = wandb.init(
                project=config.wandb.project,
                name=config.run.name,
                dir=str(run_dir),
                mode=config.wandb.mode,
                config=config.model_dump(mode="json"),
            )

    def log(self, metrics: dict[str, Any]) -> None:
        self.metrics_file.write(json.dumps(metrics, sort_keys=True) + "\n")
        self.metrics_file.flush()
        if self.wandb_run is not None:
            self.wandb_run.log(metrics, step=int(metrics["step"]))
        shown = " ".join(f"{key}={metrics[key]:.4g}" for key in CONSOLE_KEYS if key in metrics)
        tqdm.write(f"step {metrics['step']:>4} v{metrics.get('policy_version', 0)} {shown}")

    def log_rollouts(self, step: int, kind: str, groups: list[RolloutGroup]) -> None:
        if self.rollouts_file is None:
            return
        for group in groups:
            for rollout in group.rollouts:
                record = {"step": step, "kind": kind, "example": group.example, "rollout": rollout.model_dump(mode="json")}
                self.rollouts_file.write(json.dumps(record) + "\n")
        self.rollouts_file.flush()

    def close(self) -> None:
        self.metrics_file.close()
        if self.rollouts_file is not None:
            self.rollouts_file.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()
