"""`rlmesh report RUN_DIR`: PNG plots of a run's metrics and an index.html with its config and samples;
`rlmesh report RUN_DIR RUN_DIR ...`: the runs compared (a line per run, the config keys on which they differ).

Reads only the run directory (`metrics.jsonl`, `config.toml`, `samples.jsonl`, else `rollouts.jsonl`),
so it works on a finished run and on one still writing (a half-written last line is skipped).
"""

from __future__ import annotations

import html
import json
import tomllib
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from rl.console import fail
from rl.metrics.sample_log import sample_record
from rollouts.types import Rollout

KL_KEYS = ["train/kl", "train/mismatch_k3", "train/ppo_kl"]
KL_FLOOR = 2.0**-24
"""Half of float32's machine epsilon (6e-8): the rounding of one `exp(-d) + d - 1` term near d = 0. The estimators are
never negative in exact arithmetic; a mean below this (an on-policy run's `train/mismatch_k3` of -6e-10) is noise."""

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


def folded_lines(records: list[dict[str, Any]], keys: list[str]) -> list[tuple[str, str]]:
    """(key, label) of each line to draw: a key the run has, unless its series is identical to an earlier key's (e.g.
    `train/pg_loss` when it is the only term of `loss`), which is named in that key's label instead of hiding it."""
    present = [key for key in keys if any(key in record for record in records)]
    drawn: dict[str, list[str]] = {}
    for key in present:
        same = next((first for first in drawn if series(records, first) == series(records, key)), None)
        if same is None:
            drawn[key] = []
        else:
            drawn[same].append(key)
    return [(key, f"{key} (= {', '.join(twins)})" if twins else key) for key, twins in drawn.items()]


def drawn_lines(
    records: list[dict[str, Any]], keys: list[str], floor: float | None = None
) -> tuple[list[tuple[str, list[int], list[float]]], bool]:
    """(label, steps, values) of each line `line_plot` draws, and whether a value was below `floor` (drawn at it)."""
    lines, clamped = [], False
    for key, label in folded_lines(records, keys):
        steps, values = series(records, key)
        if floor is not None:
            clamped |= any(value < floor for value in values)
            values = [max(value, floor) for value in values]
        lines.append((label, steps, values))
    return lines, clamped


def line_plot(
    records: list[dict[str, Any]], keys: list[str], title: str, ylabel: str, path: Path, floor: float | None = None
) -> bool:
    """One line per key that the run has (identical series folded into one label); False (no file) when it has none.
    `floor`: a log-scale axis on which values below `floor` (rounding noise, possibly negative) are drawn at it."""
    lines, clamped = drawn_lines(records, keys, floor)
    if not lines:
        return False
    figure, axes = plt.subplots(figsize=(8, 3.6))
    for label, steps, values in lines:
        axes.plot(steps, values, marker="o", markersize=3, label=label)
    if floor is not None:
        axes.set_yscale("log")
        if clamped:
            axes.axhline(
                floor, color="gray", linestyle="--", linewidth=0.8, label=f"{floor:.0e}: values below, drawn here"
            )
            title += f"\n(values below {floor:.0e}, float32 rounding of exp(-d) + d - 1, even negative ones: indistinguishable from 0)"
    axes.set(title=title, xlabel="step", ylabel=ylabel)
    return _save(figure, axes, path)


def _save(figure: Any, axes: Any, path: Path) -> bool:
    """A line panel's common finish (small title, grid, legend outside the axes) written to `path`."""
    axes.title.set_fontsize(9)
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
    # overall pass@1, pass@k first, then per task
    pass_keys = sorted(
        (key for key in keys if key.startswith("eval/pass@") and not key.endswith("/rows_left_out")),
        key=lambda key: (key.count("/"), int(key.split("@")[1].split("/")[0]), key),
    )
    memory_keys = sorted(key for key in keys if key.startswith("memory/") and key.endswith("_mb"))
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
        ("kl.png", KL_KEYS, "KL estimates (log scale)", "nats per token", KL_FLOOR),
        ("clip.png", ["train/clip_frac_low", "train/clip_frac_high"], "PPO clip fractions", "fraction"),
        (
            "loss.png",
            ["loss", "train/pg_loss", "train/ce_loss", "train/ref_kl_loss"],
            "loss (a term equal to the loss is named in its label)",
            "",
        ),
        ("grad_norm.png", ["train/grad_norm"], "gradient norm (before clipping)", ""),
        ("policy_lag.png", ["rollouts/policy_lag_max"], "policy lag", "versions"),
        ("memory.png", memory_keys, "peak memory per role during each step (the largest of its processes)", "MiB"),
    ]
    for name, plot_keys, title, ylabel, *floor in specs:
        if line_plot(records, plot_keys, title, ylabel, out / name, *floor):
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


def best_and_worst(samples: list[dict[str, Any]], per_side: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The `per_side` highest- and lowest-reward samples, never the same sample on both sides: with fewer than
    2 x `per_side` logged, the upper half (the middle one included) is "best" and the rest "worst"."""
    ranked = sorted(samples, key=lambda sample: sample["reward"], reverse=True)
    best_count = min(per_side, (len(ranked) + 1) // 2)
    worst_count = min(per_side, len(ranked) - best_count)
    return ranked[:best_count], ranked[len(ranked) - worst_count :][::-1]


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
    best, worst = best_and_worst(last_samples(run_dir, last_steps), per_side)
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
<h2>Best samples of the last {last_steps} steps ({len(best)})</h2>{sample_table(best)}
<h2>Worst samples of the last {last_steps} steps ({len(worst)})</h2>{sample_table(worst)}
<h2>Config</h2><pre>{html.escape(config)}</pre>
</body></html>
"""
    index = out / "index.html"
    index.write_text(page)
    return index


COMPARED_KEYS = [
    ("reward/mean", "train reward (sampled)", None),
    ("eval/reward/mean", "held-out reward", None),
    ("eval/pass@1", "held-out pass@1", None),
    ("loss", "loss", None),
    ("train/mismatch_k3", "sampler vs trainer k3 (log scale)", KL_FLOOR),
    ("rollouts/completion_tokens_mean", "response length (tokens)", None),
    ("rollouts/truncation_rate", "truncated responses", None),
    ("time/step_s", "seconds per step", None),
]
"""The keys `rlmesh report A B ...` draws with one line per run (each that at least one run has), and their floor."""


def flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A TOML table as dotted keys (`[[tasks]]` entries by index: `tasks.0.name`)."""
    flat: dict[str, Any] = {}
    for name, value in table.items():
        if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            value = {str(index): item for index, item in enumerate(value)}
        if isinstance(value, dict):
            flat |= flatten(value, f"{prefix}{name}.")
        else:
            flat[f"{prefix}{name}"] = value
    return flat


def config_differences(run_dirs: list[Path]) -> dict[str, list[Any]]:
    """The dotted config keys whose resolved values differ between the runs' `config.toml`s, each run's value."""
    flat = [
        flatten(tomllib.loads((run_dir / "config.toml").read_text())) if (run_dir / "config.toml").exists() else {}
        for run_dir in run_dirs
    ]
    keys = sorted({key for values in flat for key in values})
    missing = "(not set)"
    return {
        key: [values.get(key, missing) for values in flat]
        for key in keys
        if len({json.dumps(values.get(key, missing), sort_keys=True) for values in flat}) > 1
    }


def comparison_plot(
    runs: dict[str, list[dict[str, Any]]], key: str, title: str, floor: float | None, path: Path
) -> bool:
    """`key` over steps, one line per run that has it (`floor` as in `line_plot`); False (no file) when none has it."""
    lines = {label: drawn_lines(records, [key], floor) for label, records in runs.items()}
    present = {label: line for label, (found, _) in lines.items() for line in found}
    if not present:
        return False
    figure, axes = plt.subplots(figsize=(8, 3.6))
    for label, (_, steps, values) in present.items():
        axes.plot(steps, values, marker="o", markersize=3, label=label)
    if floor is not None:
        axes.set_yscale("log")
        if any(clamped for _, clamped in lines.values()):
            title += f" (values below {floor:.0e}, rounding, drawn at it)"
    axes.set(title=f"{title}: {key}", xlabel="step")
    return _save(figure, axes, path)


def write_comparison(run_dirs: list[Path], out: Path) -> Path:
    """Write `out/` (one PNG per compared key, a line per run, and index.html with a summary per run and the config
    keys on which the runs differ); returns the page's path. Each run is labelled by its directory as given."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for run_dir in run_dirs:
        records = read_jsonl(run_dir / "metrics.jsonl")
        if not records:
            raise FileNotFoundError(
                f"{run_dir / 'metrics.jsonl'} is missing or empty: not a run directory, or no step logged yet"
            )
        if str(run_dir) in runs:
            raise ValueError(f"{run_dir} is given twice")
        runs[str(run_dir)] = records
    out.mkdir(parents=True, exist_ok=True)
    images = [
        name
        for key, title, floor in COMPARED_KEYS
        if comparison_plot(runs, key, title, floor, out / (name := key.replace("/", "_").replace("@", "_at_") + ".png"))
    ]
    summary_keys = ["reward/mean", "eval/reward/mean", "eval/pass@1", "loss"]
    head = "".join(f"<th>{html.escape(column)}</th>" for column in ["run", "last step", *summary_keys, "median s/step"])
    rows = ""
    for label, records in runs.items():
        last = {key: value for record in records for key, value in record.items()}  # each key's latest value
        step_times = sorted(record["time/step_s"] for record in records if "time/step_s" in record)
        cells = [label, str(records[-1]["step"])]
        cells += [f"{last[key]:.4g}" if key in last else "-" for key in summary_keys]
        cells.append(f"{step_times[len(step_times) // 2]:.3g}" if step_times else "-")
        rows += "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in cells) + "</tr>"
    differences = config_differences(run_dirs)
    config_head = "".join(f"<th>{html.escape(label)}</th>" for label in ["key", *runs])
    config_rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(cell))}</td>" for cell in [key, *values]) + "</tr>"
        for key, values in differences.items()
    )
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>rlmesh report: {len(runs)} runs</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1400px}} img{{max-width:680px;margin:4px}}
table{{border-collapse:collapse;font-size:12px}} td,th{{border:1px solid #ccc;padding:4px;vertical-align:top}}</style>
</head><body>
<h1>{len(runs)} runs compared</h1>
<p>The latest value of each key (a held-out key: the last validation's).</p>
<table><tr>{head}</tr>{rows}</table>
{"".join(f'<img src="{name}" alt="{name}">' for name in images)}
<h2>Config keys that differ ({len(differences)})</h2>
<table><tr>{config_head}</tr>{config_rows}</table>
</body></html>
"""
    index = out / "index.html"
    index.write_text(page)
    return index


def report_command(run_dirs: list[Path], out: Path | None = None) -> int:
    """The CLI entry: one run's report (in RUN_DIR/report/), or with several a comparison (in `out`, default
    `report-compare/` beside the first run); prints the page's path (2 when there is nothing to report on)."""
    try:
        if len(run_dirs) == 1:
            if out is not None:
                raise ValueError("--out is for comparing several runs; one run's report goes to RUN_DIR/report/")
            print(write_report(run_dirs[0]))
        else:
            print(write_comparison(run_dirs, out or run_dirs[0].parent / "report-compare"))
    except (FileNotFoundError, ValueError) as exc:
        return fail(str(exc), 2)
    return 0
