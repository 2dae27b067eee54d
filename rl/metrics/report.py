"""`rlmesh report RUN_DIR`: PNG plots of a run's metrics and an index.html with its config and samples.

Reads only the run directory (`metrics.jsonl`, `config.toml`, `samples.jsonl`, else `rollouts.jsonl`),
so it works on a finished run and on one still writing (a half-written last line is skipped).
"""

from __future__ import annotations

import html
import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from rl.metrics.sample_log import sample_record
from rollouts.types import Rollout

PHASES = {"perf/sample_wait_time": "wait for rollouts", "time/train_s": "train", "time/weight_sync_s": "weight sync"}
"""The timed phases of a step (metrics.jsonl key -> label); the rest of `time/step_s` is "eval + other"."""


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The complete JSON lines of a file that may still be being written."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def series(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    points = [(record["step"], record[key]) for record in records if key in record]
    return [step for step, _ in points], [value for _, value in points]


def line_plot(records: list[dict[str, Any]], keys: list[str], title: str, ylabel: str, path: Path) -> bool:
    """One line per key that the run has; False (no file) when it has none of them."""
    present = [key for key in keys if any(key in record for record in records)]
    if not present:
        return False
    figure, axes = plt.subplots(figsize=(8, 3.6))
    for key in present:
        steps, values = series(records, key)
        axes.plot(steps, values, marker="o", markersize=3, label=key)
    axes.set(title=title, xlabel="step", ylabel=ylabel)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def phase_plot(records: list[dict[str, Any]], path: Path) -> bool:
    """Seconds per step stacked by phase; "eval + other" is the rest of `time/step_s`."""
    steps = [record for record in records if "time/step_s" in record]
    if not steps:
        return False
    figure, axes = plt.subplots(figsize=(8, 3.6))
    bottom = [0.0] * len(steps)
    x = [record["step"] for record in steps]
    for key, label in PHASES.items():
        values = [record.get(key, 0.0) for record in steps]
        axes.bar(x, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values)]
    rest = [max(0.0, record["time/step_s"] - b) for record, b in zip(steps, bottom)]
    axes.bar(x, rest, bottom=bottom, label="eval + other", color="lightgray")
    axes.set(title="time per step by phase", xlabel="step", ylabel="seconds")
    axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def plots(records: list[dict[str, Any]], out: Path) -> list[str]:
    """Write every plot the run's metrics allow; returns their file names."""
    keys = {key for record in records for key in record}
    tasks = sorted(
        {
            key.split("/")[1]
            for key in keys
            if key.startswith("reward/") and key.endswith("/mean") and key.count("/") == 2
        }
    )
    rewards = ["reward/mean", "eval/reward/mean"] + [
        f"{prefix}reward/{task}/mean" for task in tasks for prefix in ("", "eval/")
    ]
    if len(tasks) == 1:  # one task: its lines equal the overall ones
        rewards = ["reward/mean", "eval/reward/mean"]
    pass_keys = sorted(
        (key for key in keys if key.startswith("eval/pass@") and not key.endswith("/rows_left_out")),
        key=lambda key: (key.count("/"), int(key.split("@")[1].split("/")[0]), key),
    )  # overall pass@1, pass@k first, then per task
    made = []
    specs = [
        ("reward.png", rewards, "reward (train: sampled; eval: held-out, mean over its samples)", "reward"),
        ("pass_at_k.png", pass_keys, "held-out pass@k (unbiased, Chen et al. 2021)", "pass@k"),
        (
            "response_length.png",
            ["rollouts/completion_tokens_mean", "rollouts/completion_tokens_max"],
            "response length",
            "tokens",
        ),
        ("truncation.png", ["rollouts/truncation_rate"], "truncated responses", "fraction"),
        ("entropy.png", ["rollouts/entropy"], "sampler entropy per token (mean -logprob of sampled tokens)", "nats"),
        (
            "kl_clip.png",
            ["train/kl", "train/mismatch_k3", "train/clip_frac_low", "train/clip_frac_high"],
            "KL and clip fractions",
            "",
        ),
        ("loss.png", ["loss", "train/pg_loss", "train/grad_norm"], "loss and gradient norm", ""),
        ("policy_lag.png", ["rollouts/policy_lag_max"], "policy lag", "versions"),
    ]
    for name, plot_keys, title, ylabel in specs:
        if line_plot(records, plot_keys, title, ylabel, out / name):
            made.append(name)
    if phase_plot(records, out / "time_per_phase.png"):
        made.append("time_per_phase.png")
    return made


def last_samples(run_dir: Path, steps: int) -> list[dict[str, Any]]:
    """Logged samples of the last `steps` steps; from rollouts.jsonl if the run logged none."""
    samples = read_jsonl(run_dir / "samples.jsonl")
    if not samples:
        records = [record for record in read_jsonl(run_dir / "rollouts.jsonl") if record["kind"] == "train"]
        samples = [
            {
                "step": record["step"],
                **sample_record(rollout, episode_id=index, target=None, advantage=rollout.advantage),
            }
            for index, record in enumerate(records)
            for rollout in [Rollout.model_validate(record["rollout"])]
        ]
    last = sorted({sample["step"] for sample in samples})[-steps:]
    return [sample for sample in samples if sample["step"] in last and sample.get("reward") is not None]


def sample_table(samples: list[dict[str, Any]]) -> str:
    columns = ["step", "reward", "advantage", "target", "prompt", "response", "status", "response_len"]
    head = "".join(f"<th>{column}</th>" for column in columns)
    rows = "".join(
        "<tr>" + "".join(f"<td><pre>{html.escape(str(sample.get(column)))}</pre></td>" for column in columns) + "</tr>"
        for sample in samples
    )
    return f"<table><tr>{head}</tr>{rows}</table>"


def write_report(run_dir: Path, last_steps: int = 3, per_side: int = 5) -> Path:
    """Write `run_dir/report/` (PNGs + index.html); returns the page's path."""
    records = read_jsonl(run_dir / "metrics.jsonl")
    if not records:
        raise FileNotFoundError(
            f"{run_dir / 'metrics.jsonl'} is missing or empty: not a run directory, or no step logged yet"
        )
    out = run_dir / "report"
    out.mkdir(exist_ok=True)
    images = plots(records, out)
    samples = last_samples(run_dir, last_steps)
    ranked = sorted(samples, key=lambda sample: sample["reward"])
    config = (run_dir / "config.toml").read_text() if (run_dir / "config.toml").exists() else "(no config.toml)"
    last = records[-1]
    headline = ", ".join(
        f"{key} = {last[key]:.4g}" for key in ("reward/mean", "eval/reward/mean", "loss") if key in last
    )
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>rlmesh report: {html.escape(run_dir.name)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1400px}} img{{max-width:680px;margin:4px}}
table{{border-collapse:collapse;font-size:12px}} td,th{{border:1px solid #ccc;padding:4px;vertical-align:top}}
pre{{white-space:pre-wrap;margin:0;max-width:420px}}</style></head><body>
<h1>{html.escape(run_dir.name)}</h1>
<p>{len(records)} logged steps (last: step {last["step"]}). {html.escape(headline)}</p>
{"".join(f'<img src="{name}" alt="{name}">' for name in images)}
<h2>Best samples of the last {last_steps} steps</h2>{sample_table(ranked[::-1][:per_side])}
<h2>Worst samples of the last {last_steps} steps</h2>{sample_table(ranked[:per_side])}
<h2>Config</h2><pre>{html.escape(config)}</pre>
</body></html>
"""
    index = out / "index.html"
    index.write_text(page)
    return index


def report_command(run_dir: Path) -> int:
    """The CLI entry: write the report and print the page's path (2 when there is nothing to report on)."""
    try:
        print(write_report(run_dir))
    except FileNotFoundError as exc:
        print(f"rlmesh: {exc}", file=sys.stderr)
        return 2
    return 0
