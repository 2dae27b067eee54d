"""The run-decided defaults (`bypass_mode`) and the launch directory on the import path."""

import os
import subprocess
import sys

import pytest

from rl.commands.cli import main
from rl.config import load_config
from rl.loop import resolve
from rl.loop.resolve import resolve_config
from tests.support.hardware import NATIVE_BF16, NO_NATIVE_BF16, refuses_bf16_compute, refuses_cuda
from tests.support.paths import REPO

LR = ["--trainer.lr", "2e-5"]
"""A learning rate the default SmolLM2-135M learns at (the default one is warned about)."""


@pytest.mark.parametrize(
    "overrides, bypass",
    [
        # CPU fp32 sampler on the trainer's fp32 weights, staleness 0, one minibatch
        (
            {"trainer.dtype": "'float32'"},
            True,
        ),
        ({"generator.dtype": "'bfloat16'"}, False),  # a bf16 sampler is not the trainer's policy
        ({"trainer.dtype": "'bfloat16'"}, False),  # bf16 autocast: π_old is not what the fp32 sampler ran
        ({"run.max_policy_staleness": "1"}, False),
        ({"trainer.ppo_n_minibatches": "2"}, False),
        (
            {
                "model.path": "'tiny-qwen3'",
                "models.big.path": "'tiny-qwen3'",
                "tasks.0.algorithm": "{type = 'sft', sampler = 'big'}",
            },
            False,
        ),
        ({"generator.dtype": "'bfloat16'", "loss.rollout_correction.bypass_mode": "true"}, True),  # explicit wins
        ({"trainer.dtype": "'float32'", "trainer.lora.enabled": "true", "trainer.lora.dropout": "0.1"}, False),
        ({"trainer.dtype": "'float32'", "trainer.lora.enabled": "true"}, True),
        ({"generator.dtype": "'bfloat16'", "loss.rollout_correction.use_policy_gradient": "true"}, True),
    ],
)
def test_bypass_mode_is_decided_from_the_run(overrides, bypass):
    if overrides.get("trainer.dtype") == "'bfloat16'" and not NATIVE_BF16:
        pytest.skip(NO_NATIVE_BF16)
    config = resolve_config(load_config(None, {"tasks": "[{name = 'sum_digits'}]", **overrides}))
    assert config.loss.rollout_correction.bypass_mode is bypass


def test_validate_prints_the_decided_mode_and_why(capsys):
    assert (
        main(
            [
                "validate",
                "--config",
                str(REPO / "configs" / "sum_digits_smollm2_cpu.toml"),
                "--generator.dtype",
                "bfloat16",
            ]
        )
        == 0
    )
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(
        "# loss.rollout_correction.bypass_mode = false, as the run's rule decides: decoupled: the sampler"
    )
    assert "generator.dtype = bfloat16" in first


@pytest.mark.parametrize(
    "overrides, rollout_is, threshold",
    [
        ({"run.max_policy_staleness": "2"}, "token", 2.0),  # decoupled over a sampler gap: token IS by default
        ({"trainer.ppo_n_minibatches": "2"}, "token", 2.0),
        ({"generator.dtype": "'bfloat16'"}, "token", 2.0),
        ({"run.max_policy_staleness": "2", "loss.rollout_correction.rollout_is_threshold": "3.0"}, "token", 3.0),
        ({"trainer.dtype": "'float32'"}, None, 2.0),  # bypass: π_rollout = π_old
        (
            {
                "model.path": "'tiny-qwen3'",
                "models.big.path": "'tiny-qwen3'",
                "tasks.0.algorithm": "{type = 'sft', sampler = 'big'}",
            },
            None,
            2.0,
        ),
        ({"run.max_policy_staleness": "2", "loss.rollout_correction.preset": "'disabled'"}, None, 2.0),  # off
        (
            {"run.max_policy_staleness": "2", "loss.rollout_correction.preset": "'decoupled_seq_is'"},
            "sequence",
            2.0,
        ),
        # choosing decoupled mode is not choosing no correction: the default token IS stays
        ({"run.max_policy_staleness": "2", "loss.rollout_correction.bypass_mode": "false"}, "token", 2.0),
        ({"generator.dtype": "'bfloat16'", "loss.rollout_correction.bypass_mode": "false"}, "token", 2.0),
        # a veto is a chosen rejection: no IS added
        ({"run.max_policy_staleness": "2", "loss.rollout_correction.rollout_token_veto_threshold": "1e-4"}, None, 2.0),
        # LoRA dropout: the trainer's passes see a noised policy, not the sampler's
        ({"trainer.dtype": "'float32'", "trainer.lora.enabled": "true", "trainer.lora.dropout": "0.1"}, "token", 2.0),
        ({"trainer.dtype": "'float32'", "trainer.lora.enabled": "true"}, None, 2.0),
    ],
)
def test_token_is_comes_with_decoupled_mode_over_a_sampler_gap(overrides, rollout_is, threshold):
    config = resolve_config(load_config(None, {"tasks": "[{name = 'sum_digits'}]", **overrides}))
    correction = config.loss.rollout_correction
    assert (correction.rollout_is, correction.rollout_is_threshold) == (rollout_is, threshold)
    assert resolve_config(config) == config  # a resolved config resolves to itself


@pytest.mark.parametrize("native", [True, False], ids=["native_bf16", "no_native_bf16"])
def test_the_bare_default_is_fp32_on_both_sides_and_on_policy_with_or_without_native_bf16(native, monkeypatch):
    """Both "auto" give fp32 to the trainer and the sampler where bf16 is native too: bf16 on both sides learned half
    as fast per step on the main job and was not faster (benchmarks/README.md, "Precision"). One exact policy on both
    sides: bypass mode, no IS."""
    monkeypatch.setattr(resolve, "native_bf16", lambda device: native)
    config = resolve_config(load_config(None, {"tasks": "[{name = 'sum_digits'}]"}))
    assert (config.trainer.dtype, config.generator.dtype) == ("float32", "float32")
    correction = config.loss.rollout_correction
    assert correction.bypass_mode and correction.rollout_is is None


def test_validate_with_a_staleness_budget_shows_token_is_on_and_why(capsys):
    assert main(["validate", "--run.max_policy_staleness", "2", *LR]) == 0
    captured = capsys.readouterr()
    second = captured.out.splitlines()[1]
    assert second.startswith("# loss.rollout_correction.rollout_is = 'token' (threshold 2.0): IS on")
    assert second.endswith("run.max_policy_staleness = 2 (rollouts of older policies)")
    assert 'rollout_is = "token"' in captured.out and "warning" not in captured.err
    assert main(["validate", "--run.max_policy_staleness", "2", "--loss.rollout_correction.preset", "disabled"]) == 0
    captured = capsys.readouterr()
    assert "rollout_is = " not in captured.out
    assert "warning: loss.rollout_correction: decoupled mode without IS or rejection" in captured.err


def test_validate_says_how_to_get_is_back_only_where_a_chosen_correction_turned_it_off(capsys):
    gap = ["validate", "--run.max_policy_staleness", "2", *LR]
    assert main([*gap, "--loss.rollout_correction.bypass_mode", "false"]) == 0
    captured = capsys.readouterr()
    assert "rollout_is = 'token'" in captured.out and "warning" not in captured.err
    assert main([*gap, "--loss.rollout_correction.rollout_token_veto_threshold", "1e-4"]) == 0
    assert "warning" not in capsys.readouterr().err  # the veto rejects: something corrects π_rollout
    assert main([*gap, "--loss.rollout_correction.preset", "disabled"]) == 0
    err = capsys.readouterr().err
    assert "decoupled mode without IS or rejection (preset = 'disabled' turns them off)" in err
    assert "Remove preset = 'disabled' for the default token IS" in err


@pytest.mark.parametrize("name", ["sum_digits_smollm2_gpu", "qwen3_8b_slurm_2x8", "qwen3_8b_kubernetes_2x8"])
def test_bf16_sampler_configs_train_with_decoupled_token_is(name):
    correction = resolve_config(load_config(REPO / "configs" / f"{name}.toml")).loss.rollout_correction
    assert (
        correction.preset == "decoupled_token_is"
        and correction.bypass_mode is False
        and correction.rollout_is == "token"
    )


@pytest.mark.processes
def test_a_task_package_beside_the_config_is_found_from_the_launch_directory(tmp_path):
    (tmp_path / "my_tasks").mkdir()
    (tmp_path / "my_tasks" / "__init__.py").write_text("")
    (tmp_path / "my_tasks" / "capitals.py").write_text(
        "from tasks.sum_digits import SumDigitsTask\n\n\nclass CapitalsTask(SumDigitsTask):\n    pass\n"
    )
    (tmp_path / "capitals.toml").write_text('[[tasks]]\nname = "my_tasks.capitals:CapitalsTask"\n')
    # -P: no implicit current directory on sys.path, as for the installed `rlmesh` script
    code = "import os, sys; from rl.commands.cli import main; code = main(['validate', '--config', 'capitals.toml']); print(os.environ['PYTHONPATH']); sys.exit(code)"
    result = subprocess.run(
        [sys.executable, "-P", "-c", code],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert 'name = "my_tasks.capitals:CapitalsTask"' in result.stdout
    # actor processes inherit it
    assert result.stdout.splitlines()[-1].split(os.pathsep)[:2] == [
        str(tmp_path),
        str(REPO),
    ]


@pytest.mark.processes  # a `rlmesh validate` subprocess
def test_a_task_package_beside_the_config_launched_from_elsewhere_names_the_directories_searched(tmp_path):
    beside = tmp_path / "project"
    (beside / "my_tasks").mkdir(parents=True)
    (beside / "my_tasks" / "__init__.py").write_text("")
    (beside / "capitals.toml").write_text('[[tasks]]\nname = "my_tasks.capitals:CapitalsTask"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = subprocess.run(
        [sys.executable, "-P", "-m", "rl.commands.cli", "validate", "--config", str(beside / "capitals.toml")],
        cwd=elsewhere,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert (
        f"no package or module 'my_tasks' on the import path, which holds the directory rlmesh was started from ({elsewhere})"
        in result.stderr
    )
    assert f"searched: {elsewhere}, {REPO}" in result.stderr
    assert "starts in the directory holding my_tasks/ (cd there) or with that directory on PYTHONPATH" in result.stderr


@pytest.mark.parametrize("config", sorted(path.name for path in (REPO / "configs").glob("*.toml")))
def test_every_shipped_config_validates_from_the_repo_root(config, monkeypatch, capsys):
    if refuses_bf16_compute(REPO / "configs" / config):
        pytest.skip(NO_NATIVE_BF16)
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))  # main() extends it: restored after the test
    if refuses_cuda(REPO / "configs" / config):  # a GPU config on a machine without one: refused before anything starts
        assert main(["validate", "--config", f"configs/{config}"]) == 2
        assert "but this machine has no CUDA device" in capsys.readouterr().err
        return
    assert main(["validate", "--config", f"configs/{config}"]) == 0, capsys.readouterr().err


def test_validate_warns_about_a_precision_pair_known_not_to_learn(capsys):
    pair = ["validate", "--generator.dtype", "bfloat16", "--trainer.dtype", "float32", *LR]
    assert main([*pair, "--loss.rollout_correction.preset", "disabled"]) == 0  # without the default token IS
    assert "rlmesh: warning: generator.dtype = bfloat16 samples below the trainer's float32" in capsys.readouterr().err
    assert main(pair) == 0  # the default token IS corrects it
    assert "warning" not in capsys.readouterr().err


def test_validate_warns_once_about_gspo_with_a_per_token_aggregation(capsys):
    assert main(["validate", "--loss.type", "gspo", "--loss.aggregation", "token-mean", *LR]) == 0
    err = capsys.readouterr().err
    assert err.count("rlmesh: warning: loss.type = 'gspo' with aggregation = 'token-mean'") == 1, err
    assert main(["validate", "--loss.type", "gspo", *LR]) == 0  # its default: one mean per sequence
    assert "warning" not in capsys.readouterr().err
    assert main(["validate", *LR]) == 0  # no dtypes set: float32 for both, nothing to warn about
    assert "warning" not in capsys.readouterr().err


def test_validate_refuses_a_missing_data_file(capsys, tmp_path):
    missing = tmp_path / "nope.jsonl"
    assert main(["validate", "--tasks", f"[{{name = 'sum_digits', data = {{ train = '{missing}' }}}}]"]) == 2
    assert f"tasks.0.data.train: data file not found: {missing}" in capsys.readouterr().err


def test_validate_refuses_cuda_where_no_device_is_present(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["validate", "--trainer.device", "cuda", "--generator.device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "trainer.device and generator.device = 'cuda' but this machine has no CUDA device" in err


def test_validate_says_when_the_default_lr_is_left_for_a_small_model(capsys):
    assert main(["validate"]) == 0  # no [trainer]: the default SmolLM2-135M at the default lr
    assert (
        "warning: trainer.lr is left at its default 1e-06, a rate for models of a billion parameters and more; "
        "smollm2-135m-instruct has 135M and barely moves at it" in capsys.readouterr().err
    )
    assert main(["validate", "--trainer.lr", "1e-6"]) == 0  # chosen: no word
    assert "trainer.lr" not in capsys.readouterr().err
    assert main(["validate", "--config", str(REPO / "configs" / "sum_digits_smollm2_cpu.toml")]) == 0
    assert "trainer.lr" not in capsys.readouterr().err
