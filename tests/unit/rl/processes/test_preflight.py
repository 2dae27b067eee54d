"""A multi-host config checked against the launcher's host: a hostname only loopback resolves to, Slurm without memory."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from rl.assets import resolve_model_path
from rl.cli import main
from rl.config import load_config
from rl.processes import preflight
from tests.support.paths import CONFIGS, TINY

SLURM = CONFIGS / "qwen3_8b_slurm_2x8.toml"


@pytest.mark.parametrize(
    "hostname, refused",
    [
        ("127.0.0.1", True),
        ("localhost", True),
        ("169.254.10.1", True),
        ("10.1.2.3", False),
        ("no-such-host.invalid", True),
    ],
)
def test_a_launcher_whose_name_resolves_only_to_loopback_is_named(hostname, refused):
    problem = preflight.launcher_address_problem(load_config(SLURM), hostname=hostname)
    assert (problem is not None) is refused
    if refused:
        assert repr(hostname) in problem and "/etc/hosts" in problem


def test_local_runs_are_not_checked():
    assert preflight.launcher_address_problem(load_config(TINY), hostname="localhost") is None


def test_train_refuses_before_allocating_and_validate_only_warns(monkeypatch, capsys):
    monkeypatch.setattr(preflight.socket, "gethostname", lambda: "localhost")
    assert main(["train", "--config", str(SLURM)]) == 2
    assert "resolves to" in capsys.readouterr().err
    assert main(["validate", "--config", str(SLURM)]) == 0
    assert "rlmesh: warning: cluster.scheduler = 'slurm': this host's name 'localhost'" in capsys.readouterr().err


def test_slurm_without_memory_is_warned_with_what_each_rank_loads():
    config = load_config(
        TINY,
        {
            "cluster.scheduler": "slurm",
            "cluster.hosts.trainer": "1",
            "trainer.num_procs": "2",
            "weight_sync.transport": "torchstore",
        },
    )
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-qwen3"), dtype=torch.float32)
    fp32_bytes = sum(p.numel() for p in model.parameters()) * 4  # parameters() counts tied weights once
    assert preflight.host_ram_per_rank_bytes(config) == fp32_bytes
    [warning] = preflight.cluster_warnings(config)
    assert "no mem and cpus_per_task" in warning and "2 trainer rank(s) per host" in warning
    assert f"~{fp32_bytes / 2**30:.2f} GiB" in warning
    config.cluster.slurm.mem, config.cluster.slurm.cpus_per_task = "64G", 8
    assert preflight.cluster_warnings(config) == []
