"""Prefix-sharing gain and packing efficiency of a finished run's training batches, from its token-exact rollouts.

    .venv/bin/python benchmarks/prefix_sharing_gain.py RUN_DIR [--seq-len N]

Rebuilds every step's samples from `rollouts.jsonl` (the trained kind) and packs them both ways:
samples side by side and as prefix trees (`rl.packing.prefix_tree`). Prints, per step and overall, the logical
tokens, the forwarded tokens of the trees, their ratio (the gain) and the packing efficiency of each layout.
"""

from __future__ import annotations

import argparse
import json
import tomllib
from collections import defaultdict
from pathlib import Path

from rl.algorithms.samples import rollout_to_samples
from rl.packing.prefix_tree import pack_batch, packing_metrics
from rollouts.types import Rollout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--seq-len", type=int, help="row capacity (default: the run's trainer.seq_len)")
    args = parser.parse_args()
    config = tomllib.loads((args.run_dir / "config.toml").read_text())
    seq_len = args.seq_len or config["trainer"]["seq_len"]
    steps: dict[int, list] = defaultdict(list)
    for line in (args.run_dir / "rollouts.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == "train":
            rollout = Rollout.model_validate(record["rollout"])
            steps[record["step"]].extend(s for s in rollout_to_samples(rollout, 1.0) if len(s.input_ids) <= seq_len)
    totals = defaultdict(float)
    print("step  logical  forwarded  gain  efficiency(side by side)  efficiency(trees)")
    for step, samples in sorted(steps.items()):
        flat = packing_metrics(pack_batch(samples, seq_len=seq_len, pad_token_id=0, prefix_sharing=False))
        tree = packing_metrics(pack_batch(samples, seq_len=seq_len, pad_token_id=0, prefix_sharing=True))
        for key, value in (
            ("logical", tree["train/logical_tokens"]),
            ("forward", tree["train/forward_tokens"]),
            ("flat_eff", flat["train/packing_efficiency"]),
            ("tree_eff", tree["train/packing_efficiency"]),
        ):
            totals[key] += value
        print(
            f"{step:4d}  {tree['train/logical_tokens']:7.0f}  {tree['train/forward_tokens']:9.0f}  "
            f"{tree['train/logical_tokens'] / tree['train/forward_tokens']:4.2f}  {flat['train/packing_efficiency']:24.2f}  "
            f"{tree['train/packing_efficiency']:17.2f}"
        )
    n = len(steps)
    print(
        f" all  {totals['logical']:7.0f}  {totals['forward']:9.0f}  {totals['logical'] / totals['forward']:4.2f}  "
        f"{totals['flat_eff'] / n:24.2f}  {totals['tree_eff'] / n:17.2f}   (seq_len {seq_len}, {n} steps)"
    )


if __name__ == "__main__":
    main()
