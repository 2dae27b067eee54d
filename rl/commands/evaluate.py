"""`rlmesh eval`: held-out evaluation alone, of a config's model, a run's checkpoint or an exported model folder.

The rows, sampling, rollout path, scoring and metrics are the training loop's validation's (`rl.loop.validation`:
`run.eval_groups` rows, `run.eval_samples_per_row` samples each with `generator.eval_sampling`, pass@k at
`run.eval_pass_threshold`), with the same request ids and so the same sampling seeds: evaluating a run's step-N
checkpoint repeats the validation its step N logged. This module reads the command line; `rl.commands.evaluation`
picks what to evaluate and runs it (only the generator and reward services start: no trainer, no weight store, no run
directory).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rl.commands.arguments import parse_overrides, runtime_problems
from rl.config import ConfigError
from rl.console import fail, say
from tasks.build import build_task


def eval_arguments(extra: list[str]) -> tuple[Path | None, dict[str, str]]:
    """`rlmesh eval`'s target (the first argument when it is not an option) and its overrides."""
    if extra and not extra[0].startswith("--"):
        return Path(extra[0]), parse_overrides(extra[1:])
    return None, parse_overrides(extra)


def eval_command(args: argparse.Namespace, extra: list[str], argv: list[str]) -> int:
    """`rlmesh eval`: the metrics as JSON on stdout (exit 0), 2 when the arguments or the config are refused or the
    scheduler gives no hosts, 1 when an actor failure stopped it."""
    from rl.commands.evaluation import EvaluationStopped, eval_target, evaluate  # imports Monarch and torch
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
        return fail(str(exc), 2)
    except EvaluationStopped as exc:
        return fail(f"evaluation stopped: {exc}", 1)
    except HostsNotAllocated as exc:
        return fail(f"cannot get the evaluation's hosts from {exc}", 2)
    print(json.dumps(result, indent=2))
    return 0
