"""Soak: a long run that samples the resident memory of every rlmesh process by role, and the run directory's size.

Not a test: `python benchmarks/soak.py --steps 150` runs the main job's config (SmolLM2-135M, checkpoints
every 10 steps, sample logging and rollout logging on, as `scripts/run.sh` runs it) and prints, at step
1, at the end of warm-up (`--warmup`) and every `--every` steps after, the RSS and private memory of each
process by its role (`launcher`, `trainer/0`, `generator/0#0`, `reward/0#0`, ...: the names
`rl.processes.titles` gives them, cut to 15 bytes; a child process counts under its parent's role), the
run directory's bytes by part, and the load average. The last step is not sampled: the run is ending there,
and the trainer letting go of the weight files it shares with the generators makes those count as theirs.
At the end: RSS and private memory per role at warm-up and every `--every` steps after, and their growth
per 100 steps after warm-up (least-squares slope), with the same for the run directory's parts."""

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
sys.path.insert(0, str(REPO))

from rl.processes.titles import role_of  # noqa: E402  (the repository on the path first)

MARKER_ENV = "RLMESH_SOAK_MARKER"


def role(process: psutil.Process, launcher_pid: int) -> str:
    """`launcher`, the role the process named itself (`rl.processes.titles`), or the nearest named ancestor's role
    with this process's name."""
    if process.pid == launcher_pid:
        return "launcher"
    name = role_of(process.pid)
    if "/" in name:  # every role has one: trainer/0, generator/0#0, reward/1#0, frozen_<model>/0#0
        return name
    for parent in process.parents():
        if parent.pid == launcher_pid:
            return f"launcher>{name}"
        if "/" in (parent_role := role_of(parent.pid)):
            return f"{parent_role}>{name}"
    return f"other:{name}"


def memory_by_role(marker: str, launcher_pid: int) -> tuple[dict[str, float], dict[str, float]]:
    """(RSS, private) MB per role, over every process started by the run (they carry `marker` in their environment).

    Private memory (USS: pages no other process maps) leaves out the shared weight files, the mapped libraries
    and whatever a process shares with its children, so it is where a leak shows."""
    rss: dict[str, float] = {}
    private: dict[str, float] = {}
    for process in psutil.process_iter():
        try:
            if process.environ().get(MARKER_ENV) != marker:
                continue
            name = role(process, launcher_pid)
            memory = process.memory_full_info()
            rss[name] = rss.get(name, 0.0) + memory.rss / 2**20
            private[name] = private.get(name, 0.0) + memory.uss / 2**20
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, FileNotFoundError):
            continue
    return rss, private


def run_dir_mb(run_dir: Path) -> dict[str, float]:
    """MB on disk by part: `checkpoints/`, each log file, `wandb/`, everything else."""
    parts: dict[str, float] = {}
    if not run_dir.is_dir():
        return parts
    for path in run_dir.rglob("*"):
        if not path.is_file():
            continue
        relative = path.relative_to(run_dir).parts
        part = relative[0] if relative[0] in ("checkpoints", "wandb") or len(relative) == 1 else "other"
        parts[part] = parts.get(part, 0.0) + path.stat().st_size / 2**20
    return parts


def slope_per_100(points: list[tuple[int, float]]) -> float:
    """Least-squares growth per 100 steps of (step, value) points."""
    if len(points) < 2:
        return float("nan")
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    var = sum((x - mean_x) ** 2 for x, _ in points)
    return 100 * sum((x - mean_x) * (y - mean_y) for x, y in points) / var if var else float("nan")


def table(samples: list[tuple[int, dict[str, float]]], warmup: int, unit: str) -> str:
    """Markdown: one row per key, its value at each sampled step from warm-up on, and its growth per 100 steps after."""
    after = [(step, values) for step, values in samples if step >= warmup]
    keys = sorted({key for _, values in after for key in values})
    lines = [
        f"| {unit} | " + " | ".join(f"step {step}" for step, _ in after) + " | growth / 100 steps |",
        "|---" * (len(after) + 2) + "|",
    ]
    for key in keys:
        points = [(step, values[key]) for step, values in after if key in values]
        cells = " | ".join(f"{values[key]:.0f}" if key in values else "-" for _, values in after)
        lines.append(f"| {key} | {cells} | {slope_per_100(points):+.1f} |")
    total = [(step, sum(values.values())) for step, values in after]
    lines.append("| total | " + " | ".join(f"{value:.0f}" for _, value in total) + f" | {slope_per_100(total):+.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--every", type=int, default=50, help="sample every N steps after warm-up")
    parser.add_argument("--warmup", type=int, default=25, help="growth is measured from this step on")
    parser.add_argument("--config", default=str(REPO / "configs" / "sum_digits_smollm2_cpu.toml"))
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("overrides", nargs="*", help="more --section.key value overrides for the run")
    args = parser.parse_args()
    marker = uuid.uuid4().hex
    output_dir = Path(tempfile.mkdtemp(prefix="rlmesh-soak-"))
    command = [
        sys.executable,
        "-m",
        "rl.commands.cli",
        "train",
        "--config",
        args.config,
        "--run.steps",
        str(args.steps),
        "--run.output_dir",
        str(output_dir),
        "--checkpoint.every_steps",
        str(args.checkpoint_every),
        "--sample_logging.enabled",
        "true",
        "--run.log_rollouts",
        "true",
        *args.overrides,
    ]
    print(" ".join(command), flush=True)
    launcher = subprocess.Popen(
        command,
        cwd=REPO,
        env={**os.environ, MARKER_ENV: marker, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    rss: list[tuple[int, dict[str, float]]] = []
    private: list[tuple[int, dict[str, float]]] = []
    disk: list[tuple[int, dict[str, float]]] = []
    start = time.monotonic()
    for line in launcher.stdout:
        if not (line.startswith("step ") and " v" in line):
            continue
        step = int(line.split()[1])
        if step < args.steps and (
            step == 1 or step == args.warmup or (step > args.warmup and (step - args.warmup) % args.every == 0)
        ):
            run_dirs = [path for path in output_dir.iterdir() if path.is_dir()]
            rss_mb, private_mb = memory_by_role(marker, launcher.pid)
            rss.append((step, rss_mb))
            private.append((step, private_mb))
            disk.append((step, run_dir_mb(run_dirs[0]) if run_dirs else {}))
            load = " ".join(f"{value:.1f}" for value in os.getloadavg())
            print(
                f"step {step:4d}  {time.monotonic() - start:7.0f} s  load {load}  RSS MB "
                + "  ".join(f"{name}={mb:.0f}" for name, mb in sorted(rss[-1][1].items()))
                + "  private MB "
                + "  ".join(f"{name}={mb:.0f}" for name, mb in sorted(private[-1][1].items()))
                + "  run dir MB "
                + "  ".join(f"{name}={mb:.1f}" for name, mb in sorted(disk[-1][1].items())),
                flush=True,
            )
    launcher.wait()
    print(
        f"\nexit code {launcher.returncode} after {time.monotonic() - start:.0f} s, run dir under {output_dir}, "
        f"load average now {' '.join(f'{value:.1f}' for value in os.getloadavg())}"
    )
    print(f"\nRSS (MB) by role from warm-up (step {args.warmup}) on:\n" + table(rss, args.warmup, "role"))
    print("\nPrivate memory (MB) by role from warm-up on:\n" + table(private, args.warmup, "role"))
    print("\nRun directory (MB) by part from warm-up on:\n" + table(disk, args.warmup, "part"))


if __name__ == "__main__":
    main()
