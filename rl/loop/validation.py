"""The training loop's validation: held-out rows through the same rollout path as training, scored, with pass@k.

The rows are the first `run.eval_groups` validation rows (tasks in name order), `run.eval_samples_per_row` samples each
with `generator.eval_sampling`, and request ids (so sampling seeds) `eval/step=<step>/<i>`: `rlmesh eval` of a run's
step-N checkpoint (`rl.commands.evaluate`) repeats the validation step N logged.
"""

from __future__ import annotations

import asyncio

from rl.config import Config
from rl.config.roles import SamplingConfig
from rl.config.run import RunConfig
from rl.console import say
from rl.loop.scored_groups import ScoredGroups
from rl.metrics.logger import MetricsLogger
from rl.metrics.pass_at_k import eval_failure_line, eval_metrics
from rollouts.types import RolloutGroup
from tasks.build import BuiltTask


def held_out_rows(tasks: dict[str, BuiltTask], eval_groups: int) -> list[tuple[str, dict]]:
    """(task name, row) of the first `eval_groups` validation rows, tasks in name order: the rows every validation uses."""
    return [(name, row) for name, task in sorted(tasks.items()) for row in task.load_rows("validation")][:eval_groups]


async def held_out_groups(
    scored_groups: ScoredGroups, rows: list[tuple[str, dict]], step: int, run: RunConfig, sampling: SamplingConfig
) -> list[RolloutGroup]:
    """Each held-out row's `run.eval_samples_per_row` scored samples, with ids (and so seeds) `eval/step=<step>/<i>`."""
    return list(
        await asyncio.gather(
            *(
                scored_groups.make(f"eval/step={step}/{index}", name, row, run.eval_samples_per_row, sampling)
                for index, (name, row) in enumerate(rows)
            )
        )
    )


async def validate(
    scored_groups: ScoredGroups, rows: list[tuple[str, dict]], step: int, config: Config, logger: MetricsLogger
) -> dict[str, float]:
    """The training loop's validation at `step`: held-out reward through the same rollout path,
    `run.eval_samples_per_row` samples per row with `generator.eval_sampling`, and pass@k; the groups logged."""
    if not rows:
        return {}
    run = config.run
    groups = await held_out_groups(scored_groups, rows, step, run, config.generator.eval_sampling)
    logger.log_rollouts(step, "eval", groups)
    if line := eval_failure_line(step, groups):
        say(line)
    return eval_metrics(groups, run.eval_samples_per_row, run.eval_pass_threshold)
