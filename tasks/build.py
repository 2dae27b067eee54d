"""Building the configured tasks, their rubrics and renderers."""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any

from rl.components import REWARD_FNS, TASKS, import_object, resolve
from rl.config.tasks import RubricConfig, TaskConfig
from rollouts.fanout import RolloutFn
from rubrics.rubric import RewardFn, Rubric
from tasks.datasets import check_rows, load_file_rows
from tasks.task import Split, Task


def _reward_fn(entry: RubricConfig.RewardFnEntry, *, group: bool) -> RewardFn:
    fn = resolve(entry.fn, REWARD_FNS, "reward function")
    if entry.args:
        try:
            inspect.signature(fn).bind_partial(None, None, **entry.args)
        except TypeError as exc:
            raise ValueError(f"reward function {entry.fn!r}: bad args {entry.args}: {exc}") from exc
        fn = functools.partial(fn, **entry.args)
    return RewardFn(fn, weight=entry.weight, name=entry.name, group=group)


def build_rubric(rubric_config: RubricConfig) -> Rubric:
    reward_fns = [_reward_fn(entry, group=False) for entry in rubric_config.reward_fns]
    reward_fns += [_reward_fn(entry, group=True) for entry in rubric_config.group_reward_fns]
    return Rubric(
        reward_fns,
        truncation_reward=rubric_config.truncation_reward,
        error_reward=rubric_config.error_reward,
        timeout_s=rubric_config.timeout_s,
        max_abs_reward=rubric_config.max_abs_reward,
    )


@dataclass
class BuiltTask:
    """A configured task with its rubric (the config's, else the task's default)."""

    name: str
    """The entry's name in metric keys and rollouts (`TaskConfig.key`)."""
    config: TaskConfig
    task: Task
    rubric: Rubric
    rollout_fn: RolloutFn
    """One trajectory per call: the config's `rollout_fn`, else the task's (`Task.rollout_fn`: its environment)."""

    def load_rows(self, split: Split) -> list[dict[str, Any]]:
        """A split's rows: from the file the config names for it, else from the task; a row lacking one of the
        task's `row_fields` fails here, naming the task, the row and the field."""
        data = self.config.data
        path = getattr(data, split) if data is not None else None
        if path is None:
            rows, source = self.task.load_dataset(split), "load_dataset"
        else:
            rows, source = load_file_rows(path, data.columns, required=self.task.row_fields), path
        check_rows(rows, self.task.row_fields, f"task {self.name!r}, {split} split ({source})")
        return rows


def build_task(task_config: TaskConfig) -> BuiltTask:
    task_class: Any = resolve(task_config.name, TASKS, "task")
    if not (isinstance(task_class, type) and issubclass(task_class, Task)):
        raise ValueError(f"task {task_config.name!r} resolves to {task_class!r}, which is not a Task subclass")
    try:
        task = task_class(**task_config.args)
    except TypeError as exc:
        raise ValueError(f"task {task_config.name!r}: bad args {task_config.args}: {exc}") from exc
    rubric = build_rubric(task_config.rubric) if task_config.rubric is not None else task.build_rubric()
    task.rubric = rubric
    rollout_fn = import_object(task_config.rollout_fn) if task_config.rollout_fn is not None else task.rollout_fn()
    return BuiltTask(name=task_config.key, config=task_config, task=task, rubric=rubric, rollout_fn=rollout_fn)
