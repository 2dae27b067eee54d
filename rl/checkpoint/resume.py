"""`rlmesh train --resume RUN_DIR`: the config a resumed run may use, the logs it continues, and `open_run_dir`,
where every run (fresh or resumed, CLI or Python API) gets its directory.

A resume continues the saved trajectory, so only settings that do not change what is trained may
differ from the saved config: the length of the run, evaluation, logging, checkpointing,
timeouts, and where it runs (trainer ranks and hosts, `[cluster]`: a checkpoint of N ranks loads on M). Anything else (model, tasks, group size, algorithm, optimizer, sampling...) is refused
with the keys named.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rl.checkpoint import run_dir as run_dirs
from rl.checkpoint import store as checkpoint
from rl.config import Config, ConfigError, load_config
from rl.console import warn

RESUMABLE_KEYS = (
    "run.steps",
    "run.eval_every",
    "run.eval_groups",
    "run.log_rollouts",
    "run.weight_sync_timeout_s",
    "run.metrics_timeout_s",
    "run.reward_concurrency",
    "run.max_trainer_recoveries",
    "run.mismatch_warn_factor",
    "run.mismatch_warn_floor",
    "checkpoint.",
    "wandb.",
    "sample_logging.",
    "trainer.num_procs",
    "trainer.num_hosts",
    "trainer.call_timeout_s",
    "cluster.",
)
"""Keys (or section prefixes ending in ".") a resume may override."""


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        return {key: value for name, item in data.items() for key, value in _flatten(item, f"{prefix}{name}.").items()}
    if isinstance(data, list) and data and all(isinstance(item, dict) for item in data):
        return {
            key: value for index, item in enumerate(data) for key, value in _flatten(item, f"{prefix}{index}.").items()
        }
    return {prefix.rstrip("."): data}


def changed_keys(saved: Config, resumed: Config) -> list[str]:
    """Dotted keys whose values differ between two configs, sorted."""
    before, after = _flatten(saved.model_dump(mode="json")), _flatten(resumed.model_dump(mode="json"))
    return sorted(key for key in before.keys() | after.keys() if before.get(key) != after.get(key))


def resume_config(run_dir: Path, overrides: dict[str, str]) -> tuple[Config, Path]:
    """The config to resume `run_dir` with, and its newest loadable committed checkpoint (a damaged newer
    one is skipped with a warning naming why); ConfigError if refused."""
    if not (run_dir / "config.toml").is_file():
        raise ConfigError(f"{run_dir} is not a run directory (no config.toml)")
    try:
        newest = checkpoint.newest_loadable(run_dir, resumable=True)
    except FileNotFoundError as exc:
        raise ConfigError(str(exc)) from None
    saved = load_config(newest / "config.toml")
    resumed = load_config(newest / "config.toml", overrides)
    refused = [key for key in changed_keys(saved, resumed) if not key.startswith(RESUMABLE_KEYS)]
    if refused:
        raise ConfigError(
            f"cannot resume {run_dir} with a different {', '.join(refused)}: that would change the run's trajectory. "
            f"A resume may change only {', '.join(RESUMABLE_KEYS)}"
        )
    step = checkpoint.read(newest, checkpoint.RUN_STATE)["step"]
    if resumed.run.steps < step:
        raise ConfigError(f"run.steps = {resumed.run.steps} is below the checkpoint's step {step}")
    if resumed.run.steps == step:
        raise NothingToResume(
            f"{run_dir} has finished its run.steps = {step} steps: nothing to resume. "
            f"Train it further with --run.steps N (N > {step})"
        )
    return resumed, newest


class NothingToResume(ConfigError):
    """The run directory finished its `run.steps`: a resume without more steps has nothing to do (exit 0)."""


LOGS = ("metrics.jsonl", "rollouts.jsonl", "samples.jsonl")


def truncate_logs(run_dir: Path, step: int) -> None:
    """Drop records logged after `step` (written after the checkpoint, before the run stopped), and any
    line that is not a whole record (a launcher killed mid-write leaves a torn last line) with a warning."""
    for name in LOGS:
        path = run_dir / name
        if not path.exists():
            continue
        kept = []
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            try:
                record = json.loads(line)
            except ValueError:
                warn(f"{path} line {number} is not a whole record (a write cut short): dropped")
                continue
            if record["step"] <= step:
                kept.append(line + "\n")
        path.write_text("".join(kept))


def restore_logs(run_dir: Path, resume_from: Path) -> None:
    """Make the logs end at the checkpoint's step: later records dropped (`truncate_logs`), and the step's
    own metrics and samples written from the checkpoint if the run stopped before logging them."""
    from rl.metrics.backends import JsonlBackend

    step = checkpoint.read(resume_from, checkpoint.RUN_STATE)["step"]
    truncate_logs(run_dir, step)
    record = checkpoint.read(resume_from, checkpoint.STEP_RECORD)
    metrics_path = run_dir / "metrics.jsonl"
    logged = metrics_path.exists() and any(
        json.loads(line)["step"] == step for line in metrics_path.read_text().splitlines()
    )
    if record is None or logged:
        return
    metrics, samples = record
    backend = JsonlBackend(metrics_path, run_dir / "samples.jsonl")
    if samples:
        backend.log_samples(samples, step)
    backend.log(metrics, step)
    backend.close()


def take_over(run_dir: Path, resume_from: Path) -> run_dirs.RunDirLock:
    """Make `run_dir` this process's to continue from checkpoint `resume_from`: lock it (`RunDirBusy` while another
    process writes it), set newer checkpoints aside, and make the logs end at the checkpoint's step."""
    lock = run_dirs.lock(run_dir)
    for moved in checkpoint.set_aside(run_dir, resume_from):
        warn(f"a checkpoint newer than the one resumed is kept aside as {moved}")
    restore_logs(run_dir, resume_from)
    return lock


def open_run_dir(run_dir: Path, config_toml: str, resume_from: Path | None) -> tuple[Path, run_dirs.RunDirLock | None]:
    """A resumed run's own directory (`RUN_DIR/checkpoints/step_N` → `RUN_DIR`), else a fresh one claimed
    (`rl.checkpoint.run_dir`) holding the resolved config; and the lock this call took. `rlmesh train --resume` takes over the
    directory before the roles start; a resume through the Python API (`Controller(config, resume_from=...)`) does here."""
    if resume_from is not None:
        resumed = resume_from.parent.parent
        return resumed, None if run_dirs.held_here(resumed) else take_over(resumed, resume_from)
    run_dir, lock = run_dirs.claim_fresh(run_dir)
    checkpoint.write(run_dir, checkpoint.CONFIG, config_toml)
    return run_dir, lock
