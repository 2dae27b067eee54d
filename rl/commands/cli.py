"""`rlmesh train --config FILE [--section.key value ...]`, `rlmesh train --resume RUN_DIR [...]`, `rlmesh validate ...`,
`rlmesh bench ...`, `rlmesh eval [RUN_DIR | MODEL_DIR] ...`, `rlmesh new-task NAME`, `rlmesh report RUN_DIR [RUN_DIR ...]`, `rlmesh export RUN_DIR --out DIR`,
`rlmesh worker --address tcp://HOST:PORT`."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rl.checkpoint import export
from rl.components import import_object
from rl.config import Config, ConfigError, dump_toml, load_config
from rl.config.algorithm import bypass_origin, correction_origin, correction_warnings
from rl.config.loss import loss_warnings
from rl.console import say, warn
from rl.processes.preflight import launcher_address_problem
from tasks.build import build_task

if TYPE_CHECKING:
    from rl.loop.controller import Controller
    from rl.processes.interrupts import InterruptibleRun


OVERRIDES_HELP = """\
Any config key can be set on the command line after the options: --section.key value (or --section.key=value),
TOML values, nested keys with dots, list entries by index. For example:
  rlmesh train --config configs/sum_digits_smollm2_cpu.toml --run.steps 4 --trainer.lr 1e-5
  rlmesh validate --config my.toml --tasks.0.args.num_validation 8 --generator.sampling.temperature 0.7
Every key and its default: docs/configuration.md."""


EVAL_HELP = """\
Evaluate a policy on the held-out rows, as training's validation does (run.eval_groups rows, run.eval_samples_per_row
samples each with generator.eval_sampling, pass@1 and pass@k at run.eval_pass_threshold), and print the metrics.
  rlmesh eval runs/NAME [--step N]          a run's newest (or step-N) checkpoint, with the config it was trained with:
                                            repeats that step's validation (same rows, same sampling seeds)
  rlmesh eval exported/ --config my.toml    a model folder (rlmesh export, or any Hugging Face folder), on my.toml's tasks
  rlmesh eval --config my.toml              the config's own model.path (the untrained model: step 0's validation)
Only the generator and reward services start: no trainer, no run directory."""


def runtime_problems(config: Config) -> list[str]:
    """What the launching machine lacks for `config`, found before anything starts: a CUDA device where the trainer
    or the generators run here (a `[cluster]` host elsewhere cannot be asked from here), a task's data file."""
    problems = []
    here = {
        "trainer.device": (config.trainer.device, config.cluster.hosts.trainer == 0),
        "generator.device": (config.generator.device, config.cluster.hosts.generator == 0),
    }
    if any(device == "cuda" and local for device, local in here.values()):
        import torch

        if not torch.cuda.is_available():
            keys = [key for key, (device, local) in here.items() if device == "cuda" and local]
            problems.append(
                f"{' and '.join(keys)} = 'cuda' but this machine has no CUDA device (torch {torch.__version__}, "
                f"torch.cuda.is_available() is False); use 'cpu' or run it where the GPUs are"
            )
    for index, task in enumerate(config.tasks):
        for split in ("train", "validation"):
            path = getattr(task.data, split) if task.data is not None else None
            if path is not None and not Path(path).is_file():
                problems.append(f"tasks.{index}.data.{split}: data file not found: {path} (from {os.getcwd()})")
    return problems


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rlmesh")
    except PackageNotFoundError:
        return "unknown (not installed)"


def parse_overrides(extra: list[str]) -> dict[str, str]:
    """`--a.b value` and `--a.b=value` pairs → {"a.b": "value"}."""
    overrides: dict[str, str] = {}
    index = 0
    while index < len(extra):
        token = extra[index]
        if not token.startswith("--") or len(token) == 2:
            raise ConfigError(f"expected an override like --section.key value, got {token!r}")
        key, sep, value = token[2:].partition("=")
        if not sep:
            if index + 1 >= len(extra):
                raise ConfigError(f"override --{key} has no value")
            index += 1
            value = extra[index]
        overrides[key] = value
        index += 1
    return overrides


def import_from_launch_directory() -> None:
    """Make the directory rlmesh is launched from importable, as uvicorn and gunicorn do: in this process, and
    (through PYTHONPATH, which local actor processes inherit) in every actor process, so that a user's task
    package beside their config is found everywhere. Hosts of a `[cluster]` get `cluster.env` instead."""
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
    paths = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path]
    if here not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([here, *paths])


class EveryValue(argparse.Action):
    """An option given once or more: its last value in `dest`, every value in `dest_all` (`rlmesh train` with several
    `--config` or `--resume` runs them as LoRA tenants: `rl.commands.tenants`)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_all", [*getattr(namespace, f"{self.dest}_all", []), values])


def tenants_of(args: argparse.Namespace) -> tuple[list[str], list[Path]] | None:
    """The configs and run directories of a `train` of LoRA tenants (several, or the resume of one tenant), else None."""
    from rl.commands.tenants import is_tenant_run

    configs, resumes = getattr(args, "config_all", []), getattr(args, "resume_all", [])
    if len(configs) + len(resumes) > 1 or (resumes and not configs and is_tenant_run(resumes[0])):
        return configs, resumes
    return None


def build_parser() -> argparse.ArgumentParser:
    """The `rlmesh` command line: its commands and options (config overrides are parsed apart)."""
    parser = argparse.ArgumentParser(
        prog="rlmesh",
        description="RL post-training of language models on Monarch actors",
        epilog=OVERRIDES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, help_text, resume_help in (
        (
            "train",
            "run training",
            "continue RUN_DIR from its newest checkpoint (overrides may change only resumable keys)",
        ),
        (
            "validate",
            "print the resolved config and start nothing (warns about settings known not to learn)",
            "check that RUN_DIR can be resumed and print the config it would resume with",
        ),
        (
            "bench",
            "measure generation, training, the sync and async loops and weight sync; write bench.json and bench.md",
            "measure with the config RUN_DIR would resume with (its weights are not loaded)",
        ),
    ):
        command = commands.add_parser(
            name,
            help=help_text,
            description=help_text,
            epilog=OVERRIDES_HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        tenants = dict(action=EveryValue) if name == "train" else {}  # several: LoRA tenants (rl.commands.tenants)
        command.add_argument("--config", help="TOML config file (defaults apply to anything it leaves out)", **tenants)
        command.add_argument("--resume", metavar="RUN_DIR", type=Path, help=resume_help, **tenants)
    new_task = commands.add_parser("new-task", help="write a task package (task, rubric, config, test) to start from")
    new_task.add_argument("name", help="package name, a lower-case Python identifier")
    new_task.add_argument("--dir", default=".", help="folder to create the package in")
    report = commands.add_parser(
        "report",
        help="plots and an HTML page of a run (finished or running), or several runs compared",
        description="One run: plots and a page in RUN_DIR/report/. Several: one line per run on each plot, a summary "
        "per run and the config keys on which they differ, in --out (default: report-compare/ beside the first run).",
    )
    report.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR", help="e.g. runs/sum_digits_smollm2_cpu")
    report.add_argument("--out", type=Path, help="the comparison's folder (several runs only)")
    evaluate = commands.add_parser(
        "eval",
        help="held-out evaluation alone: a config's model, a run's checkpoint or an exported model folder",
        usage="rlmesh eval [RUN_DIR | MODEL_DIR] [--config FILE] [--step N] [--out DIR] [--section.key value ...]",
        description=EVAL_HELP,
        epilog=OVERRIDES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    evaluate.add_argument("--config", help="TOML config: its tasks (and, with no RUN_DIR or MODEL_DIR, its model)")
    evaluate.add_argument("--step", type=int, help="RUN_DIR's checkpoint of this step (default: the newest)")
    evaluate.add_argument("--out", type=Path, help="also write DIR/eval.json, DIR/rollouts.jsonl and DIR/run.log")
    worker = commands.add_parser(
        "worker",
        help="serve this host to runs whose [cluster] attaches to it (scheduler = 'attach'), until stopped",
        description="Start one per host; list its address under cluster.workers of the run's config. Processes of a "
        "run start inside it with its environment: start it where the run's Python, checkout and model cache are.",
    )
    worker.add_argument("--address", required=True, help="where to listen, e.g. tcp://0.0.0.0:26600")
    export.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    import_from_launch_directory()
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "worker":
        from rl.processes.attach import run_worker

        run_worker(args.address)
        return 0
    if args.command == "eval":
        return _eval(args, extra)
    if args.command == "export":
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        return export.export_command(args)
    if args.command == "report":
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        from rl.metrics.report import report_command

        return report_command(args.run_dirs, args.out)
    if args.command == "new-task":
        return _new_task(args.name, args.dir, extra)
    if args.command == "train" and (several := tenants_of(args)) is not None:
        from rl.commands.tenants import train_tenants

        return train_tenants(*several, parse_overrides(extra))
    if args.command == "train" and (run_dir_to_guard := guarded_run_dir(args, extra)) is not None:
        return _train_guarded(sys.argv[1:] if argv is None else argv, run_dir_to_guard)
    if args.command == "train":
        from rl.processes.interrupts import InterruptibleRun

        interruptible = (
            InterruptibleRun()
        )  # before any other thread starts (numpy, Monarch): see rl/processes/interrupts.py
    from rl.checkpoint import run_dir
    from rl.checkpoint.resume import NothingToResume, resume_config, take_over
    from rl.loop.resolve import resolve_config  # imports torch: after SIGINT is blocked

    resume_from = None
    try:
        overrides = parse_overrides(extra)
        if args.resume is not None:
            if args.config is not None:
                raise ConfigError("--resume takes its config from the run directory; drop --config")
            config, resume_from = resume_config(args.resume, overrides)
        else:
            config = load_config(args.config, overrides)
        config = resolve_config(config)
        for task_config in config.tasks:
            build_task(task_config)
        if problems := runtime_problems(config):
            raise ConfigError("this machine cannot run the config:\n" + "\n".join(f"  {p}" for p in problems))
        if config.sample_logging.filters.predicate:
            import_object(config.sample_logging.filters.predicate)  # fails here if it cannot be imported
        address_problem = launcher_address_problem(config)
        if address_problem is not None and args.command == "train":
            raise ConfigError(address_problem)
        from rl.commands.footprint import footprint_lines, run_footprint, slurm_memory_warning

        run_size = run_footprint(config)
        memory_warning = slurm_memory_warning(config, run_size)
        for warning in [problem for problem in (memory_warning, address_problem) if problem]:
            warn(warning)
        if args.command == "validate" and run_size is not None:
            for line in footprint_lines(run_size, config):
                say(f"estimate: {line}")
        from rl.weights.sync import check_shared_memory

        check_shared_memory(config)
    except NothingToResume as exc:
        print(f"rlmesh: {exc}", file=sys.stderr)
        return 0
    except (ConfigError, ValueError) as exc:
        print(f"rlmesh: {exc}", file=sys.stderr)
        return 2
    from rl.precision import precision_warnings

    for warning in precision_warnings(config) + correction_warnings(config) + loss_warnings(config.loss):
        warn(warning)
    if args.command == "validate":
        print(f"# {bypass_origin(config)}")
        if (origin := correction_origin(config)) is not None:
            print(f"# {origin}")
        print(dump_toml(config), end="")
        return 0
    if args.command == "bench":
        from rl.commands.bench import bench, table

        results = asyncio.run(bench(config))
        print(table(results) + f"\nwritten to {results['out_dir']}")
        return 0
    run_lock = None
    if resume_from is not None:
        try:
            run_lock = take_over(
                args.resume, resume_from
            )  # one writer: a second launcher on this run directory is refused
        except run_dir.RunDirBusy as exc:
            print(f"rlmesh: cannot resume: {exc}", file=sys.stderr)
            return 2
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
    from rl.loop.roles import AdapterNotServed, DeadlineMissed
    from rl.processes.cluster import HostsNotAllocated
    from rl.processes.interrupts import EXIT_INTERRUPTED

    try:
        controller = Controller(config, resume_from=resume_from)
    except (OSError, ValueError) as exc:
        print(f"rlmesh: cannot set up the run: {exc}", file=sys.stderr)
        return 2
    say(checkpoint_line(config))
    controller.checkpoints.save_on_interrupt = True
    controller.checkpoints.on_save = lambda budget_s: interruptible.extend(budget_s + interruptible.grace_s)
    try:
        summary = interruptible.run(controller.run())
    except KeyboardInterrupt:
        print(f"rlmesh: interrupted; actors stopped\n{_interrupted_message(controller, resume_from)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except asyncio.CancelledError:
        if not controller.actor_failures:
            raise
        print(_stopped_message(controller), file=sys.stderr)
        return 1
    except (DeadlineMissed, TrainerLost, AdapterNotServed) as exc:
        print(f"rlmesh: run stopped: {_resume_hint_if_any(str(exc), controller)}", file=sys.stderr)
        return 1
    except HostsNotAllocated as exc:
        print(f"rlmesh: cannot get the run's hosts from {exc}", file=sys.stderr)
        return 2
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
    print(
        launcher_killed_message(-ended.status, claimed_by(ended.pid, run_dir) or run_dir), file=sys.stderr, flush=True
    )
    return 1


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
    return f"rlmesh: run stopped: the launcher's process died of {name}, {why}; {then}"


def _interrupted_message(controller: Controller, resume_from: Path | None) -> str:
    """Where an interrupted run stands: the Ctrl-C checkpoint's report, or (stopped during start-up) what is left."""
    if controller.checkpoints.report is not None:
        return controller.checkpoints.report.message()
    if resume_from is not None:
        return f"stopped during start-up; {resume_from} is unchanged: resume with: rlmesh train --resume {resume_from.parent.parent}"
    return "stopped during start-up: nothing was trained and there is nothing to resume"


def _stopped_message(controller: Controller) -> str:
    """Why actor failures stopped the run, ending with the resume hint (or that there is nothing to resume) whatever
    stopped it: a service out of replicas (e.g. its only host lost) names none of its own."""
    from rl.loop.roles import RESUME_HINT

    failures = list(controller.actor_failures)
    if not any(RESUME_HINT in failure for failure in failures):
        failures.append(RESUME_HINT)
    return "rlmesh: run stopped:\n" + "\n".join(_resume_hint_if_any(failure, controller) for failure in failures)


def _resume_hint_if_any(message: str, controller: Controller) -> str:
    """A fault's message with its resume hint only when there is something to resume (a committed checkpoint)."""
    from rl.loop.roles import RESUME_HINT

    if controller.checkpoints.committed_step > 0 or controller.resume_from is not None:
        return message
    return message.replace(RESUME_HINT, "the run stopped before any checkpoint: nothing to resume, start it again")


def eval_arguments(extra: list[str]) -> tuple[Path | None, dict[str, str]]:
    """`rlmesh eval`'s target (the first argument when it is not an option) and its overrides."""
    if extra and not extra[0].startswith("--"):
        return Path(extra[0]), parse_overrides(extra[1:])
    return None, parse_overrides(extra)


def _eval(args: argparse.Namespace, extra: list[str]) -> int:
    """`rlmesh eval`: the metrics as JSON on stdout (exit 0), 2 when the arguments or the config are refused or the
    scheduler gives no hosts, 1 when an actor failure stopped it."""
    from rl.loop.evaluate import EvaluationStopped, eval_target, evaluate
    from rl.processes.cluster import HostsNotAllocated

    try:
        target, overrides = eval_arguments(extra)
        chosen = eval_target(target, args.config, args.step, overrides)
        for task_config in chosen.config.tasks:
            build_task(task_config)
        if problems := runtime_problems(chosen.config):
            raise ConfigError("this machine cannot run the config:\n" + "\n".join(f"  {p}" for p in problems))
        say(f"evaluating {chosen.model} (repeating step {chosen.step}'s validation)")
        result = evaluate(chosen, args.out)
    except (ConfigError, ValueError) as exc:
        print(f"rlmesh: {exc}", file=sys.stderr)
        return 2
    except EvaluationStopped as exc:
        print(f"rlmesh: evaluation stopped: {exc}", file=sys.stderr)
        return 1
    except HostsNotAllocated as exc:
        print(f"rlmesh: cannot get the evaluation's hosts from {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    return 0


def _new_task(name: str, directory: str, extra: list[str]) -> int:
    from tasks.scaffold import write_task_package

    if extra:
        print(f"rlmesh new-task: unexpected arguments {extra}", file=sys.stderr)
        return 2
    try:
        package = write_task_package(name, Path(directory))
    except ValueError as exc:
        print(f"rlmesh: {exc}", file=sys.stderr)
        return 2
    rlmesh = Path(sys.executable).parent / "rlmesh"  # the console script beside this interpreter (a venv's)
    launcher = str(rlmesh) if rlmesh.is_file() else f"{sys.executable} -m rl.commands.cli"
    print(
        f"wrote {package}/ (task.py, config.toml, test_task.py). Its rows are a placeholder that learns as is (sums of "
        f"two numbers), not {name}'s: replace them in {package}/task.py (or name data files in the config).\n"
        f"run its test with: {sys.executable} -m pytest {package}/test_task.py\n"
        f"train it with: {launcher} train --config {package}/config.toml"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
