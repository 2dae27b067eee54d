"""Learning per step over many seeds: rlmesh's main job against the TRL peer (or against itself with other settings).

    .venv/bin/python benchmarks/peer_seeds.py run DIR --seeds 0-23                      # rlmesh, label "rlmesh"
    .venv/bin/python benchmarks/peer_seeds.py run DIR --seeds 0-23 --label fp64 -- --generator.fp64_sampling_noise true
    .venv/bin/python benchmarks/peer_seeds.py run DIR --seeds 0-23 --peer-python /work/peer-venv/bin/python
    .venv/bin/python benchmarks/peer_seeds.py compare DIR rlmesh peer
    .venv/bin/python benchmarks/peer_seeds.py run DIR --seeds 0-2 --steps 14 --evals --label bf16 -- --generator.dtype bfloat16

`run` trains each seed for `--steps` steps (no held-out eval unless `--evals`), one run at a time (two runs on 2 cores slow each
other and change nothing else), and keeps per seed `DIR/<label>-s<seed>.jsonl`: one line per step with the
training reward mean and the mean completion length. rlmesh runs also keep their `rollouts.jsonl`; run
directories (checkpoints) are deleted. Seeds already in DIR are skipped, so an interrupted `run` continues.
The peer is `benchmarks/peer_trl.py` in its own venv; both draw the same rows in the same order for a seed.

`--evals` keeps the main job's held-out evals (step 0, every `run.eval_every` steps, the end): the whole main job per
seed, so that compare can set held-out rewards side by side too.

`compare DIR A B` prints, over the seeds both labels have, B − A at step 1 (both sample the same base model)
and averaged over steps 2..N (after updates), with its standard error and an exact paired sign-flip p-value; then
each label's median step time and largest `train/mismatch_k3`, and the held-out rewards where the runs kept them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "sum_digits_smollm2_cpu.toml"


def parse_seeds(text: str) -> list[int]:
    """ "0-7,12" -> [0, 1, ..., 7, 12]."""
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        seeds += range(int(low), int(high or low) + 1)
    return seeds


def run_rlmesh(seed: int, steps: int, overrides: list[str], record: Path, evals: bool) -> None:
    """One rlmesh run of the main job's config; keeps its per-step rewards and its rollouts next to `record`.
    `evals`: keep the config's held-out evals (else none run)."""
    with tempfile.TemporaryDirectory(dir=record.parent) as output_dir:
        command = [
            sys.executable,
            "-m",
            "rl.commands.cli",
            "train",
            "--config",
            str(CONFIG),
            "--run.seed",
            str(seed),
            "--run.steps",
            str(steps),
            *([] if evals else ["--run.eval_every", "0"]),
            "--run.name",
            "seed",
            "--run.output_dir",
            output_dir,
            *overrides,
        ]
        subprocess.run(command, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        run_dir = Path(output_dir) / "seed"
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
        rows = [
            {
                "step": m["step"],
                "reward_mean": m["reward/mean"],
                "completion_length": m["rollouts/completion_tokens_mean"],
                "step_s": m["time/step_s"],
                "mismatch_k3": m.get("train/mismatch_k3"),
            }
            for m in metrics
            if "reward/mean" in m
        ]
        rows += [
            {"step": m["step"], "eval_reward_mean": m["eval/reward/mean"]} for m in metrics if "eval/reward/mean" in m
        ]
        shutil.copy(run_dir / "rollouts.jsonl", record.with_suffix(".rollouts.jsonl"))
    write_records(record, rows)


def run_peer(seed: int, steps: int, python: str, record: Path) -> None:
    """One TRL peer run (`benchmarks/peer_trl.py`) on the same rows; keeps its per-step rewards in `record`."""
    with tempfile.TemporaryDirectory(dir=record.parent) as output_dir:
        out = Path(output_dir) / "peer.jsonl"
        command = [
            python,
            "benchmarks/peer_trl.py",
            "--seed",
            str(seed),
            "--steps",
            str(steps),
            "--eval-every",
            "0",
            "--out",
            str(out),
        ]
        subprocess.run(
            command, cwd=REPO, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(REPO)}
        )
        rows = [{k: m[k] for k in ("step", "reward_mean", "completion_length")} for m in map(json.loads, out.open())]
    write_records(record, rows)


def write_records(record: Path, rows: list[dict]) -> None:
    """Write atomically, so an interrupted run leaves no partial record to be mistaken for a finished seed."""
    partial = record.with_suffix(".partial")
    partial.write_text("".join(json.dumps(row) + "\n" for row in rows))
    partial.replace(record)


def load(out_dir: Path, label: str, key: str = "reward_mean") -> dict[int, dict[int, float]]:
    """seed -> step -> `key` (the training reward mean by default), for every finished seed of `label`."""
    runs = {}
    for path in out_dir.glob(f"{label}-s*.jsonl"):
        seed = path.name.removeprefix(f"{label}-s").removesuffix(".jsonl")
        if seed.isdigit():
            rows = map(json.loads, path.open())
            runs[int(seed)] = {row["step"]: row[key] for row in rows if row.get(key) is not None}
    return runs


def sign_flip_p(diffs: list[float]) -> float:
    """Exact two-sided p-value of the paired sign-flip test: the share of the 2^n sign patterns whose mean is at least
    as far from 0 as the observed one (meet in the middle: sums of each half, then a sorted search)."""

    def sums(values: list[float]) -> np.ndarray:
        out = np.zeros(1)
        for value in values:
            out = np.concatenate([out + value, out - value])
        return out

    observed = abs(sum(diffs)) - 1e-9
    left, right = sums(diffs[: len(diffs) // 2]), np.sort(sums(diffs[len(diffs) // 2 :]))
    at_least = len(right) - np.searchsorted(right, observed - left, side="left")  # left + right >= observed
    at_most = np.searchsorted(right, -observed - left, side="right")  # left + right <= -observed
    count = (at_least + at_most).sum() if observed > 0 else len(left) * len(right)
    return float(count) / (len(left) * len(right))


def compare(out_dir: Path, a: str, b: str, steps: int) -> None:
    runs_a, runs_b = load(out_dir, a), load(out_dir, b)
    seeds = sorted(
        s for s in runs_a.keys() & runs_b.keys() if all(k in runs_a[s] and k in runs_b[s] for k in range(1, steps + 1))
    )
    if len(seeds) < 2:
        raise SystemExit(f"fewer than 2 seeds with {steps} steps in both {a} and {b} under {out_dir}")
    print(f"{'seed':>4}  {a + ' steps 1..' + str(steps):>28}  {b + ' steps 1..' + str(steps):>28}")
    for seed in seeds:
        print(
            f"{seed:>4}  "
            + "  ".join(
                f"{' '.join(f'{r[k]:.2f}' for k in range(1, steps + 1)):>28}" for r in (runs_a[seed], runs_b[seed])
            )
        )
    for name, window in (("step 1", [1]), (f"steps 2-{steps}", list(range(2, steps + 1)))):
        diffs = [statistics.fmean(runs_b[s][k] - runs_a[s][k] for k in window) for s in seeds]
        se = statistics.stdev(diffs) / len(diffs) ** 0.5
        print(
            f"{name}: {b} - {a} = {statistics.fmean(diffs):+.3f} (se {se:.3f}) over {len(seeds)} seeds; "
            f"{b} higher on {sum(d > 1e-3 for d in diffs)}, equal on {sum(abs(d) <= 1e-3 for d in diffs)}; "
            f"paired sign-flip p = {sign_flip_p(diffs):.3f}"
        )
    for label in (a, b):
        times = [t for s in seeds for t in load(out_dir, label, "step_s").get(s, {}).values()]
        mismatch = [m for s in seeds for m in load(out_dir, label, "mismatch_k3").get(s, {}).values()]
        evals = load(out_dir, label, "eval_reward_mean")
        if times:  # rlmesh records; the peer's have neither
            print(
                f"{label}: median step {statistics.median(times):.1f} s, largest train/mismatch_k3 {max(mismatch, default=float('nan')):.2g}"
            )
        for seed in seeds:
            if evals.get(seed):
                print(
                    f"  seed {seed} held-out: "
                    + " -> ".join(f"{v:.3f} (step {k})" for k, v in sorted(evals[seed].items()))
                )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="train each seed and keep its per-step rewards")
    run.add_argument("out_dir", type=Path)
    run.add_argument("--seeds", type=parse_seeds, required=True, help='e.g. "0-23" or "0-7,12"')
    run.add_argument("--steps", type=int, default=4)
    run.add_argument("--label", help='name of these runs in DIR (default "rlmesh", or "peer" with --peer-python)')
    run.add_argument("--peer-python", help="the TRL venv's python: run the peer instead of rlmesh")
    run.add_argument("--evals", action="store_true", help="keep the config's held-out evals (the whole main job)")
    run.epilog = "rlmesh config overrides go after --, e.g. -- --generator.fp64_sampling_noise true"
    cmp = commands.add_parser("compare", help="paired comparison of two labels over their common seeds")
    cmp.add_argument("out_dir", type=Path)
    cmp.add_argument("a")
    cmp.add_argument("b")
    cmp.add_argument("--steps", type=int, default=4)
    argv = sys.argv[1:]  # argparse's subcommands drop what follows "--", so the overrides are split off here
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    overrides = argv[cut + 1 :]
    if args.command == "compare":
        compare(args.out_dir, args.a, args.b, args.steps)
        return
    label = args.label or ("peer" if args.peer_python else "rlmesh")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        record = args.out_dir / f"{label}-s{seed}.jsonl"
        if record.exists():
            continue
        if args.peer_python:
            run_peer(seed, args.steps, args.peer_python, record)
        else:
            run_rlmesh(seed, args.steps, overrides, record, args.evals)
        print(
            f"{label} seed {seed}: rewards {[row['reward_mean'] for row in map(json.loads, record.open()) if 'reward_mean' in row]}",
            flush=True,
        )


if __name__ == "__main__":
    main()
