"""`rlmesh eval`'s arguments: what each target evaluates, with which config and which step; what is refused."""

from pathlib import Path

import pytest

from rl.checkpoint import store
from rl.commands.cli import main
from rl.commands.evaluate import eval_arguments
from rl.commands.evaluation import Evaluation, eval_target
from rl.config import ConfigError
from tests.support.paths import E2E_CONFIGS, TINY
from tests.support.refused_job import RefusedJob
from tests.support.runs import fake_run


def test_a_run_directory_gives_its_newest_or_chosen_checkpoint_with_the_config_it_was_written_with(tmp_path):
    run_dir = fake_run(tmp_path, [2, 4])
    newest = eval_target(run_dir, None, None, {"run.eval_groups": "3"})
    assert newest.checkpoint == store.checkpoint_root(run_dir) / "step_00000004" and newest.step == 4
    assert newest.run_dir == run_dir and newest.model == str(newest.checkpoint)
    assert newest.config.model.path == "tiny-qwen3" and newest.config.run.eval_groups == 3  # overrides apply
    chosen = eval_target(run_dir, None, 2, {})
    assert chosen.checkpoint.name == "step_00000002" and chosen.step == 2
    with pytest.raises(ConfigError, match=r"no committed checkpoint of step 3 \(committed: \[2, 4\]\)"):
        eval_target(run_dir, None, 3, {})
    with pytest.raises(ConfigError, match="is a run directory: its checkpoint's config is used; drop --config"):
        eval_target(run_dir, str(TINY), None, {})
    with pytest.raises(ConfigError, match="is the model to evaluate; drop --model.path"):
        eval_target(run_dir, None, None, {"model.path": "other"})


def test_a_run_directory_without_a_committed_checkpoint_is_refused(tmp_path):
    run_dir = fake_run(tmp_path, [2], committed=False)
    with pytest.raises(ConfigError, match="cannot evaluate .*no committed checkpoint"):
        eval_target(run_dir, None, None, {})


def test_a_model_folder_is_evaluated_on_the_configs_tasks(tmp_path):
    model = tmp_path / "exported"
    model.mkdir()
    (model / "config.json").write_text("{}")
    target = eval_target(model, str(TINY), None, {"run.eval_samples_per_row": "1"})
    assert target.config.model.path == str(model) and target.checkpoint is None and target.step == 0
    assert target.config.tasks[0].name == "sum_digits" and target.model == str(model)
    with pytest.raises(ConfigError, match="--step picks a checkpoint of a run directory"):
        eval_target(model, str(TINY), 2, {})


def test_a_config_alone_evaluates_its_own_model_at_step_0(tmp_path):
    target = eval_target(None, str(TINY), None, {"model.path": "smollm2-135m-instruct"})
    assert target.config.model.path == "smollm2-135m-instruct" and target.step == 0 and target.checkpoint is None


def test_a_folder_that_is_neither_and_a_missing_path_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="neither a run directory .* nor a model folder"):
        eval_target(tmp_path, str(TINY), None, {})
    with pytest.raises(ConfigError, match="no such directory"):
        eval_target(tmp_path / "missing", str(TINY), None, {})


def test_the_target_comes_first_and_overrides_follow():
    assert eval_arguments(["runs/a", "--run.eval_groups", "4"]) == (Path("runs/a"), {"run.eval_groups": "4"})
    assert eval_arguments(["--run.eval_groups=4"]) == (None, {"run.eval_groups": "4"})
    with pytest.raises(ConfigError, match="expected an override like --section.key value, got 'runs/a'"):
        eval_arguments(["--run.eval_groups", "4", "runs/a"])


def test_the_cli_refuses_before_starting_anything(tmp_path, capsys):
    assert main(["eval", str(tmp_path / "missing")]) == 2
    assert "no such directory" in capsys.readouterr().err
    run_dir = fake_run(tmp_path, [2])
    assert main(["eval", str(run_dir), "--config", str(TINY)]) == 2
    assert "drop --config" in capsys.readouterr().err
    assert main(["eval", "--config", str(TINY), "--tasks.0.name", "sum_digit"]) == 2
    assert "did you mean 'sum_digits'" in capsys.readouterr().err


def test_the_evaluation_uses_the_validations_rows(tmp_path):
    """The first run.eval_groups validation rows, tasks in name order: those the training loop validates on."""
    config = eval_target(None, str(TINY), None, {"run.eval_groups": "3"}).config
    evaluation = Evaluation(config, step=0)
    rows = evaluation.tasks["sum_digits"].load_rows("validation")
    assert evaluation.rows == [("sum_digits", row) for row in rows[:3]] and len(rows) == 4


def test_a_scheduler_that_gives_no_hosts_stops_the_evaluation_with_its_reason(monkeypatch, capsys):
    monkeypatch.setattr("rl.processes.cluster.make_job", lambda cluster: RefusedJob())
    config = E2E_CONFIGS / "tiny_qwen3_process_2hosts.toml"
    assert main(["eval", "--config", str(config), "--wandb.enabled", "false"]) == 2
    assert (
        "rlmesh: cannot get the evaluation's hosts from process: Failed to submit SLURM job: sbatch: error: Memory"
        in capsys.readouterr().err
    )
