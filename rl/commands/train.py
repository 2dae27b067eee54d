"""`rlmesh train`, and the two verbs that read a run's config the same way before anything starts: `rlmesh validate`
(print it, resolved) and `rlmesh bench` (measure with it).

The config comes from `--config` or from `--resume RUN_DIR` with the command line's overrides; it is checked against
this machine (tasks built, data files, devices, the launcher's address, the Slurm memory, /dev/shm) and resolved before
any actor starts. Modules that import torch or Monarch are imported inside the functions: `rlmesh train` blocks SIGINT
before any thread starts (`rl.processes.interrupts`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rl.commands.arguments import parse_overrides, runtime_problems
from rl.components import import_object
from rl.config import Config, ConfigError, dump_toml, load_config
from rl.config.correction import bypass_origin, correction_origin, correction_warnings
from rl.config.loss import loss_warnings
from rl.console import fail, say, warn
from rl.processes.preflight import launcher_address_problem
from tasks.build import build_task

if TYPE_CHECKING:
    from rl.loop.controller import Controller
    from rl.processes.interrupts import InterruptibleRun


def train_command(args: argparse.Namespace, extra: list[str], argv: list[str]) -> int:
    """`rlmesh train`: the run's exit code (`_train`); a run on attached workers runs its launcher as a guarded child."""
    if (run_dir_to_guard := guarded_run_dir(args, extra)) is not None:
        return _train_guarded(argv, run_dir_to_guard)
    from rl.processes.interrupts import InterruptibleRun

    # before any other thread starts (torch, numpy, Monarch): see rl/processes/interrupts.py
    interruptible = InterruptibleRun()
    if (tenants := tenants_of(args)) is not None:  # the check of a resumed run reads its checkpoint with torch
        from rl.commands.tenants import train_tenants

        return train_tenants(*tenants, parse_overrides(extra), interruptible)
    return _on_config(args, extra, lambda config, resume_from: _train_locked(args, config, resume_from, interruptible))


def tenants_of(args: argparse.Namespace) -> tuple[list[str], list[Path]] | None:
    """The configs and run directories of a `train` of LoRA tenants (several, or the resume of one tenant), else None."""
    from rl.commands.tenants import is_tenant_run

    configs, resumes = getattr(args, "config_all", []), getattr(args, "resume_all", [])
    if len(configs) + len(resumes) > 1 or (resumes and not configs and is_tenant_run(resumes[0])):
        return configs, resumes
    return None


def validate_command(args: argparse.Namespace, extra: list[str], argv: list[str]) -> int:
    """`rlmesh validate`: the resolved config as TOML on stdout, with where its rollout-correction mode comes from."""

    def show(config: Config, resume_from: Path | None) -> int:
        print(f"# {bypass_origin(config)}")
        if (origin := correction_origin(config)) is not None:
            print(f"# {origin}")
        print(dump_toml(config), end="")
        return 0

    return _on_config(args, extra, show)


def bench_command(args: argparse.Namespace, extra: list[str], argv: list[str]) -> int:
    """`rlmesh bench`: the measurements' table, written to the bench's folder (`rl.commands.bench`)."""

    def measure(config: Config, resume_from: Path | None) -> int:
        from rl.commands.bench import bench, table

        results = asyncio.run(bench(config))
        print(table(results) + f"\nwritten to {results['out_dir']}")
        return 0

    return _on_config(args, extra, measure)


def _on_config(args: argparse.Namespace, extra: list[str], then: Callable[[Config, Path | None], int]) -> int:
    """`then(config, resume_from)` on the run's checked config (`checked_config`) after its warnings; a refused config
    exits 2 with why, a finished run that has nothing to resume 0."""
    from rl.checkpoint.resume import NothingToResume

    try:
        config, resume_from = checked_config(args, extra)
    except NothingToResume as exc:
        return fail(str(exc), 0)
    except (ConfigError, ValueError) as exc:
        return fail(str(exc), 2)
    from rl.precision import precision_warnings

    for warning in precision_warnings(config) + correction_warnings(config) + loss_warnings(config.loss):
        warn(warning)
    return then(config, resume_from)


def checked_config(args: argparse.Namespace, extra: list[str]) -> tuple[Config, Path | None]:
    """The run's resolved config and, for `--resume`, the checkpoint it continues from; ConfigError (or ValueError,
    `NothingToResume`) when it cannot run here. `rlmesh validate` also prints the run's memory estimate."""
    from rl.checkpoint.resume import resume_config
    from rl.commands.footprint import default_lr_warning, footprint_lines, run_footprint, slurm_memory_warning
    from rl.loop.resolve import resolve_config  # imports torch: after SIGINT is blocked
    from rl.metrics.pass_at_k import unreachable_threshold_warnings
    from rl.weights.sync import check_shared_memory

    resume_from = None
    overrides = parse_overrides(extra)
    if args.resume is not None:
        if args.config is not None:
            raise ConfigError("--resume takes its config from the run directory; drop --config")
        config, resume_from = resume_config(args.resume, overrides)
    else:
        config = load_config(args.config, overrides)
    config = resolve_config(config)
    rubrics = {task_config.key: build_task(task_config).rubric for task_config in config.tasks}
    if problems := runtime_problems(config):
        raise ConfigError("this machine cannot run the config:\n" + "\n".join(f"  {p}" for p in problems))
    if config.sample_logging.filters.predicate:
        import_object(config.sample_logging.filters.predicate)  # fails here if it cannot be imported
    address_problem = launcher_address_problem(config)
    if address_problem is not None and args.command == "train":
        raise ConfigError(address_problem)
    run_size = run_footprint(config)
    memory_warning = slurm_memory_warning(config, run_size)
    lr_warning = default_lr_warning(config, run_size)
    for warning in [problem for problem in (memory_warning, address_problem, lr_warning) if problem]:
        warn(warning)
    for warning in unreachable_threshold_warnings(rubrics, config.run):
        warn(warning)
    if args.command == "validate" and run_size is not None:
        for line in footprint_lines(run_size, config):
            say(f"estimate: {line}")
    check_shared_memory(config)
    return config, resume_from


def _train_locked(
    args: argparse.Namespace, config: Config, resume_from: Path | None, interruptible: InterruptibleRun
) -> int:
    """`_train`, holding a resumed run directory's lock: one writer, a second launcher on it is refused."""
    from rl.checkpoint.resume import take_over
    from rl.checkpoint.run_dir import RunDirBusy

    run_lock = None
    if resume_from is not None:
        try:
            run_lock = take_over(args.resume, resume_from)
        except RunDirBusy as exc:
            return fail(f"cannot resume: {exc}", 2)
    try:
        return _train(config, resume_from, interruptible)
    finally:
        if run_lock is not None:
            run_lock.release()


def _train(config: Config, resume_from: Path | None, interruptible: InterruptibleRun) -> int:
    """Run the controller; the exit code (0, 1: the run stopped on a fault, 2: set-up refused, 130: interrupted)."""
    from rl.checkpoint.estimate import checkpoint_line
    from rl.loop.controller import Controller
    from rl.loop.recovery import TrainerLost
    from rl.loop.roles import AdapterNotServed, DeadlineMissed, NonFiniteWeights
    from rl.processes.cluster import HostsNotAllocated
    from rl.processes.interrupts import EXIT_INTERRUPTED

    try:
        controller = Controller(config, resume_from=resume_from)
    except (OSError, ValueError) as exc:
        return fail(f"cannot set up the run: {exc}", 2)
    say(checkpoint_line(config))
    controller.checkpoints.save_on_interrupt = True
    controller.checkpoints.on_save = lambda budget_s: interruptible.extend(budget_s + interruptible.grace_s)
    try:
        summary = interruptible.run(controller.run())
    except KeyboardInterrupt:
        return fail(f"interrupted; actors stopped\n{_interrupted_message(controller, resume_from)}", EXIT_INTERRUPTED)
    except asyncio.CancelledError:
        if not controller.actor_failures:
            raise
        return fail(_stopped_message(controller), 1)
    except (DeadlineMissed, TrainerLost, AdapterNotServed, NonFiniteWeights) as exc:
        return fail(f"run stopped: {_resume_hint_if_any(str(exc), controller)}", 1)
    except HostsNotAllocated as exc:
        return fail(f"cannot get the run's hosts from {exc}", 2)
    print(json.dumps(summary, indent=2))
    return 0


def guarded_run_dir(args: argparse.Namespace, extra: list[str]) -> Path | None:
    """The run directory of a `train` whose launcher runs as a guarded child (rl/processes/guard.py): a run on attached
    workers (`cluster.scheduler = "attach"`), where a worker restarted under the run crashes the launcher natively. None
    inside the guard, for other schedulers, and when the config cannot be read (the launcher itself says why)."""
    from rl.processes.guard import inside_guard

    if inside_guard():
        return None
    try:
        overrides = parse_overrides(extra)
        if args.resume is not None:
            return (
                args.resume
                if load_config(args.resume / "config.toml", overrides).cluster.scheduler == "attach"
                else None
            )
        config = load_config(args.config, overrides)
    except (ConfigError, ValueError, OSError):
        return None
    return config.run_dir if config.cluster.scheduler == "attach" else None


def _train_guarded(argv: list[str], run_dir: Path) -> int:
    """`rlmesh train` with the launcher as a child: its exit status, or 1 with what happened when a signal killed it."""
    from rl.checkpoint.run_dir import claimed_by
    from rl.processes.guard import run_guarded

    ended = run_guarded([sys.executable, "-m", "rl.commands.cli", *argv])
    if ended.status >= 0:
        return ended.status
    return fail(launcher_killed_message(-ended.status, claimed_by(ended.pid, run_dir) or run_dir), 1)


def launcher_killed_message(signal_number: int, run_dir: Path) -> str:
    """Why the run ended when its launcher was killed by a signal, with how to go on from `run_dir`'s checkpoints."""
    import signal

    from rl.checkpoint.store import committed_checkpoints

    try:
        name = signal.Signals(signal_number).name
    except ValueError:
        name = f"signal {signal_number}"
    why = (
        "a crash in the launcher's native runtime (Monarch's: a worker restarted at its address under the running run "
        "does this, docs/gpus-and-clusters.md, Faults across hosts); restart every worker before going on"
        if signal_number == signal.SIGSEGV
        else "killed by another process or by the kernel (out of memory: SIGKILL)"
    )
    if committed_checkpoints(run_dir):
        then = f"resume from the last checkpoint with `rlmesh train --resume {run_dir}`"
    else:
        then = "no checkpoint was committed: nothing to resume, start it again"
    return f"run stopped: the launcher's process died of {name}, {why}; {then}"


def _interrupted_message(controller: Controller, resume_from: Path | None) -> str:
    """Where an interrupted run stands: the Ctrl-C checkpoint's report, or (stopped during start-up) what is left."""
    if controller.checkpoints.report is not None:
        return controller.checkpoints.report.message()
    if (recovery := controller.recovery.interrupted_message()) is not None:  # a recovery starts from a checkpoint
        return recovery
    if resume_from is not None:
        return f"stopped during start-up; {resume_from} is unchanged: resume with: .venv/bin/rlmesh train --resume {resume_from.parent.parent}"
    return "stopped during start-up: nothing was trained and there is nothing to resume"


def _stopped_message(controller: Controller) -> str:
    """Why actor failures stopped the run, ending with the resume hint (or that there is nothing to resume) whatever
    stopped it: a service out of replicas (e.g. its only host lost) names none of its own."""
    from rl.loop.roles import RESUME_HINT

    failures = list(controller.actor_failures)
    if not any(RESUME_HINT in failure for failure in failures):
        failures.append(RESUME_HINT)
    return "run stopped:\n" + "\n".join(_resume_hint_if_any(failure, controller) for failure in failures)


def _resume_hint_if_any(message: str, controller: Controller) -> str:
    """A fault's message with its resume hint only when there is something to resume (a committed checkpoint)."""
    from rl.loop.roles import RESUME_HINT

    if controller.checkpoints.committed_step > 0 or controller.resume_from is not None:
        return message
    return message.replace(RESUME_HINT, "the run stopped before any checkpoint: nothing to resume, start it again")
