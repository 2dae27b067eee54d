"""Where reduced metrics and samples go. Every backend has the same two calls, once per step:
`log(metrics, step)` with flat scalars and `log_samples(samples, step)` with sample dicts by key."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Protocol

from tqdm import tqdm

from rl.config.metrics import WandbConfig

CONSOLE_KEYS = ("reward/mean", "eval/reward/mean", "loss", "rollouts/completion_tokens_mean", "time/step_s")
CONSOLE_KEYS_IF_NONZERO = ("rollouts/new_samples",)
"""Shown on the step's line only when they are not 0: something the user should look at (a re-render split rollouts)."""


class Backend(Protocol):
    name: str

    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def log_samples(self, samples: dict[str, list[dict[str, Any]]], step: int) -> None: ...

    def close(self) -> None: ...


def short_name(key: str) -> str:
    """`reward/mean` → `reward`, `eval/reward/mean` → `eval_reward`, `time/step_s` → `step_s`: bar labels."""
    parts = [part for part in key.split("/") if part not in ("mean", "time", "rollouts")]
    return "_".join(parts)


def clip(text: str, width: int, from_end: bool = False) -> str:
    """`text` on one line (newlines shown as ⏎), cut to `width` characters with an ellipsis."""
    flat = str(text).replace("\n", "⏎")
    if len(flat) <= width:
        return flat
    return "…" + flat[-(width - 1) :] if from_end else flat[: width - 1] + "…"


def sample_line(step: int, sample: dict[str, Any]) -> str:
    """One logged sample as one console line: what it scored and the end of its prompt, then the start of its reply."""

    def number(key: str) -> str:
        value = sample.get(key)
        return f"{value:.3g}" if isinstance(value, (int, float)) else "-"

    head = (
        f"  sample step {step} {sample.get('task', '?')} #{sample.get('episode_id', '?')} reward={number('reward')} "
        f"adv={number('advantage')}"
    )
    if sample.get("status"):
        head += f" {sample['status']}"
    if sample.get("error"):
        head += f" error={clip(sample['error'], 60)!r}"
    return f"{head} | {clip(sample.get('prompt', ''), 40, from_end=True)!r} -> {clip(sample.get('response', ''), 60)!r}"


class ConsoleBackend:
    """A line per step and the progress bar's postfix (the latest value of each key metric, so the
    held-out reward stays shown between validations); with `samples`, a line per logged sample.

    Everything goes through `tqdm.write`, so the live bar stays at the bottom of the terminal.
    """

    name = "console"

    def __init__(self, samples: bool = False) -> None:
        """`samples`: print each logged sample, one line each (`sample_logging.console`)."""
        self.samples = samples
        self.bar: tqdm | None = None
        self.latest: dict[str, str] = {}

    def log(self, metrics: dict[str, float], step: int) -> None:
        shown = {key: metrics[key] for key in CONSOLE_KEYS if key in metrics}
        shown |= {key: metrics[key] for key in CONSOLE_KEYS_IF_NONZERO if metrics.get(key)}
        text = " ".join(f"{key}={value:.4g}" for key, value in shown.items())
        if metrics.get("eval/failed"):  # held-out samples left out of the eval numbers beside them
            text += f" eval/failed={int(metrics['eval/failed'])}"
        tqdm.write(f"step {step:>4} v{int(metrics.get('policy_version', 0))} {text}")
        if self.bar is not None:
            self.latest.update({short_name(key): f"{value:.3g}" for key, value in shown.items()})
            self.bar.set_postfix(self.latest, refresh=True)

    def log_samples(self, samples: dict[str, list[dict[str, Any]]], step: int) -> None:
        if self.samples:
            tqdm.write("\n".join(sample_line(step, row) for rows in samples.values() for row in rows))

    def close(self) -> None:
        pass


class JsonlBackend:
    """`metrics.jsonl`: one flat object per step; `samples.jsonl`: one object per sample with its step and key."""

    name = "jsonl"

    def __init__(self, metrics_path: Path, samples_path: Path):
        self.metrics_file = open(metrics_path, "a")
        self.samples_path = samples_path
        self.samples_file = None

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.metrics_file.write(json.dumps({"step": step, **metrics}, sort_keys=True) + "\n")
        self.metrics_file.flush()

    def log_samples(self, samples: dict[str, list[dict[str, Any]]], step: int) -> None:
        if self.samples_file is None:
            self.samples_file = open(self.samples_path, "a")
        for key, rows in samples.items():
            for row in rows:
                # any value: as text
                self.samples_file.write(json.dumps({"step": step, "key": key, **row}, default=str) + "\n")
        self.samples_file.flush()

    def close(self) -> None:
        self.metrics_file.close()
        if self.samples_file is not None:
            self.samples_file.close()


class WandbBackend:
    """A wandb run in the run directory (offline unless `wandb.mode = "online"`); samples as a `wandb.Table` per step."""

    name = "wandb"

    def __init__(self, config: WandbConfig, run_dir: Path, run_config: dict[str, Any]):
        """`run_config`: the resolved run config (JSON), recorded with the run, which is named after its `run.name`."""
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        self.wandb = wandb
        self.run = wandb.init(
            project=config.project,
            name=run_config["run"]["name"],
            dir=str(run_dir),
            mode=config.mode,
            config=run_config,
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def log_samples(self, samples: dict[str, list[dict[str, Any]]], step: int) -> None:
        tables = {}
        for key, rows in samples.items():
            columns = list(dict.fromkeys(column for row in rows for column in row))
            tables[key] = self.wandb.Table(
                columns=columns,
                data=[[row.get(column) for column in columns] for row in rows],
                allow_mixed_types=True,
            )
        self.run.log(tables, step=step)

    def close(self) -> None:
        self.run.finish()
