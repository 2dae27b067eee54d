"""A multi-host config checked against the launcher's host: a hostname only loopback resolves to."""

import pytest

from rl.commands.cli import main
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
