"""Delta weight sync per step of finished runs, as a markdown table: bytes that crossed against the full version (the
first sync's), the changed fraction, whether the version went as a delta, and the sync's seconds.

    python benchmarks/delta_sync.py RUN_DIR [RUN_DIR ...]

The main job's measurement (docs/loop.md#delta-weight-sync): `configs/sum_digits_smollm2_cpu.toml` with
`--generator.dtype bfloat16 --loss.rollout_correction.preset decoupled_token_is --trainer.lr LR`, one run per LR.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def rows(run_dir: Path) -> list[dict]:
    """Each step's weight-sync metrics (steps that synced)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [record for record in records if "weight_sync/bytes" in record]


def table(run_dir: Path) -> str:
    steps = rows(run_dir)
    full = steps[0]["weight_sync/bytes"]
    lines = [
        f"{run_dir}: full version {full / 1e6:.1f} MB",
        "",
        "| step | bytes (MB) | of full | changed | delta | sync s |",
        "|---|---|---|---|---|---|",
    ]
    for record in steps:
        sent = record["weight_sync/bytes"]
        lines.append(
            f"| {record['step']} | {sent / 1e6:.2f} | {sent / full:.1%} | "
            f"{record.get('weight_sync/changed_fraction', float('nan')):.2%} | {int(record.get('weight_sync/delta', 0))} | "
            f"{record.get('time/weight_sync_s', float('nan')):.2f} |"
        )
    later = steps[1:]
    if later:
        mean_bytes = sum(record["weight_sync/bytes"] for record in later) / len(later)
        mean_s = sum(record.get("time/weight_sync_s", 0.0) for record in later) / len(later)
        lines.append(
            f"\nsteps 2..: mean {mean_bytes / 1e6:.2f} MB ({mean_bytes / full:.1%} of full), {mean_s:.2f} s a sync"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", type=Path, nargs="+")
    for run_dir in parser.parse_args(argv).run_dirs:
        print(table(run_dir), end="\n\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
