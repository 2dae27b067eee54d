"""What every `rlmesh` verb reads the same way: config overrides from the command line, the launch directory made
importable, and what this machine lacks for a config, found before anything starts."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from rl.config import Config, ConfigError


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
