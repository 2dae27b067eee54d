"""`rlmesh new-task` writes a package whose own test passes, and whose config validates."""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from rl.commands.cli import main

pytestmark = pytest.mark.processes  # the generated package's test runs in a child process


def test_generated_package_passes_its_own_test_and_validates(tmp_path, capsys, monkeypatch):
    """The printed commands run as printed, from the folder `new-task` ran in, with no PYTHONPATH set."""
    monkeypatch.chdir(tmp_path)
    assert main(["new-task", "word_math"]) == 0
    package = tmp_path / "word_math"
    assert sorted(p.name for p in package.iterdir()) == ["__init__.py", "config.toml", "task.py", "test_task.py"]
    out = capsys.readouterr().out
    assert "a placeholder that learns as is (sums of two numbers), not word_math's" in out
    test_command = out.split("run its test with: ")[1].splitlines()[0]
    # this interpreter: outside the venv too
    assert test_command == f"{sys.executable} -m pytest word_math/test_task.py"
    train_command = out.split("train it with: ")[1].splitlines()[0]
    rlmesh = Path(sys.executable).parent / "rlmesh"
    launcher = str(rlmesh) if rlmesh.is_file() else f"{sys.executable} -m rl.commands.cli"
    assert train_command == f"{launcher} train --config word_math/config.toml"
    # as a user runs it: no PYTHONPATH, and no pytest options of this session (a plugin from tests/ would not import)
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    result = subprocess.run(
        [*shlex.split(test_command), "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "6 passed" in result.stdout
    validated = subprocess.run(  # the printed train command, as `validate`: the same launcher, nothing started
        shlex.split(train_command.replace(" train ", " validate ")),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert validated.returncode == 0, validated.stderr
    assert 'name = "word_math.task:WordMathTask"' in validated.stdout
    assert "warning" not in validated.stderr  # the resolved precision pair is one known to learn
    assert "lr = 2e-05" in validated.stdout


def test_bad_names_and_existing_folders_are_refused(tmp_path, capsys):
    assert main(["new-task", "Word-Math", "--dir", str(tmp_path)]) == 2
    assert "lower-case Python identifier" in capsys.readouterr().err
    (tmp_path / "taken").mkdir()
    assert main(["new-task", "taken", "--dir", str(tmp_path)]) == 2
    assert "already exists" in capsys.readouterr().err
