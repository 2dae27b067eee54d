import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from rl.commands.arguments import parse_overrides
from rl.commands.cli import main
from rl.config import ConfigError, load_config
from rl.loop.resolve import resolve_config
from tests.support.hardware import NATIVE_BF16, refuses_bf16_compute, refuses_cuda
from tests.support.paths import CONFIGS, E2E_CONFIGS


def resolved(path=None, overrides=None):
    """A config as every entry point runs it: loaded, then resolved (`rl.loop.resolve`)."""
    return resolve_config(load_config(path, overrides))


def write(tmp_path, text: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def test_defaults_are_valid():
    config = load_config()
    assert config.algorithm.type == "grpo" and config.run.max_policy_staleness == 0


def test_unknown_key_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"trainer\.lrr: Extra inputs are not permitted"):
        load_config(write(tmp_path, "[trainer]\nlrr = 0.1\n"))


def test_ill_typed_key_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"run\.steps"):
        load_config(write(tmp_path, '[run]\nsteps = "many"\n'))


def test_unknown_key_in_task_entry_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"tasks\.0\.env\.max_new_tokenz"):
        load_config(write(tmp_path, '[[tasks]]\nname = "sum_digits"\n[tasks.env]\nmax_new_tokenz = 3\n'))


def test_cli_overrides_are_typed_and_dotted(tmp_path):
    config = load_config(
        write(tmp_path, "[trainer]\nlr = 0.1\n[[tasks]]\nname = 'sum_digits'\n"),
        parse_overrides(
            ["--trainer.lr", "2e-5", "--run.steps=7", "--tasks.0.args.num_digits", "3", "--wandb.enabled", "false"]
        ),
    )
    assert config.trainer.lr == 2e-5 and config.run.steps == 7
    assert config.tasks[0].args == {"num_digits": 3} and config.wandb.enabled is False


def test_override_of_missing_list_entry_fails(tmp_path):
    with pytest.raises(ConfigError, match="tasks.3"):
        load_config(write(tmp_path, "[[tasks]]\nname = 'sum_digits'\n"), {"tasks.3.weight": "2"})


def test_cross_field_check(tmp_path):
    with pytest.raises(ConfigError, match="seq_len"):
        load_config(
            None,
            {
                "trainer.seq_len": "64",
                "tasks": "[{name='sum_digits', env={max_total_tokens=128, max_prompt_tokens=64}}]",
            },
        )


def test_validate_command_prints_resolved_config(capsys):
    assert main(["validate", "--config", str(CONFIGS / "sum_digits_smollm2_cpu.toml"), "--run.steps", "3"]) == 0
    out = capsys.readouterr().out
    config = resolved(CONFIGS / "sum_digits_smollm2_cpu.toml", {"run.steps": "3"})
    assert tomllib.loads(out) == config.model_dump(mode="json", exclude_none=True)
    assert tomllib.loads(out)["run"]["steps"] == 3


def test_validate_rejects_unknown_task_before_starting(capsys):
    assert (
        main(["validate", "--config", str(CONFIGS / "sum_digits_smollm2_cpu.toml"), "--tasks.0.name", "no_such_task"])
        == 2
    )
    assert "unknown task 'no_such_task'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "config_file", sorted([*CONFIGS.glob("*.toml"), *E2E_CONFIGS.glob("*.toml")]), ids=lambda p: p.name
)
def test_shipped_configs_validate(config_file, capsys, monkeypatch):
    """Each shipped config validates; one that asks for bf16 compute on a CPU without native bf16, or for a CUDA
    device on a machine without one, is refused, saying why. (`rlmesh validate` in this process: a subprocess per
    config spent ~10 s importing torch, transformers and tensordict again.)"""
    monkeypatch.setattr(sys, "path", list(sys.path))  # `main` adds the launch directory to both
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    returncode = main(["validate", "--config", str(config_file)])
    stderr = capsys.readouterr().err
    if refuses_cuda(config_file):
        assert returncode == 2 and "but this machine has no CUDA device" in stderr, stderr
    elif refuses_bf16_compute(config_file):
        assert returncode == 2 and "without native bf16 matmuls" in stderr, stderr
    else:
        assert returncode == 0, stderr


@pytest.mark.processes
def test_train_with_a_missing_model_fails_before_any_actor_starts(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rl.commands.cli",
            "train",
            "--config",
            str(E2E_CONFIGS / "tiny_qwen3_e2e.toml"),
            "--model.path",
            str(tmp_path / "no_model"),
            "--run.output_dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    err = result.stderr
    assert (
        "model.path:" in err
        and "is neither a built-in model (random-qwen3-1.5gb, smollm2-135m-instruct, tiny-qwen3)" in err
    )
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"algorithm.group_size": "1"}, "algorithm.group_size = 1"),
        (
            {"tasks.0.env.max_prompt_tokens": "128", "tasks.0.env.max_total_tokens": "128"},
            "tasks.0.env: max_prompt_tokens (128)",
        ),
        ({"model.path": "/no/such/model"}, "model.path: '/no/such/model' is neither a built-in model"),
        ({"model.path": "not a hub id"}, "model.path: 'not a hub id'"),
        ({"trainer.param_dtype": "bfloat16"}, "trainer.param_dtype = 'bfloat16'"),
        ({"trainer.dtype": "float16"}, "trainer.dtype = 'float16'"),
        ({"run.eval_samples_per_row": "4"}, "run.eval_samples_per_row = 4 samples greedily"),
        ({"trainer.lora.enabled": "true", "trainer.num_procs": "2"}, "trainer.lora.enabled with 2 trainer ranks"),
        (
            {"trainer.lora.enabled": "true", "generator.tensor_parallel_size": "2"},
            "attesting an adapter split across tensor-parallel workers is not supported yet",
        ),
        ({"trainer.lora.rank": "1024"}, "trainer.lora.rank"),
        ({"trainer.lora.target_modules": "['q_proj', 'q_proj']"}, "trainer.lora.target_modules: distinct layer names"),
        ({"generator.sampling.top_k": "-7"}, "generator.sampling.top_k"),  # vLLM refuses it only when sampling
    ],
    ids=[
        "group-size-1",
        "prompt-fills-context",
        "missing-model-dir",
        "bad-hub-id",
        "bf16-params",
        "fp16-compute",
        "greedy-k-samples",
        "lora-fsdp",
        "lora-tensor-parallel-attested",
        "lora-rank-above-vllms",
        "lora-repeated-layer",
        "top-k-below-off",
    ],
)
def test_contradictory_settings_are_rejected_naming_the_key(overrides, named):
    with pytest.raises(ConfigError) as error:
        resolved(E2E_CONFIGS / "tiny_qwen3_e2e.toml", overrides)
    assert named in str(error.value)


def test_precision_defaults_keep_fp32_master_weights_and_an_exact_sampler():
    config = resolved(CONFIGS / "sum_digits_smollm2_cpu.toml")
    assert (config.trainer.param_dtype, config.trainer.dtype, config.generator.dtype) == (
        "float32",
        "float32",
        "float32",
    )
    if NATIVE_BF16:  # elsewhere bf16 compute on CPU is refused (test_shipped_configs_validate)
        bf16_compute = resolved(CONFIGS / "sum_digits_smollm2_cpu.toml", {"trainer.dtype": "bfloat16"})
        assert (bf16_compute.trainer.param_dtype, bf16_compute.generator.dtype) == ("float32", "bfloat16")
        insisted = resolved(
            None, {"trainer.param_dtype": "bfloat16", "trainer.dtype": "bfloat16", "trainer.pure_low_precision": "true"}
        )
        assert insisted.generator.dtype == "bfloat16"
    gpu = resolved(CONFIGS / "sum_digits_smollm2_gpu.toml")
    assert (gpu.trainer.param_dtype, gpu.trainer.dtype, gpu.generator.dtype) == ("float32", "bfloat16", "bfloat16")


@pytest.mark.processes
def test_fp64_sampling_noise_reaches_the_engine_the_generator_builds():
    from vllm.engine.arg_utils import EngineArgs

    from actors.generator import engine_args
    from rl.assets import resolve_model_path

    for fp64 in (False, True):
        generator_config = load_config(
            CONFIGS / "sum_digits_smollm2_cpu.toml", {"generator.fp64_sampling_noise": str(fp64).lower()}
        ).generator
        model_config = EngineArgs(
            model=resolve_model_path("tiny-qwen3"), **engine_args(generator_config)
        ).create_model_config()
        assert model_config.use_fp64_gumbel is fp64


@pytest.mark.processes
def test_a_lora_policys_engine_serves_its_rank():
    from vllm.engine.arg_utils import EngineArgs

    from actors.generator import engine_args, lora_engine_args
    from rl.assets import resolve_model_path

    generator_config = load_config(CONFIGS / "sum_digits_smollm2_cpu.toml").generator
    for rank, served in ((1, 1), (12, 16), (16, 16), (300, 320), (512, 512)):
        lora = load_config(None, {"trainer.lora.enabled": "true", "trainer.lora.rank": str(rank)}).trainer.lora
        args = EngineArgs(
            model=resolve_model_path("tiny-qwen3"), **engine_args(generator_config), **lora_engine_args(lora)
        )
        assert args.enable_lora and args.max_lora_rank == served
    assert lora_engine_args(None) == {}


def test_lora_settings_without_enabled_are_refused_by_name_not_ignored(tmp_path, capsys):
    # LoRA is off by default: rank = 8 alone would train every parameter while looking like an adapter run
    with pytest.raises(ConfigError, match=r"trainer.lora: sets rank but not enabled: .*Add enabled = true"):
        load_config(write(tmp_path, "[trainer.lora]\nrank = 8\n"))
    with pytest.raises(ConfigError, match=r"trainer.lora: sets alpha, dropout but not enabled"):
        load_config(None, {"trainer.lora.alpha": "4.0", "trainer.lora.dropout": "0.1"})
    assert main(["validate", "--config", str(write(tmp_path, "[trainer.lora]\nrank = 8\n"))]) == 2
    assert "sets rank but not enabled" in capsys.readouterr().err
    chosen = {"trainer.lora.rank": "8"}
    assert load_config(None, {**chosen, "trainer.lora.enabled": "true"}).trainer.lora.rank == 8
    assert not load_config(None, {**chosen, "trainer.lora.enabled": "false"}).trainer.lora.enabled  # an explicit off
    assert not load_config(None).trainer.lora.enabled  # no section: full fine-tuning, nothing to refuse


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An empty Hugging Face cache and a hub endpoint nobody listens on (connections refused at once)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return tmp_path / "hub"


def test_cached_hub_ids_and_existing_directories_are_accepted(tmp_path, hub):
    snapshot = hub / "models--Qwen--Qwen3-0.6B" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (hub / "models--Qwen--Qwen3-0.6B" / "refs").mkdir()
    (hub / "models--Qwen--Qwen3-0.6B" / "refs" / "main").write_text("abc123")
    assert resolved(None, {"model.path": "Qwen/Qwen3-0.6B"}).model.path == "Qwen/Qwen3-0.6B"
    assert resolved(None, {"model.path": str(tmp_path)}).model.path == str(tmp_path)


def test_a_hub_id_neither_cached_nor_reachable_is_refused_at_once(hub, monkeypatch):
    """Instead of the trainer's download retrying for about a minute: the launcher says what to do."""
    from huggingface_hub import constants

    with pytest.raises(ConfigError, match=r"model.path: 'Qwen/Qwen3-0.6B' is not in the Hugging Face cache and "
                       r"http://127.0.0.1:9 cannot be reached .*set model.path to a local folder"):  # fmt: skip
        resolved(None, {"model.path": "Qwen/Qwen3-0.6B"})
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ConfigError, match="HF_HUB_OFFLINE is set: download it where the hub is reachable"):
        resolved(None, {"model.path": "Qwen/Qwen3-0.6B"})
    slurm = resolved(CONFIGS / "qwen3_8b_slurm_2x8.toml")  # its hosts load the model from their own cache
    assert slurm.model.path == "Qwen/Qwen3-8B"


def test_every_entry_point_runs_the_checks_that_need_the_runtime(capsys):
    """`rlmesh validate`/`train` and the Python API (`Controller`) all resolve the config before anything starts."""
    from rl.loop.controller import Controller

    config = load_config(E2E_CONFIGS / "tiny_qwen3_e2e.toml", {"algorithm.group_size": "1"})  # loads: needs no classes
    with pytest.raises(ConfigError, match="algorithm.type = 'grpo' is group-relative but algorithm.group_size = 1"):
        Controller(config)
    argv = ["validate", "--config", str(E2E_CONFIGS / "tiny_qwen3_e2e.toml"), "--algorithm.group_size", "1"]
    assert main(argv) == 2  # `train` takes the same path (a missing model: test_train_with_a_missing_model_...)
    assert "is group-relative but algorithm.group_size = 1" in capsys.readouterr().err


def test_attached_workers_are_one_address_per_host_of_each_role():
    attach = {
        "cluster.scheduler": "attach",
        "cluster.hosts": "{ generator = 1 }",
        "weight_sync.transport": "torchstore",
        "cluster.workers": '{ generator = ["tcp://node-3:26600"] }',
    }
    assert load_config(None, attach).cluster.workers == {"generator": ["tcp://node-3:26600"]}
    with pytest.raises(
        ConfigError, match=r"lists \{'generator': 2\} worker address\(es\) per role, cluster.hosts gives"
    ):
        load_config(None, {**attach, "cluster.workers": '{ generator = ["tcp://a:1", "tcp://b:1"] }'})
    with pytest.raises(ConfigError, match="cluster.workers is for scheduler 'attach', not 'process'"):
        load_config(None, {**attach, "cluster.scheduler": "process"})


def test_a_slurm_time_limit_written_as_a_toml_time_is_the_limit(tmp_path):
    """`time = 04:00:00` unquoted in a file, or `--cluster.slurm.time 00:10:00`, is a TOML time of day: sbatch gets the
    same "HH:MM:SS" as the quoted string (before, the config was refused: "Input should be a valid string")."""
    from_file = load_config(write(tmp_path, "[cluster.slurm]\ntime = 04:00:00\n"))
    from_cli = load_config(None, parse_overrides(["--cluster.slurm.time", "00:10:00"]))
    quoted = load_config(None, parse_overrides(["--cluster.slurm.time", '"2-00:00:00"']))
    assert (from_file.cluster.slurm.time, from_cli.cluster.slurm.time) == ("04:00:00", "00:10:00")
    assert quoted.cluster.slurm.time == "2-00:00:00"
