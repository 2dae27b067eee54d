"""`rlmesh eval`'s work: what to evaluate (a run's checkpoint, a model folder or a config's model), the generator and
reward services started alone, the held-out rows scored through the training loop's validation path
(`rl.loop.validation`), the metrics and every sample written out."""

from __future__ import annotations

import asyncio
import json
import tempfile
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl.checkpoint import export
from rl.checkpoint import store as checkpoint_store
from rl.config import Config, ConfigError, load_config
from rl.console import say
from rl.loop.resolve import resolve_config
from rl.loop.roles import Roles
from rl.loop.scored_groups import ScoredGroups, built_tasks
from rl.loop.validation import held_out_groups, held_out_rows
from rl.metrics.pass_at_k import eval_failure_line, eval_metrics
from rollouts.types import RolloutGroup


@dataclass(frozen=True)
class EvalTarget:
    """What `rlmesh eval` evaluates: a config (its `model.path` is the policy unless `checkpoint` is set), and the step
    whose validation it repeats (a checkpoint's step, else 0: the untrained model)."""

    config: Config
    checkpoint: Path | None
    step: int
    model: str
    """The policy, in words: the checkpoint's directory or the model path."""
    run_dir: Path | None = None
    """The run directory of `checkpoint`."""


def eval_target(
    target: Path | None, config_file: str | None, step: int | None, overrides: dict[str, str]
) -> EvalTarget:
    """The target of `rlmesh eval [TARGET] [--config FILE] [--step N] [--section.key value ...]`; ConfigError if the
    arguments do not fit together. TARGET: a run directory (its newest or step-N committed checkpoint, with the
    config it was written with), an exported model folder (the config's tasks, `--config` or the defaults), or none
    (the config's own `model.path`)."""
    if target is not None and not target.is_dir():
        raise ConfigError(f"{target}: no such directory (a run directory or a model folder)")
    if target is not None and "model.path" in overrides:
        raise ConfigError(f"{target} is the model to evaluate; drop --model.path")
    if target is not None and (target / "config.toml").is_file():
        if config_file is not None:
            raise ConfigError(f"{target} is a run directory: its checkpoint's config is used; drop --config")
        try:
            checkpoint = export.run_checkpoint(target, step)
        except (FileNotFoundError, ValueError) as exc:
            raise ConfigError(f"cannot evaluate {target}: {exc}") from None
        config = load_config(checkpoint / "config.toml", overrides)
        step = checkpoint_store.read(checkpoint, checkpoint_store.RUN_STATE)["step"]
        return EvalTarget(config, checkpoint, step, str(checkpoint), run_dir=target)
    if step is not None:
        raise ConfigError("--step picks a checkpoint of a run directory; give the run directory")
    if target is not None:
        if not (target / "config.json").is_file():
            raise ConfigError(
                f"{target} is neither a run directory (no config.toml) nor a model folder (no config.json)"
            )
        overrides = {**overrides, "model.path": str(target)}
    config = load_config(config_file, overrides)
    return EvalTarget(config, None, 0, config.model.path)


class EvaluationStopped(RuntimeError):
    """An actor failure (or the rollout breaker) stopped the evaluation; the message says why."""


class Evaluation:
    """One held-out evaluation of `config`'s `model.path` on the generator and reward services."""

    def __init__(self, config: Config, step: int):
        self.config = config = resolve_config(config)  # what needs the runtime, checked and decided
        self.step = step
        self.tasks, self.renderers, self.stop_token_ids = built_tasks(config)
        self.rows = held_out_rows(self.tasks, config.run.eval_groups)
        self.failures: list[str] = []
        """Why the evaluation stopped, if an actor failure stopped it."""
        self._task: asyncio.Task | None = None
        self.roles = Roles(config, stop_run=self._stop, policy_version=lambda: 0, with_trainer=False)
        self.scored_groups = ScoredGroups(self.tasks, self.renderers, self.roles, config.run.seed)

    def _stop(self, message: str) -> None:
        self.failures.append(message)
        if self._task is not None:
            self._task.get_loop().call_soon_threadsafe(self._task.cancel)

    async def run(self, log_dir: Path | None = None) -> tuple[dict[str, float], list[RolloutGroup]]:
        """Start the services, evaluate, stop them; the metrics and the scored groups. `log_dir`: where the actors'
        log goes (`run.log`), else it is dropped."""
        if not self.rows:
            raise ConfigError(
                "the config's tasks have no validation rows (or run.eval_groups = 0): nothing to evaluate"
            )
        self._task = asyncio.current_task()
        run, sampling = self.config.run, self.config.generator.eval_sampling
        try:
            await self.roles.start(self.stop_token_ids, planned_steps=0)
            if log_dir is not None:
                self.roles.run_log.move_into(log_dir)
            say(f"evaluating {len(self.rows)} rows x {run.eval_samples_per_row} sample(s)")
            groups = await held_out_groups(self.scored_groups, self.rows, self.step, run, sampling)
            if line := eval_failure_line(self.step, groups):
                say(line)
            say("stopping the services")
        except asyncio.CancelledError:
            if not self.failures:
                raise
            raise EvaluationStopped("\n".join(self.failures)) from None
        finally:
            await self.roles.stop()
        return eval_metrics(groups, run.eval_samples_per_row, run.eval_pass_threshold), groups


def evaluate(target: EvalTarget, out: Path | None = None) -> dict[str, Any]:
    """Evaluate `target` (a checkpoint first exported into its run directory, removed afterwards); with `out`, write
    `out/eval.json` (what is returned), `out/rollouts.jsonl` (every sample, the run's record format) and `out/run.log`."""
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    config = target.config
    # in the run directory, which a run on a cluster has on storage every host reads
    scratch = (
        tempfile.TemporaryDirectory(prefix=".eval-model-", dir=target.run_dir) if target.run_dir else nullcontext()
    )
    with scratch as tmp:
        if target.checkpoint is not None:
            say(f"exporting {target.checkpoint} for the generators")
            exported = export.export_checkpoint(target.checkpoint, Path(tmp) / "model")
            config = config.model_copy(update={"model": config.model.model_copy(update={"path": str(exported.out)})})
        metrics, groups = asyncio.run(Evaluation(config, target.step).run(out))
    result = {
        "model": target.model,
        "step": target.step,
        "rows": len(groups),
        "samples_per_row": config.run.eval_samples_per_row,
        **metrics,
    }
    if out is not None:
        (out / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
        with open(out / "rollouts.jsonl", "w") as rollouts:
            for group in groups:
                for rollout in group.rollouts:
                    record = {"step": target.step, "kind": "eval", "example": group.example}
                    rollouts.write(json.dumps(record | {"rollout": rollout.model_dump(mode="json")}) + "\n")
    return result
