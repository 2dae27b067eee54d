"""The `rlmesh` command line: its parser, and a table from each verb to its handler.

`rlmesh train --config FILE [--section.key value ...]`, `rlmesh train --resume RUN_DIR [...]`, `rlmesh validate ...`,
`rlmesh bench ...`, `rlmesh eval [RUN_DIR | MODEL_DIR] ...`, `rlmesh new-task NAME`, `rlmesh report RUN_DIR [RUN_DIR ...]`,
`rlmesh export RUN_DIR --out DIR`, `rlmesh worker --address tcp://HOST:PORT`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from rl.commands import export
from rl.commands.arguments import import_from_launch_directory
from rl.commands.evaluate import eval_command
from rl.commands.new_task import new_task_command
from rl.commands.train import bench_command, train_command, validate_command
from rl.processes.bootstrap import exit_without_collecting

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


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rlmesh")
    except PackageNotFoundError:
        return "unknown (not installed)"


class EveryValue(argparse.Action):
    """An option given once or more: its last value in `dest`, every value in `dest_all` (`rlmesh train` with several
    `--config` or `--resume` runs them as LoRA tenants: `rl.commands.tenants`)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_all", [*getattr(namespace, f"{self.dest}_all", []), values])


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


def worker_command(args: argparse.Namespace, extra: list[str], argv: list[str]) -> int:
    """`rlmesh worker --address tcp://HOST:PORT`: serve this host to attached runs until stopped."""
    from rl.processes.attach import run_worker

    run_worker(args.address)
    return 0


def report_command(args: argparse.Namespace, extra: list[str], argv: list[str]) -> int:
    """`rlmesh report RUN_DIR [RUN_DIR ...] [--out DIR]` (`rl.metrics.report`)."""
    from rl.metrics.report import report_command

    return report_command(args.run_dirs, args.out)


Handler = Callable[[argparse.Namespace, list[str], list[str]], int]
"""A verb's glue: (its parsed options, the rest of its command line, the whole command line) → the exit code."""

COMMANDS: dict[str, Handler] = {
    "train": train_command,
    "validate": validate_command,
    "bench": bench_command,
    "eval": eval_command,
    "export": export.export_command,
    "report": report_command,
    "new-task": new_task_command,
    "worker": worker_command,
}
"""Each verb's handler; those not in `TAKE_OVERRIDES` refuse arguments their parser does not know."""

TAKE_OVERRIDES = {"train", "validate", "bench", "eval"}
"""The verbs that read a config: `--section.key value` overrides (and `rlmesh eval`'s target) follow their options."""


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # this process is the command's own: it exits as the actors' processes do
        exit_without_collecting()
    import_from_launch_directory()
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    args, extra = parser.parse_known_args(argv)
    if extra and args.command not in TAKE_OVERRIDES:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return COMMANDS[args.command](args, extra, argv)


if __name__ == "__main__":
    sys.exit(main())
