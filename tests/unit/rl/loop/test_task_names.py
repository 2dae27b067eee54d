"""A task listed twice under two short names: two entries everywhere the run names its tasks."""

import pytest

from rl.config import ConfigError, load_config
from rl.loop.controller import Controller
from rl.metrics.standard import reward_metrics
from rollouts.types import Rollout, RolloutStatus
from tests.support.paths import TINY

ENV = "env = {max_new_tokens = 8, max_total_tokens = 96, max_prompt_tokens = 64}"
TWICE = (
    f"[{{name = 'sum_digits', alias = 'digits2', args = {{num_digits = 2, num_validation = 2}}, {ENV}}}, "
    f"{{name = 'sum_digits', alias = 'digits3', args = {{num_digits = 3, num_validation = 2}}, weight = 3.0, {ENV}}}]"
)


def test_a_task_class_listed_twice_needs_two_names_and_import_paths_default_to_the_class_name():
    with pytest.raises(
        ConfigError, match=r"tasks\.1: named 'sum_digits' in metric keys like tasks\.0; .*tasks\.1\.alias"
    ):
        load_config(TINY, {"tasks": f"[{{name = 'sum_digits', {ENV}}}, {{name = 'sum_digits', {ENV}}}]"})
    config = load_config(TINY, {"tasks": TWICE})
    assert [task.key for task in config.tasks] == ["digits2", "digits3"]
    assert list(config.task_algorithms()) == ["digits2", "digits3"]
    unnamed = load_config(TINY, {"tasks": f"[{{name = 'tests.support.e2e_tasks:DemonstratedDigits', {ENV}}}]"})
    assert unnamed.tasks[0].key == "DemonstratedDigits"  # not the import path
    with pytest.raises(ConfigError, match="alias"):
        # a '/' would split metric keys
        load_config(TINY, {"tasks": f"[{{name = 'sum_digits', alias = 'a/b', {ENV}}}]"})


def test_each_entry_draws_its_own_rows_and_names_its_metrics():
    controller = Controller(load_config(TINY, {"tasks": TWICE}))
    assert list(controller.tasks) == ["digits2", "digits3"]
    drawn = [controller.stream.next() for _ in range(40)]
    assert {name for name, _ in drawn} == {"digits2", "digits3"}
    for name, row in drawn:  # each entry's rows are its own dataset's
        assert (name == "digits3") == (int(row["number"]) >= 100), (name, row)
    assert [name for name, _ in controller.validation_rows] == ["digits2", "digits2", "digits3", "digits3"]
    rollouts = [
        Rollout(rollout_id=f"r/{name}", group_id="r", task_name=name, sample_index=0, status=RolloutStatus.COMPLETED)
        for name in ("digits2", "digits3")
    ]
    rollouts[0].reward, rollouts[1].reward = 1.0, 0.0
    metrics = reward_metrics(rollouts, prefix="eval/reward")
    assert metrics["eval/reward/digits2/mean"] == 1.0 and metrics["eval/reward/digits3/mean"] == 0.0
