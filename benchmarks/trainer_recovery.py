"""What a trainer's death costs: recovered in the run against the launcher stopping and `--resume` after a relaunch.

Not a test: `python benchmarks/trainer_recovery.py --config tests/e2e/configs/tiny_qwen3_e2e.toml --kills 3`
SIGKILLs the trainer right after steps 2, 4, 6, ... (a checkpoint every step) and times, per kill, the seconds from
the kill to the next step's line (the step after the checkpoint, trained again):
- in-run: one launch with `run.max_trainer_recoveries = kills`; also prints each recovery's `recovery/trainer_s`
  (from the loss to the new trainer holding the checkpoint and the generators its version);
- relaunch: `run.max_trainer_recoveries = 0`; the launcher exits 1 and `rlmesh train --resume RUN_DIR` is started
  at once, as a supervisor script would.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from rl.config import load_config
from rl.processes.titles import role_of


class Launcher:
    """`rlmesh train ARGS` with its merged output read line by line."""

    def __init__(self, *args: str):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "rl.commands.cli", "train", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, text: str, timeout_s: float = 900) -> float:
        """Monotonic time at which a line holding `text` was read."""
        deadline = time.monotonic() + timeout_s
        while (line := self.lines.get(timeout=max(0.0, deadline - time.monotonic()))) is not None:
            if text in line:
                return time.monotonic()
        raise RuntimeError(f"the launcher ended before printing {text!r}")

    def kill_trainer(self) -> float:
        """SIGKILL every trainer rank's process (the launcher's children named `trainer/<rank>`: Monarch starts actor
        processes as its direct children, a process a rank forked is not one); the monotonic time of the kill."""
        ranks = []
        for child in psutil.Process(self.process.pid).children():
            try:
                if role_of(child.pid).startswith("trainer/") and child.status() != psutil.STATUS_ZOMBIE:
                    ranks.append(child.pid)
            except (psutil.Error, FileNotFoundError):
                continue
        if not ranks:
            raise RuntimeError("no trainer process found")
        for pid in ranks:
            os.kill(pid, signal.SIGKILL)
        return time.monotonic()

    def finish(self, timeout_s: float = 900) -> int:
        while self.lines.get(timeout=timeout_s) is not None:
            pass
        return self.process.wait(timeout=timeout_s)


def step_line(step: int) -> str:
    return f"step {step:>4} v"


def in_run(args: argparse.Namespace, run_args: list[str]) -> list[float]:
    launcher = Launcher(*run_args, "--run.max_trainer_recoveries", str(args.kills))
    seconds = []
    for kill in range(1, args.kills + 1):
        launcher.wait_for(step_line(2 * kill))
        killed_at = launcher.kill_trainer()
        seconds.append(launcher.wait_for(step_line(2 * kill + 1)) - killed_at)
        print(f"in-run, kill {kill}: next step logged {seconds[-1]:.1f} s after the kill", flush=True)
    if (code := launcher.finish()) != 0:
        raise RuntimeError(f"the in-run launch exited {code}")
    return seconds


def relaunch(args: argparse.Namespace, run_args: list[str], run_dir: Path) -> list[float]:
    launcher = Launcher(*run_args, "--run.max_trainer_recoveries", "0")
    seconds = []
    for kill in range(1, args.kills + 1):
        launcher.wait_for(step_line(2 * kill))
        killed_at = launcher.kill_trainer()
        if (code := launcher.finish()) != 1:
            raise RuntimeError(f"the launcher exited {code} after its trainer's death (1 expected)")
        launcher = Launcher("--resume", str(run_dir))
        seconds.append(launcher.wait_for(step_line(2 * kill + 1)) - killed_at)
        print(f"relaunch, kill {kill}: next step logged {seconds[-1]:.1f} s after the kill", flush=True)
    if (code := launcher.finish()) != 0:
        raise RuntimeError(f"the last resume exited {code}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--kills", type=int, default=3)
    args, overrides = parser.parse_known_args()
    with tempfile.TemporaryDirectory() as output_dir:
        results = {}
        for mode in ("in-run", "relaunch"):
            base = [
                *("--config", args.config, "--run.output_dir", f"{output_dir}/{mode}", "--run.eval_every", "0"),
                *("--run.steps", str(2 * args.kills + 2), "--checkpoint.every_steps", "1", "--wandb.enabled", "false"),
                *overrides,
            ]
            run_dir = Path(output_dir, mode, load_config(args.config).run.name)
            results[mode] = in_run(args, base) if mode == "in-run" else relaunch(args, base, run_dir)
            if mode == "in-run":
                metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
                results["recovery/trainer_s"] = [m["recovery/trainer_s"] for m in metrics if "recovery/trainer_s" in m]
    for name, values in results.items():
        print(f"{name:>20}: median {statistics.median(values):6.1f} s  ({', '.join(f'{v:.1f}' for v in values)})")


if __name__ == "__main__":
    main()
