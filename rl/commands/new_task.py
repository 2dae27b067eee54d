"""`rlmesh new-task NAME`: write a task package (task, rubric, config, test) to start from (`tasks.scaffold`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rl.console import fail


def new_task_command(args: argparse.Namespace, extra: list[str], argv: list[str]) -> int:
    """`rlmesh new-task NAME [--dir DIR]`: a task package to start from, and the commands to test and train it."""
    from tasks.scaffold import write_task_package

    name = args.name
    try:
        package = write_task_package(name, Path(args.dir))
    except ValueError as exc:
        return fail(str(exc), 2)
    rlmesh = Path(sys.executable).parent / "rlmesh"  # the console script beside this interpreter (a venv's)
    launcher = str(rlmesh) if rlmesh.is_file() else f"{sys.executable} -m rl.commands.cli"
    print(
        f"wrote {package}/ (task.py, config.toml, test_task.py). Its rows are a placeholder that learns as is (sums of "
        f"two numbers), not {name}'s: replace them in {package}/task.py (or name data files in the config).\n"
        f"run its test with: {sys.executable} -m pytest {package}/test_task.py\n"
        f"train it with: {launcher} train --config {package}/config.toml"
    )
    return 0
