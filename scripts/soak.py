"""Soak: a long run of the tiny config, sampling the resident memory of every rlmesh process.

Not a test: `python scripts/soak.py --steps 300` prints RSS per process kind every `--every`
steps, and the growth per 100 steps at the end (launcher, trainer, generator, reward).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent


def rss_by_process(marker: str, launcher_pid: int) -> dict[str, float]:
    rss: dict[str, float] = {}
    for process in psutil.process_iter():
        try:
            if process.environ().get("RLMESH_SOAK_MARKER") != marker:
                continue
            name = "launcher" if process.pid == launcher_pid else f"pid{process.pid}:{' '.join(process.cmdline())[-40:]}"
            rss[name] = process.memory_info().rss / 2**20
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=25)
    parser.add_argument("--config", default=str(REPO / "configs" / "tiny_qwen3_e2e.toml"))
    args = parser.parse_args()
    marker = uuid.uuid4().hex
    output_dir = tempfile.mkdtemp(prefix="rlmesh-soak-")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "rl.cli", "train", "--config", args.config, "--run.steps", str(args.steps),
         "--run.eval_every", "0", "--run.output_dir", output_dir, "--wandb.enabled", "false", "--run.log_rollouts", "false"],
        cwd=REPO, env={**os.environ, "RLMESH_SOAK_MARKER": marker, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    samples: list[tuple[int, dict[str, float]]] = []
    start = time.monotonic()
    for line in launcher.stdout:
        if line.startswith("step ") and " v" in line:
            step = int(line.split()[1])
            if step % args.every == 0 or step == 1:
                samples.append((step, rss_by_process(marker, launcher.pid)))
                total = sum(samples[-1][1].values())
                print(f"step {step:4d}  {time.monotonic() - start:7.0f} s  total RSS {total:8.0f} MB  "
                      + "  ".join(f"{name.split(':')[0]}={mb:.0f}" for name, mb in sorted(samples[-1][1].items())), flush=True)
    launcher.wait()
    (first_step, first), (last_step, last) = samples[0], samples[-1]
    print(f"\nRSS growth per 100 steps between step {first_step} and {last_step} (MB):")
    for name in sorted(first.keys() & last.keys()):
        growth = (last[name] - first[name]) / (last_step - first_step) * 100
        print(f"  {name:60s} {first[name]:8.0f} -> {last[name]:8.0f}  {growth:+7.1f} / 100 steps")
    print(f"exit code {launcher.returncode}, run dir {output_dir}")


if __name__ == "__main__":
    main()
