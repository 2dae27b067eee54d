"""A run's directory and its logs: opened when the training starts, closed when it ends (also on error or Ctrl-C)."""

from __future__ import annotations

from pathlib import Path

from rl.checkpoint.resume import open_run_dir
from rl.checkpoint.run_dir import RunDirLock
from rl.config import Config, dump_toml
from rl.loop.roles import Roles
from rl.metrics.logger import MetricsLogger
from rl.metrics.sample_log import SampleLogger
from rollouts.types import RolloutGroup
from tasks.build import BuiltTask


def open_run_logs(
    config: Config, tasks: dict[str, BuiltTask], roles: Roles, resume_from: Path | None
) -> tuple[Path, RunDirLock | None, MetricsLogger, SampleLogger]:
    """The run's directory (a resumed run's own, else a fresh one claimed and locked, with the resolved config), the
    lock this call took, and the run's metrics and sample loggers writing into it."""
    run_dir, run_lock = open_run_dir(config.run_dir, dump_toml(config), resume_from)
    if roles.run_log is not None:
        roles.run_log.move_into(run_dir)
    logger = MetricsLogger(
        run_dir,
        log_rollouts=config.run.log_rollouts,
        wandb=config.wandb,
        run_config=config.model_dump(mode="json"),
        console_samples=config.sample_logging.console,
    )
    targets = {name: task.task.target for name, task in tasks.items()}
    return run_dir, run_lock, logger, SampleLogger.for_run(config, targets, roles.reference_logprobs)


async def log_step_rollouts(
    logger: MetricsLogger,
    sample_logger: SampleLogger,
    step: int,
    groups: list[RolloutGroup],
    dropped: list[RolloutGroup],
) -> None:
    """A step's trained groups (with the advantages it trained) and the groups dropped since the last step, to the
    rollout log and the sample log."""
    logger.log_rollouts(step, "train", groups)
    logger.log_rollouts(step, "dropped", dropped)
    await sample_logger.record(groups, step, dropped=dropped)


def close_run_logs(
    logger: MetricsLogger, run_lock: RunDirLock | None, next_step: int, dropped: list[RolloutGroup]
) -> None:
    """Log the groups dropped after the last step (as the next step's), close the logs and release the lock."""
    logger.log_rollouts(next_step, "dropped", dropped)
    logger.close()
    if run_lock is not None:
        run_lock.release()
